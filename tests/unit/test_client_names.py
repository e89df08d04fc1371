"""Who the client is, from what it sends: a harness that names itself in its User-Agent, one that
calls through an SDK whose User-Agent names only the SDK (named by a header only it sends, or left
unknown), with the User-Agents the real harnesses sent (tests/integration/test_copilot_cli.py,
test_cline.py, test_agent_sdks.py)."""

from __future__ import annotations

import pytest

from looptrace.proxy.api.clients import named_client

COPILOT_HEADERS = {"User-Agent": "OpenAI/JS 5.20.1", "x-initiator": "user", "x-interaction-type": "conversation-user"}


@pytest.mark.parametrize("agent, headers, named", [
    ("codex_exec/0.169.0 (Linux 6.1; x86_64) xterm", {}, ("codex_exec", "0.169.0")),
    ("claude-cli/2.1.337 (external, sdk-py, agent-sdk/0.2.190)", {}, ("claude-cli", "2.1.337")),
    ("Agents/Python 0.24.0", {}, ("Agents", "0.24.0")),  # the OpenAI Agents SDK
    ("OpenAI/JS 5.20.1", {"x-initiator": "agent"}, ("copilot", None)),  # Copilot CLI says no version
    ("OpenAI/JS 5.20.1", {}, (None, None)),  # some openai-node caller: unknown, not "OpenAI" "JS"
    ("OpenAI/Python 3.57.0", {}, (None, None)),
    ("ai-sdk/openai-compatible/3.0.37 ai-sdk/provider-utils/5.0.30 runtime/bun/1.3.13", {}, (None, None)),  # Cline
])
def test_a_client_is_named_by_what_it_sends(agent, headers, named):
    assert named_client(agent, headers) == named


def test_the_session_records_copilot_by_its_header_and_an_sdk_caller_as_unknown(replay_app):
    for conversation, headers in (("named-by-header", COPILOT_HEADERS),
                                  ("unknown", {"User-Agent": "OpenAI/JS 5.20.1"})):
        replay_app.replay("Hello.<|im_end|>")
        body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "Hi"}],
                "chat_template_kwargs": {"enable_thinking": False}}
        status, _ = replay_app.call("POST", "/v1/chat/completions", body,
                                    headers={**headers, "x-session-affinity": conversation})
        assert status == 200
    named = replay_app.stored("/v1/sessions/named-by-header", steps=1)
    unknown = replay_app.stored("/v1/sessions/unknown", steps=1)
    assert (named["client"], named["client_version"]) == ("copilot", None)
    assert (unknown["client"], unknown["client_version"]) == (None, None)
