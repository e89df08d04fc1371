"""Every name looptrace writes or reads on a trace, and every metric it serves, in one place.

Span names, span attributes, span event names and event attributes, then the Prometheus metric
families. The writers (proxy/observe/request_spans.py, request_metrics.py, metrics.py, api/clients.py)
and the readers (the trace store, the trace viewer's API, forks) import these constants and never
type a name themselves, so a reader cannot look for a name nobody writes
(tests/unit/test_attribute_catalog.py checks that no other module does, and that README's span and
metric tables name exactly these).

A constant is the name itself, upper-cased, dots as underscores, less the `looptrace.` namespace
of our own extensions: `gen_ai.request.model` is GEN_AI_REQUEST_MODEL, `looptrace.prompt.ids`
PROMPT_IDS. Span names start SPAN_, event names EVENT_, metric names METRIC_.
"""

from __future__ import annotations

# -- span names ---------------------------------------------------------------------------------

# A request's own (server) span is named "{endpoint} {model}", its endpoint one of these.
ENDPOINT_CHAT = "chat"  # POST /v1/chat/completions
ENDPOINT_RESPONSES = "responses"  # POST /v1/responses
ENDPOINT_RESPONSES_WEBSOCKET = "responses_websocket"  # a response.create on GET /v1/responses' WebSocket mode
ENDPOINT_RESPONSES_COMPACT = "responses_compact"  # POST /v1/responses/compact
ENDPOINT_MESSAGES = "messages"  # POST /v1/messages (Anthropic's Messages API)
ENDPOINT_GEMINI = "gemini"  # POST /v1beta/models/{model}:generateContent and :streamGenerateContent (the Gemini API)
ENDPOINT_FORK = "fork"  # POST /v1/traces/{trace_id}/fork
ENDPOINT_SCORE = "score"  # POST /v1/score: a given answer read after a given prompt, teacher forced
ENDPOINT_GENERATE = "generate"  # POST /v1/generate: a prompt of token ids decoded afresh
ENDPOINT_REPLAY = "replay"  # a step of `looptrace replay`, written into the store by the command itself
SPAN_RENDER = "render"  # the prompt rendered with the checkpoint's chat template, and tokenized
SPAN_PREFILL = "prefill"  # from submission to the first token
SPAN_DECODE = "decode"  # the backend call: every generated token
SPAN_EXECUTE_TOOL = "execute_tool"  # one tool call the model made; "execute_tool {name}" once it parsed
SPAN_INVOKE_AGENT = "invoke_agent"  # over OTLP: a session's agent, "invoke_agent {name}" (trace_store/agent_spans.py)

# -- the OpenTelemetry GenAI conventions' own names -----------------------------------------------

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"  # "chat" on a request span, "execute_tool" on a tool's
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"  # always "looptrace"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"  # the agent session, from the client's headers or body
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"  # the model the client asked for
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"  # whether the answer was streamed
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"  # the temperature used (the family's default if unset)
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"  # nucleus sampling's p, as used
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"  # top-k, as used (0: off)
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"  # the most tokens the answer could have had
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"  # OpenAI's presence penalty
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"  # OpenAI's frequency penalty
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"  # the client's seed, when it sent one
GEN_AI_RESPONSE_ID = "gen_ai.response.id"  # the answer's id as the client received it (chatcmpl-…, resp_…)
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"  # the model that answered
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"  # why the answer ended, as the client was told
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"  # prompt tokens
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"  # generated tokens
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"  # of which in the thinking channel
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"  # prompt tokens from a prefix cache
GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS = "gen_ai.usage.cache_write.input_tokens"  # prompt tokens added to one
# Its name until the GenAI conventions v1.41, which Phoenix 20.26 still reads:
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"  # JSON: the leading system messages, as parts
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # JSON: the rest of the conversation, role and parts per message
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # JSON: the answer (reasoning, text, tool calls, finish reason)
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"  # JSON: the tools offered
GEN_AI_AGENT_ID = "gen_ai.agent.id"  # the agent that sent the request (its harness's id; "main" for the main agent)
GEN_AI_AGENT_NAME = "gen_ai.agent.name"  # the agent's kind (Explore, collab_spawn, review; "main")
GEN_AI_TOOL_NAME = "gen_ai.tool.name"  # the function a tool call names
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"  # a tool call's id, which its result quotes back
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"  # always "function"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"  # the call's arguments, as JSON text
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"  # what the tool returned (over OTLP, once it came back)

# -- OpenInference's names (Arize Phoenix), on spans exported over OTLP only -------------------------
# Phoenix derives its own names from the gen_ai.* ones (messages, model, tokens, session); these are
# what it cannot derive. Never llm.input_messages.*: one written by us would stop that derivation.

OPENINFERENCE_SPAN_KIND = "openinference.span.kind"  # PROMPT (render), CHAIN (prefill, decode), AGENT (invoke_agent)
INPUT_VALUE = "input.value"  # a request's input as a person reads it: the messages after the model's last answer
INPUT_MIME_TYPE = "input.mime_type"  # text/plain
OUTPUT_VALUE = "output.value"  # its answer: the text, then each tool call made
OUTPUT_MIME_TYPE = "output.mime_type"  # text/plain
LLM_TOKEN_COUNT_COMPLETION_DETAILS_REASONING = "llm.token_count.completion_details.reasoning"  # reasoning tokens
EXPORTED_ONLY = (OPENINFERENCE_SPAN_KIND, INPUT_VALUE, INPUT_MIME_TYPE, OUTPUT_VALUE, OUTPUT_MIME_TYPE,
                 LLM_TOKEN_COUNT_COMPLETION_DETAILS_REASONING)  # what the trace store leaves out

# -- other OpenTelemetry conventions ---------------------------------------------------------------

HTTP_REQUEST_METHOD = "http.request.method"  # the request's HTTP method
URL_PATH = "url.path"  # the request's path
USER_AGENT_ORIGINAL = "user_agent.original"  # the client's User-Agent header, whole
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"  # the status the client got (499: it left)
ERROR_TYPE = "error.type"  # what failed: an error code of the API, or of a vLLM server
SERVER_ADDRESS = "server.address"  # the vLLM server a decode went to: its host
SERVER_PORT = "server.port"  # and its port

# -- looptrace.* on a request's span ---------------------------------------------------------------

ENDPOINT = "looptrace.endpoint"  # the endpoint (ENDPOINT_*); set on the request's span only, which it marks
TRANSPORT = "looptrace.transport"  # "websocket" on a turn of the Responses WebSocket mode (absent: its own HTTP request)
CLIENT_NAME = "looptrace.client.name"  # the client, from its User-Agent (codex_exec, pi, …)
CLIENT_VERSION = "looptrace.client.version"  # and its version
USAGE_CACHED_TOKENS = "looptrace.usage.cached_tokens"  # prompt tokens served from a prefix cache
INPUT_NEW_FROM = "looptrace.input.new_from"  # index of the first message new since the conversation's last request
INPUT_NEW_MESSAGES = "looptrace.input.new_messages"  # JSON: those new messages, as gen_ai.input.messages has them
# gen_ai.input.messages stored as what it adds to an earlier step's (trace_store/chains.py; reads return it whole):
INPUT_BASE_TRACE_ID = "looptrace.input.base_trace_id"  # the trace whose input messages these continue
INPUT_BASE_MESSAGES = "looptrace.input.base_messages"  # how many of them come first; then the new messages
WEIGHT_VERSION = "looptrace.weight_version"  # the weights' label: X-Weight-Version, else what vLLM said
WEIGHT_VERSION_SOURCE = "looptrace.weight_version.source"  # where it came from: header or vllm
TENANT = "looptrace.tenant"  # whose request it was: its key's tenant (api/auth.py); none on an open server
SESSION_GROUPED_BY = "looptrace.session.grouped_by"  # how its session was found: a header's name, "prompt_cache_key" or "history"
# What a request asked for and nothing here acts on, as asked (the Gemini API's). gen_ai.request.model stays
# the served model, which forks, replays and the viewer read:
REQUEST_MODEL_ASKED = "looptrace.request.model_asked"  # the model its path named (flash-lite, …)
REQUEST_RESPONSE_MIME_TYPE = "looptrace.request.response_mime_type"  # the answer's type asked for: not enforced
REQUEST_RESPONSE_SCHEMA = "looptrace.request.response_schema"  # JSON: the schema asked for, as given: not enforced
REQUEST_THINKING_BUDGET = "looptrace.request.thinking_budget"  # thinking tokens asked for (-1: the model's choice)
REQUEST_THINKING_LEVEL = "looptrace.request.thinking_level"  # the thinking level asked for (LOW, HIGH, …)
ROLLOUT_GROUP = "looptrace.rollout.group"  # the rollout's group (X-Rollout-Group), for a request of a rollout
AGENT_ID = "looptrace.agent.id"  # a subagent's id, from its harness (Claude Code's agent id, codex's thread)
AGENT_PARENT_ID = "looptrace.agent.parent_id"  # the agent that spawned it, where the harness says
AGENT_TYPE = "looptrace.agent.type"  # the subagent's kind, as the harness names it
AGENT_SIDE = "looptrace.agent.side"  # true: a side request the harness labels (a title, a review), its own line
# On an invoke_agent span (over OTLP only: trace_store/agent_spans.py):
AGENT_STEPS = "looptrace.agent.steps"  # the agent's steps the exporting process served
AGENT_STEP_TRACE_IDS = "looptrace.agent.step_trace_ids"  # their traces (the first 64), each also a link
AGENT_SPAWNED_BY_TRACE_ID = "looptrace.agent.spawned_by.trace_id"  # the parent's step whose tool call spawned it
AGENT_SPAWNED_BY_TOOL_CALL_ID = "looptrace.agent.spawned_by.tool_call_id"  # that call's id
# On a link: what the linked span is to this one ("forked_from", "replay_of"; an agent's "step", "spawned_by").
LINK = "looptrace.link"

# -- looptrace.* of a fork (on its request span) ---------------------------------------------------

FORK_TRACE_ID = "looptrace.fork.trace_id"  # the trace this request runs again
FORK_INDEX = "looptrace.fork.index"  # the generated token it replaced, and went on from
FORK_REPLACEMENT_IDS = "looptrace.fork.replacement_ids"  # the token ids put in its place

# -- looptrace.* of a compaction (on its request span) -----------------------------------------------

COMPACTION = "looptrace.compaction"  # how the summary was asked for: trigger, compact, threshold, client (its own)
COMPACTION_ID = "looptrace.compaction.id"  # the summary's id, as its references name it
COMPACTION_REPLACED_ITEMS = "looptrace.compaction.replaced_items"  # the input items the summary replaces
COMPACTION_EXPANDED = "looptrace.compaction.expanded"  # on any request: compaction items its input expanded

# -- looptrace.* of a replayed step (`looptrace replay`, on its request span) ----------------------

REPLAY_TRACE_ID = "looptrace.replay.trace_id"  # the recorded step this one replays
REPLAY_SESSION = "looptrace.replay.session"  # the recorded session's key
REPLAY_STEP = "looptrace.replay.step"  # the step's place in it (1: the first)
REPLAY_MODE = "looptrace.replay.mode"  # forced (the recorded answer scored) or step (decoded afresh)
REPLAY_TARGET = "looptrace.replay.target"  # the server that replayed it (its URL, no credentials)
REPLAY_TOKENS = "looptrace.replay.tokens"  # the recorded answer's tokens
REPLAY_AGREEING = "looptrace.replay.agreeing"  # of which the target's greedy choice was the recording model's
REPLAY_FIRST_DIVERGENCE = "looptrace.replay.first_divergence"  # the first token where they differ (absent: none)
REPLAY_MEAN_LOGPROB_RECORDED = "looptrace.replay.mean_logprob_recorded"  # the recorded tokens' mean logprob, as recorded
REPLAY_MEAN_LOGPROB_TARGET = "looptrace.replay.mean_logprob_target"  # and under the target (forced mode)
REPLAY_TOOL_CALLS_EQUAL = "looptrace.replay.tool_calls_equal"  # step mode: the target made the recorded calls

# -- looptrace.* on the render span ----------------------------------------------------------------

FAMILY = "looptrace.family"  # the model family that rendered the prompt
TEMPLATE_SHA256 = "looptrace.template.sha256"  # digest of the chat template it used
TOKENIZER_SHA256 = "looptrace.tokenizer.sha256"  # digest of the tokenizer (its tokenizer.json as loaded)
PROMPT_TEXT = "looptrace.prompt.text"  # the exact prompt, as the model read it
PROMPT_IDS = "looptrace.prompt.ids"  # its token ids
PROMPT_TOKENS = "looptrace.prompt.tokens"  # how many
PROMPT_NEW_OFFSET = "looptrace.prompt.new_offset"  # where the part new since the conversation's last request starts
PROMPT_NEW_TEXT = "looptrace.prompt.new_text"  # that part's text
PROMPT_THINKING = "looptrace.prompt.thinking"  # whether the prompt leaves the model thinking
PROMPT_MERGED_SYSTEM_MESSAGES = "looptrace.prompt.merged_system_messages"  # system messages merged into one
PROMPT_FORCED_TOKENS = "looptrace.prompt.forced_tokens"  # tokens of the answer's forced opening, at the prompt's end
PROMPT_FORCED_PREFIX = "looptrace.prompt.forced_prefix"  # that opening's text (a forced tool call's)
REDACTED = "looptrace.redacted"  # credentials replaced by markers in what this span records (common/redaction.py)
PROMPT_NOT_KEPT = "looptrace.prompt.not_kept"  # why text and ids are missing: "past_context" (refused for its
# length), "base_missing" (stored as what it adds to a step the store no longer has)
# The prompt stored as what it adds to the conversation's previous step (trace_store/chains.py; reads return
# PROMPT_TEXT and PROMPT_IDS whole):
PROMPT_BASE_TRACE_ID = "looptrace.prompt.base_trace_id"  # the trace whose prompt this one continues
PROMPT_BASE_TOKENS = "looptrace.prompt.base_tokens"  # how many of its ids come first (cut before an added token)
PROMPT_BASE_CHARS = "looptrace.prompt.base_chars"  # how many characters of its text
PROMPT_ADDED_IDS = "looptrace.prompt.added_ids"  # the ids after them
PROMPT_ADDED_TEXT = "looptrace.prompt.added_text"  # the text after them
PROMPT_NEW_CHARS = "looptrace.prompt.new_chars"  # in the store: PROMPT_NEW_TEXT as its length, the added text's end
# How the prompt was tokenized (families/incremental.py):
PROMPT_REUSED_TOKENS = "looptrace.prompt.reused_tokens"  # ids taken from the conversation's previous encoding
PROMPT_CHECKED = "looptrace.prompt.checked"  # a whole encoding, done to check, agreed (absent: not checked)
# Token continuity (proxy/engine/continuity.py):
PROMPT_CONTINUITY = "looptrace.prompt.continuity"  # how it continues the last turn: clean, realign, fork or kept
PROMPT_CONTINUITY_MODE = "looptrace.prompt.continuity_mode"  # the mode it was built in: check or keep
PROMPT_CONTINUITY_DIFFERS_AT = "looptrace.prompt.continuity_differs_at"  # realign: the first id that differs
# fork: why (history, answer, settings, system: an edited history, not the model's answer, other tools or
# template settings, a later system message the template moves before the answer)
PROMPT_CONTINUITY_FORK = "looptrace.prompt.continuity_fork"
PROMPT_KEPT_TOKENS = "looptrace.prompt.kept_tokens"  # kept: the last answer's ids kept as the model sampled them
PROMPT_MEDIA = "looptrace.prompt.media"  # JSON: each attached item (kind, MIME type, size, sha256, tokens, thumbnail)
PROMPT_MEDIA_TOKENS = "looptrace.prompt.media.{kind}_tokens"  # prompt tokens the items of one kind became


def prompt_media_tokens(kind: str) -> str:
    """PROMPT_MEDIA_TOKENS for one kind of item (image, audio, video)."""
    return PROMPT_MEDIA_TOKENS.format(kind=kind)


EVENT_TOOL_RESULT = "looptrace.tool_result"  # on the render span: a tool's result, answering a call traced earlier
# Its attributes: GEN_AI_TOOL_CALL_ID and GEN_AI_TOOL_NAME of the call, and TOOL_RESULT.

# -- looptrace.* on the prefill span ---------------------------------------------------------------

PREFILL_PROMPT_TOKENS = "looptrace.prefill.prompt_tokens"  # prompt tokens the backend read
PREFILL_CACHED_TOKENS = "looptrace.prefill.cached_tokens"  # of which served from a prefix cache
PREFILL_SECONDS = "looptrace.prefill.seconds"  # the backend's own prefill time
PREFILL_UPSTREAM_PROMPT_TOKENS = "looptrace.prefill.upstream_prompt_tokens"  # vLLM's prompt length, media expanded
PREFILL_UPSTREAM_DIFFERS_AT = "looptrace.prefill.upstream_differs_at"  # where vLLM's prompt first differs from ours

# -- looptrace.* on the decode span ----------------------------------------------------------------

BACKEND = "looptrace.backend"  # the backend that produced the tokens (local, llama.cpp, vllm, replay)
BACKEND_ROUTE = "looptrace.backend.route"  # how it asked for them, where it has several ways (vLLM's routes)
DECODE_TOKENS = "looptrace.decode.tokens"  # tokens generated
DECODE_SECONDS = "looptrace.decode.seconds"  # from the first token to the last
DECODE_TOKENS_PER_SECOND = "looptrace.decode.tokens_per_second"  # tokens after the first ÷ that time
DECODE_BACKEND_FINISH_REASON = "looptrace.decode.backend_finish_reason"  # why the backend stopped (stop, length, …)
SPEC_DRAFTS = "looptrace.spec.drafts"  # speculative decoding: draft proposals made
SPEC_DRAFTED_TOKENS = "looptrace.spec.drafted_tokens"  # tokens the drafts proposed
SPEC_ACCEPTED_TOKENS = "looptrace.spec.accepted_tokens"  # of which the target model accepted
SPEC_METHOD = "looptrace.spec.method"  # how the drafts were made: ngram, suffix, draft_model, mtp

# -- looptrace.* of a vLLM server, on the decode span ----------------------------------------------

UPSTREAM_MOVED_FROM = "looptrace.upstream.moved_from"  # the other server the conversation's last request went to
UPSTREAM_WEIGHT_VERSION = "looptrace.upstream.weight_version"  # the weights vLLM said sampled the answer
EVENT_UPSTREAM_RETRY = "looptrace.upstream.retry"  # a server failed before the first token, and another was tried
UPSTREAM_FAILED = "looptrace.upstream.failed"  # on that event: the server that failed (and ERROR_TYPE, its code)
UPSTREAM_ERROR = "looptrace.upstream.error"  # on that event: what the server said

# -- looptrace.route.*: the routing receipt, on the decode span (backends/vllm/routing/policies.py) -

ROUTE_POLICY = "looptrace.route.policy"  # --routing: rendezvous, least-loaded or cache-aware
ROUTE_REASON = "looptrace.route.reason"  # home, faster, least_loaded, retry or only
ROUTE_SCORE = "looptrace.route.score"  # what the policy ranked the chosen server by (cache-aware: seconds, least first)
ROUTE_LOAD = "looptrace.route.load"  # its requests running and waiting when chosen
ROUTE_PREDICTED_CACHED_TOKENS = "looptrace.route.predicted_cached_tokens"  # prompt tokens predicted in its cache
ROUTE_INDEX = "looptrace.route.index"  # what predicted them: events (its KV events) or estimate (what it was sent)
ROUTE_CACHED_TOKENS = "looptrace.route.cached_tokens"  # what vLLM then said it had cached (its cached_tokens)
ROUTE_PREDICTION_ERROR = "looptrace.route.prediction_error"  # cached_tokens − predicted_cached_tokens
ROUTE_RUNNER_UP = "looptrace.route.runner_up"  # the server ranked next ("host:port")
ROUTE_RUNNER_UP_SCORE = "looptrace.route.runner_up_score"  # its score
ROUTE_RUNNER_UP_LOAD = "looptrace.route.runner_up_load"  # its load
ROUTE_RUNNER_UP_PREDICTED_CACHED_TOKENS = "looptrace.route.runner_up_predicted_cached_tokens"  # its prediction
# The chosen server's price (backends/vllm/routing/cost.py), every policy's: the request's expected time to first
# token there
ROUTE_EXPECTED_TTFT = "looptrace.route.expected_ttft"  # seconds: overhead + tokens ÷ rate + decode pressure
ROUTE_PREFILL_TOKENS = "looptrace.route.prefill_tokens"  # prompt tokens it would compute there (after its cache)
ROUTE_QUEUED_TOKENS = "looptrace.route.queued_tokens"  # uncached prompt tokens ahead of it (looptrace's, others')
ROUTE_OTHERS_WAITING = "looptrace.route.others_waiting"  # vLLM's waiting requests beyond looptrace's
ROUTE_PREFILL_RATE = "looptrace.route.prefill_rate"  # the server's measured prefill tokens a second
ROUTE_DECODING = "looptrace.route.decoding"  # requests it was decoding
ROUTE_DECODE_SECONDS = "looptrace.route.decode_seconds"  # what those add, as measured
ROUTE_OVERHEAD_SECONDS = "looptrace.route.overhead_seconds"  # the server's measured time to first token of no tokens
ROUTE_SPREAD_SECONDS = "looptrace.route.spread_seconds"  # how far the price may be off: its std. deviation
ROUTE_MET_QUEUE_SECONDS = "looptrace.route.met_queue_seconds"  # the queue recent requests found there, on average
ROUTE_KEPT_CONVERSATIONS = "looptrace.route.kept_conversations"  # conversations it keeps lately (cache-aware)
ROUTE_TTFT = "looptrace.route.ttft"  # the time to first token it then took (sent → first token)
ROUTE_TTFT_ERROR = "looptrace.route.ttft_error"  # that minus expected_ttft
ROUTE_RUNNER_UP_EXPECTED_TTFT = "looptrace.route.runner_up_expected_ttft"  # the runner-up's price
ROUTE_RUNNER_UP_PREFILL_TOKENS = "looptrace.route.runner_up_prefill_tokens"  # what it would have computed
ROUTE_RUNNER_UP_QUEUED_TOKENS = "looptrace.route.runner_up_queued_tokens"  # and what was queued there
ROUTE_RUNNER_UP_SPREAD_SECONDS = "looptrace.route.runner_up_spread_seconds"  # and how far its may be off
ROUTE_RUNNER_UP_MET_QUEUE_SECONDS = "looptrace.route.runner_up_met_queue_seconds"  # and the queue found there lately
ROUTE_RUNNER_UP_KEPT_CONVERSATIONS = "looptrace.route.runner_up_kept_conversations"  # and the conversations it keeps

# The receipt field by field, one row each: its name on the receipt (backends/vllm/routing/policies.py's
# Route.receipt; None: set once the server answered, proxy/observe/route_receipt.py), the decode span's attribute
# it becomes, and its key in a step's `route` (trace_store/steps.py; None: a step leaves it out, the others give it).
# One table, so that the routing, the span and the viewer cannot come to call one number three names.
ROUTE_RECEIPT = (
    ("policy", ROUTE_POLICY, "policy"),
    ("reason", ROUTE_REASON, "reason"),
    ("score", ROUTE_SCORE, "score"),
    ("load", ROUTE_LOAD, "load"),
    ("predicted_cached_tokens", ROUTE_PREDICTED_CACHED_TOKENS, "predicted"),
    ("index", ROUTE_INDEX, "index"),
    (None, ROUTE_CACHED_TOKENS, "cached"),
    (None, ROUTE_PREDICTION_ERROR, None),
    ("runner_up", ROUTE_RUNNER_UP, "runner_up"),
    ("runner_up_score", ROUTE_RUNNER_UP_SCORE, "runner_up_score"),
    ("runner_up_load", ROUTE_RUNNER_UP_LOAD, "runner_up_load"),
    ("runner_up_predicted_cached_tokens", ROUTE_RUNNER_UP_PREDICTED_CACHED_TOKENS, "runner_up_predicted"),
    ("expected_ttft", ROUTE_EXPECTED_TTFT, "expected_ttft"),
    (None, ROUTE_TTFT, "ttft"),
    (None, ROUTE_TTFT_ERROR, None),
    ("prefill_tokens", ROUTE_PREFILL_TOKENS, "prefill_tokens"),
    ("queued_tokens", ROUTE_QUEUED_TOKENS, "queued_tokens"),
    ("others_waiting", ROUTE_OTHERS_WAITING, "others_waiting"),
    ("prefill_rate", ROUTE_PREFILL_RATE, "prefill_rate"),
    ("decoding", ROUTE_DECODING, "decoding"),
    ("decode_seconds", ROUTE_DECODE_SECONDS, "decode_seconds"),
    ("overhead_seconds", ROUTE_OVERHEAD_SECONDS, "overhead_seconds"),
    ("spread_seconds", ROUTE_SPREAD_SECONDS, "spread_seconds"),
    ("met_queue_seconds", ROUTE_MET_QUEUE_SECONDS, "met_queue_seconds"),
    ("kept_conversations", ROUTE_KEPT_CONVERSATIONS, "kept_conversations"),
    ("runner_up_expected_ttft", ROUTE_RUNNER_UP_EXPECTED_TTFT, "runner_up_expected_ttft"),
    ("runner_up_prefill_tokens", ROUTE_RUNNER_UP_PREFILL_TOKENS, "runner_up_prefill_tokens"),
    ("runner_up_queued_tokens", ROUTE_RUNNER_UP_QUEUED_TOKENS, "runner_up_queued_tokens"),
    ("runner_up_spread_seconds", ROUTE_RUNNER_UP_SPREAD_SECONDS, "runner_up_spread_seconds"),
    ("runner_up_met_queue_seconds", ROUTE_RUNNER_UP_MET_QUEUE_SECONDS, "runner_up_met_queue_seconds"),
    ("runner_up_kept_conversations", ROUTE_RUNNER_UP_KEPT_CONVERSATIONS, "runner_up_kept_conversations"),
)

# -- the decode span's token events ---------------------------------------------------------------

EVENT_TOKENS = "looptrace.tokens"  # up to 64 generated tokens, as parallel arrays of the columns below
TOKENS_PREFIX = "looptrace.tokens."  # what every column's name starts with
TOKENS_INDEX = "looptrace.tokens.index"  # the token's position in the answer
TOKENS_TIME_UNIX_NANO = "looptrace.tokens.time_unix_nano"  # when it arrived
TOKENS_ID = "looptrace.tokens.id"  # its id
TOKENS_PIECE = "looptrace.tokens.piece"  # its vocabulary entry
TOKENS_TEXT = "looptrace.tokens.text"  # its share of the decoded answer
TOKENS_SPECIAL = "looptrace.tokens.special"  # whether it is a special token
TOKENS_CHANNEL = "looptrace.tokens.channel"  # where it fell: thought, content, tool_call
TOKENS_P = "looptrace.tokens.p"  # the model's probability of it, at temperature 1
TOKENS_LOGPROB = "looptrace.tokens.logprob"  # and its log
TOKENS_RANK = "looptrace.tokens.rank"  # its rank among the model's candidates (1: the most likely)
TOKENS_TOP_IDS = "looptrace.tokens.top_ids"  # the five most likely tokens' ids (TOP_N per token, padded with -1)
TOKENS_TOP_PIECES = "looptrace.tokens.top_pieces"  # their vocabulary entries (TOP_N per token)
TOKENS_TOP_P = "looptrace.tokens.top_p"  # their probabilities (TOP_N per token; -1 marks padding)
TOKENS_DRAFTED = "looptrace.tokens.drafted"  # speculative decoding: 1 where a drafted token stood here
TOKENS_ACCEPTED = "looptrace.tokens.accepted"  # 1 where the draft was accepted
TOKENS_DRAFT_METHOD = "looptrace.tokens.draft_method"  # the method that drafted it ("" where none did)

TOKENS_COLUMNS = (TOKENS_INDEX, TOKENS_TIME_UNIX_NANO, TOKENS_ID, TOKENS_PIECE, TOKENS_TEXT, TOKENS_SPECIAL,
                  TOKENS_CHANNEL, TOKENS_P, TOKENS_LOGPROB, TOKENS_RANK, TOKENS_TOP_IDS, TOKENS_TOP_PIECES,
                  TOKENS_TOP_P, TOKENS_DRAFTED, TOKENS_ACCEPTED, TOKENS_DRAFT_METHOD)  # in the order the arrays are kept
# Left out with --no-trace-content:
TOKENS_CONTENT_COLUMNS = (TOKENS_ID, TOKENS_PIECE, TOKENS_TEXT, TOKENS_TOP_IDS, TOKENS_TOP_PIECES)
TOKENS_TOP_COLUMNS = (TOKENS_TOP_IDS, TOKENS_TOP_PIECES, TOKENS_TOP_P)  # TOP_N entries per token

# -- looptrace.* on an execute_tool span -----------------------------------------------------------

TOOL_OUTCOME = "looptrace.tool.outcome"  # valid, invalid_args, unknown_tool or unparsed
TOOL_INDEX = "looptrace.tool.index"  # the call's place among the answer's calls
TOOL_RAW = "looptrace.tool.raw"  # the call as the model wrote it
TOOL_RESULT = "looptrace.tool.result"  # the tool's result, from the later request that carried it (added in the store)
TOOL_RESULT_TRACE_ID = "looptrace.tool.result_trace_id"  # that later request's trace (added in the store)

# -- Prometheus metric families (GET /metrics; a counter's samples end in _total) -------------------

METRIC_REQUESTS = "looptrace_requests"  # requests finished, by endpoint and HTTP status
METRIC_PROMPT_TOKENS = "looptrace_prompt_tokens"  # prompt tokens read
METRIC_PROMPT_CACHED_TOKENS = "looptrace_prompt_cached_tokens"  # prompt tokens served from a prefix cache
METRIC_RENDER_TOKENS = "looptrace_render_tokens"  # prompt tokens rendered, by how: reused or encoded
METRIC_RENDER_CHECKS = "looptrace_render_checks"  # incremental encodings checked against whole ones, by result
METRIC_RENDER_WINDOWS = "looptrace_render_windows"  # a conversation turn's template text, by how: window, whole, fallback
METRIC_RENDER_DRIFT = "looptrace_render_drift"  # windowed renderings that a sampled whole rendering contradicted
METRIC_TOKEN_CONTINUITY = "looptrace_token_continuity"  # turns by how their prompt continues the last (class)
METRIC_RENDER_DURATION = "looptrace_render_duration_seconds"  # rendering and tokenizing one prompt
METRIC_GENERATION_TOKENS = "looptrace_generation_tokens"  # tokens generated, by channel
METRIC_TIME_TO_FIRST_TOKEN = "looptrace_time_to_first_token_seconds"  # request arrival → first token
METRIC_INTER_TOKEN_LATENCY = "looptrace_inter_token_latency_seconds"  # between consecutive tokens
METRIC_REQUEST_DURATION = "looptrace_request_duration_seconds"  # request arrival → end
METRIC_DECODE_TOKENS_PER_SECOND = "looptrace_decode_tokens_per_second"  # each request's decode speed
METRIC_SPEC_DECODE_DRAFT_TOKENS = "looptrace_spec_decode_draft_tokens"  # tokens proposed by a draft model
METRIC_SPEC_DECODE_ACCEPTED_TOKENS = "looptrace_spec_decode_accepted_tokens"  # draft tokens accepted
METRIC_SPEC_DECODE_DRAFTS = "looptrace_spec_decode_drafts"  # draft proposals made
METRIC_MEDIA_ITEMS = "looptrace_media_items"  # attached items that reached the model, by kind
METRIC_MEDIA_TOKENS = "looptrace_media_tokens"  # prompt tokens those items became, by kind
METRIC_TOOL_CALLS = "looptrace_tool_calls"  # tool calls the model made, by outcome
METRIC_COMPACTIONS = "looptrace_compactions"  # summaries written for compactions, by how they were asked for
METRIC_COMPACTION_ITEMS = "looptrace_compaction_items"  # compaction items in requests, by result (expanded, refused)
METRIC_KEY_REQUESTS = "looptrace_key_requests"  # generating requests each API key sent, refused ones too
METRIC_KEY_TOKENS = "looptrace_key_tokens"  # prompt and generated tokens of each API key's requests
METRIC_KEY_REFUSED = "looptrace_key_refused"  # each API key's requests refused by its budget, by which (requests, tokens)
METRIC_UPSTREAM_REQUESTS = "looptrace_upstream_requests"  # requests sent to each vLLM server
METRIC_UPSTREAM_ERRORS = "looptrace_upstream_errors"  # requests a vLLM server failed, by error code
METRIC_UPSTREAM_GENERATION_TOKENS = "looptrace_upstream_generation_tokens"  # tokens each vLLM server generated
METRIC_UPSTREAM_TIME_TO_FIRST_TOKEN = "looptrace_upstream_time_to_first_token_seconds"  # the same, by server
METRIC_UPSTREAM_SESSIONS_MOVED = "looptrace_upstream_sessions_moved"  # conversations moved, by server left and why
METRIC_UPSTREAM_UP = "looptrace_upstream_up"  # 1 while a vLLM server takes requests
METRIC_UPSTREAM_REQUESTS_RUNNING = "looptrace_upstream_requests_running"  # requests streaming from each server
METRIC_UPSTREAM_ROUTED = "looptrace_upstream_routed"  # requests routed to each server, by the routing's reason
METRIC_UPSTREAM_PROMPT_TOKENS = "looptrace_upstream_prompt_tokens"  # prompt tokens sent to each server
METRIC_UPSTREAM_CACHED_TOKENS = "looptrace_upstream_cached_tokens"  # of which it had cached, as it said
METRIC_UPSTREAM_PREDICTED_CACHED_TOKENS = "looptrace_upstream_predicted_cached_tokens"  # as routing predicted
METRIC_UPSTREAM_PREDICTION_ERROR = "looptrace_upstream_cache_prediction_error_ratio"  # |error| ÷ prompt tokens
METRIC_UPSTREAM_KV_EVENTS_TRUSTED = "looptrace_upstream_kv_events_trusted"  # 1 while its KV events are followed
METRIC_UPSTREAM_TTFT_PREDICTION_ERROR = "looptrace_upstream_ttft_prediction_error_seconds"  # |ttft − expected|
METRIC_REQUESTS_RUNNING = "looptrace_requests_running"  # requests being decoded
METRIC_REQUESTS_WAITING = "looptrace_requests_waiting"  # requests queued for the model
METRIC_TRACE_SPANS_DROPPED = "looptrace_trace_spans_dropped"  # spans a trace sink lost, by sink
METRIC_TRACE_QUEUE_SPANS = "looptrace_trace_queue_spans"  # finished spans waiting for a trace sink
METRIC_TRACE_QUEUE_BYTES = "looptrace_trace_queue_bytes"  # what those spans hold, estimated
