// A session as the agent's loop: one step per request, in order, each with what was new in its prompt
// (the user's message, tool results beside the calls they answer), what the model thought and said
// token by token, its tool calls, why it stopped, and how long each part took.

import {get, sessionPath} from "./api.js";
import {agentTree} from "./agents.js";
import {compactionBadges} from "./compaction.js";
import {sessionLinks} from "./compare-links.js";
import {forkPanel} from "./fork.js";
import {promptView} from "./prompt.js";
import {rolloutFacts, rolloutPanel} from "./rollout.js";
import {count, h, ms, pretty, when} from "./text.js";
import {gapLegend, legend, tokenStream} from "./tokens.js";

const LONG = 4000; // characters of a message shown before "show all": a step stays quick to draw
// Steps drawn at once when a session opens, then per page as the list's end scrolls into view: a session
// of hundreds of steps shows its first ones at once (its steps' tokens and prompts load when shown).
const FIRST_PAGE = 50, PAGE = 200;
// Token continuity (docs/rollouts.md): how a step's prompt continues the step before.
const CONTINUITY = {
  clean: "clean: the prompt starts with the last prompt and the ids the model sampled",
  realign: "realign: the same conversation, other ids (the template or tokenizer rewrote what came before)",
  fork: "fork: the turn does not continue the last",
  kept: "kept: the prompt is the last prompt and the ids the model sampled, then the new messages",
};
// Why a step is a fork (looptrace.prompt.continuity_fork).
const FORKS = {
  history: "the history was edited",
  answer: "the answer sent back is not the model's as it wrote it",
  settings: "the tools or template settings changed",
  system: "a later system message, which the template moves before the answer",
};
const OUTCOMES = {valid: "valid", invalid_args: "invalid arguments", unknown_tool: "unknown tool", unparsed: "unparsed"};

function longText(text, cls = "text") {
  const pre = h("pre", {class: cls});
  if (text.length <= LONG) {
    pre.append(h("span", {}, text));
    return pre;
  }
  pre.append(h("span", {}, text.slice(0, LONG)));
  const more = h("button", {type: "button", class: "show-all", onclick: () => {
    pre.replaceChildren(h("span", {}, text));
  }}, `show all ${count(text.length)} characters`);
  pre.append(h("span", {class: "cut"}, "…"), more);
  return pre;
}

const REASONS = {home: "its home", faster: "the least expected time to first token", least_loaded: "least loaded",
  retry: "another server failed first", only: "the only server"};

const secs = (s) => (s === undefined ? "?" : `${Number(s).toFixed(2)} s`);

// The vLLM routing's receipt: where the step went and why, how much of its prompt that server had cached against
// what routing predicted, and its time to first token against the expected one (hover: the price's terms, the
// runner-up's).
function routeChip(route) {
  const cached = route.cached !== undefined ? `${count(route.cached)} cached` : "cached unknown";
  const guess = route.index === "estimate" ? "estimated" : "predicted";
  const lines = [`routed by ${route.policy}: ${REASONS[route.reason] || route.reason}`,
    `score ${route.score}, load ${route.load}; ${count(route.predicted)} cached tokens ${guess}`];
  let wait = "";
  if (route.expected_ttft !== undefined) {
    wait = ` · first token ${secs(route.ttft)} (${secs(route.expected_ttft)} expected)`;
    lines.push(`expected ${secs(route.expected_ttft)} = ${secs(route.overhead_seconds)} + (` +
      `${count(route.prefill_tokens)} to read + ${count(route.queued_tokens)} queued) ÷ ` +
      `${count(Math.round(route.prefill_rate))} tokens/s + ${secs(route.decode_seconds)} for ` +
      `${route.decoding} decoding` + (route.others_waiting ? `; ${route.others_waiting} others waiting` : "") +
      (route.spread_seconds ? `; the price may be off by ±${secs(route.spread_seconds)}` : "") +
      (route.met_queue_seconds !== undefined ? `; requests lately found ${secs(route.met_queue_seconds)} queued` : "") +
      (route.kept_conversations !== undefined ? `; keeps ${route.kept_conversations} conversations lately` : ""));
  }
  if (route.runner_up) lines.push(`runner-up ${route.runner_up}: score ${route.runner_up_score}, load ` +
    `${route.runner_up_load}, ${count(route.runner_up_predicted)} predicted` +
    (route.runner_up_expected_ttft !== undefined ? `, ${secs(route.runner_up_expected_ttft)} expected (` +
      `${count(route.runner_up_prefill_tokens)} to read + ${count(route.runner_up_queued_tokens)} queued` +
      (route.runner_up_spread_seconds ? `, ±${secs(route.runner_up_spread_seconds)}` : "") +
      (route.runner_up_met_queue_seconds !== undefined ? `, ${secs(route.runner_up_met_queue_seconds)} queued lately` : "") +
      (route.runner_up_kept_conversations !== undefined ? `, keeps ${route.runner_up_kept_conversations}` : "") +
      ")" : ""));
  return {text: `${route.server}: ${cached} (${count(route.predicted)} ${guess})${wait}`, title: lines.join("\n")};
}

function partsText(parts, type) {
  return (parts || []).filter((p) => p.type === type).map((p) => p.content ?? "").join("");
}

export class SessionView {
  constructor(root, {onNavigate}) {
    this.root = root;
    this.onNavigate = onNavigate;
    this.key = null;
    this.steps = [];
    this.calls = new Map(); // call id → {step, call}: where each tool call was made
    this.results = new Map(); // call id → {step, text}: where its result came back
    this.observer = new IntersectionObserver((entries) => {
      for (const entry of entries) if (entry.isIntersecting) this.loadTokens(entry.target.closest("[data-step]"));
    }, {rootMargin: "200px"});
    root.addEventListener("keydown", (e) => this.keys(e));
  }

  async open(key, {focus} = {}) {
    this.key = key;
    this.root.replaceChildren(h("p", {class: "note"}, "Loading…"));
    let session;
    try {
      session = await get(this.page(key, 0, FIRST_PAGE));
    } catch (err) {
      this.root.replaceChildren(h("p", {class: "error"}, err.status === 404 ? "No such session in the store." : err.message));
      return;
    }
    if (this.key !== key) return; // another session was opened meanwhile
    this.observer.disconnect();
    this.more?.disconnect();
    this.loading = false;
    this.steps = session.steps;
    this.agents = session.agents || [];
    this.agent = null; // the agent whose steps alone are shown (agents.js), or all
    this.total = session.steps_total ?? session.steps.length;
    this.index();
    const title = session.conversation ? session.conversation : `request ${session.key.replace(/^trace:/, "")}`;
    const tools = Object.entries(session.tool_calls).filter(([, n]) => n).map(([o, n]) => `${n} ${OUTCOMES[o]}`);
    this.list = h("ol", {class: "steps", "aria-label": "Steps of the agent's loop, in order"});
    this.root.replaceChildren(
      h("header", {class: "session-head"},
        h("h2", {}, h("span", {class: "label"}, session.conversation ? "Session " : ""), h("code", {}, title)),
        h("p", {class: "facts"},
          [session.client ? `${session.client}${session.client_version ? " " + session.client_version : ""}` : "client unknown",
            session.model, `${this.total} step${this.total === 1 ? "" : "s"}`, `${count(session.input_tokens)} tokens in / ${count(session.output_tokens)} out`,
            tools.length ? "tool calls: " + tools.join(", ") : "no tool calls",
            session.errors ? `${session.errors} failed` : "", `${when(session.first_ns)} – ${when(session.last_ns)}`]
            .filter(Boolean).join(" · ")),
        groupedBy(session.steps), agentTree(session, this), legend(), sessionLinks(session.key)),
      this.list);
    this.rollout = null;
    this.mode = "p";
    rolloutFacts(session.key).then((facts) => { // a rollout's reward and gap, when it has them
      if (!facts || this.key !== key) return;
      this.rollout = facts;
      this.root.querySelector(".session-head .legend").before(rolloutPanel(facts, {
        onMode: (mode) => this.heat(mode), onNavigate: this.onNavigate}));
    });
    this.draw(0);
    this.sentinel = h("p", {class: "note more-steps", "aria-live": "polite"});
    this.list.after(this.sentinel);
    this.more = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.loadMore();
    }, {rootMargin: "800px"});
    this.showRemaining();
    while (focus && !this.list.querySelector(`[data-step="${CSS.escape(focus)}"]`) && this.steps.length < this.total) {
      if (!await this.loadMore()) break; // a link to a later step: its page first
    }
    const target = focus && this.list.querySelector(`[data-step="${CSS.escape(focus)}"]`);
    // A session that fits on its first page opens at its newest step; a longer one at its first steps.
    const end = this.steps.length >= this.total ? this.list.lastElementChild : null;
    (target || end)?.scrollIntoView({block: target ? "start" : "end"});
    if (target) target.focus({preventScroll: true});
    performance.mark("looptrace:session"); // for bench/viewer.py: when a session's steps are drawn
  }

  page(key, offset, limit) {
    const path = sessionPath("/v1/sessions", key);
    return `${path}${path.includes("?") ? "&" : "?"}offset=${offset}&limit=${limit}`;
  }

  // Articles for the steps from `from` on, appended to the list.
  draw(from) {
    const frag = document.createDocumentFragment();
    const drawn = this.steps.slice(from).map((step, i) => this.article(step, from + i));
    frag.append(...drawn);
    this.list.append(frag);
    drawn.forEach((el) => this.observer.observe(el));
  }

  showRemaining() {
    const left = this.total - this.steps.length;
    this.sentinel.textContent = left > 0 ? `${count(left)} more step${left === 1 ? "" : "s"} load as you scroll…` : "";
    if (left > 0) this.more.observe(this.sentinel);
    else this.more.disconnect();
  }

  // The next page of steps, once at a time; false when none came.
  async loadMore() {
    if (this.loading || this.steps.length >= this.total) return false;
    const key = this.key;
    this.loading = true;
    try {
      const page = await get(this.page(key, this.steps.length, PAGE));
      if (this.key !== key || !page.steps.length) return false;
      const from = this.steps.length;
      this.steps.push(...page.steps.filter((s) => !this.steps.some((t) => t.trace_id === s.trace_id)));
      this.total = Math.max(page.steps_total ?? this.total, this.steps.length);
      this.index();
      this.draw(from);
      this.showRemaining();
      return true;
    } catch (err) {
      return false;
    } finally {
      this.loading = false;
    }
  }

  // Where each tool call was made and where its result came back, across the steps.
  index() {
    this.calls.clear();
    this.results.clear();
    this.steps.forEach((step, i) => {
      for (const m of step.new_messages || []) { // calls in the history the client sent (made before tracing, or edited)
        for (const part of m.parts || []) {
          if (part.type === "tool_call" && part.id && !this.calls.has(part.id)) {
            this.calls.set(part.id, {step: i - 1, call: {name: part.name, arguments: JSON.stringify(part.arguments)}, sent: true});
          }
        }
      }
      for (const call of step.tool_calls || []) if (call.id) this.calls.set(call.id, {step: i, call});
      for (const m of step.new_messages || []) {
        for (const part of m.parts || []) {
          if (part.type === "tool_call_response" && part.id) {
            this.results.set(part.id, {step: i, text: typeof part.response === "string" ? part.response : JSON.stringify(part.response)});
          }
        }
      }
    });
  }

  // Steps stored while the live feed was not connected: the ones not shown yet.
  async refresh() {
    const key = this.key;
    if (!key || !this.list || this.steps.length < this.total) return; // the pages to come will hold them
    const session = await get(this.page(key, this.steps.length, PAGE)).catch(() => null);
    if (session && this.key === key) for (const step of session.steps) this.add({...step, session: key});
  }

  // A step stored while the page is open (the live feed).
  add(step) {
    if (step.session !== this.key || !this.list || this.steps.some((s) => s.trace_id === step.trace_id)) return;
    if (step.fork_of) return;
    // A live step names a subagent's harness words alone (`subagent`); the main agent's names none.
    step = {agent: step.subagent?.id ?? this.agents.find((a) => a.parent === null)?.id ?? "main", ...step};
    if (this.steps.length < this.total) { // steps not loaded yet come first: it is shown after them
      this.total += 1;
      this.showRemaining();
      return;
    }
    this.total += 1;
    this.steps.push(step);
    this.index();
    const el = this.article(step, this.steps.length - 1);
    this.list.append(el);
    this.observer.observe(el);
  }

  article(step, i) {
    const previous = i > 0 ? this.steps[i - 1] : null;
    const el = h("li", {class: "step" + (step.status === "error" ? " failed" : ""), tabindex: "-1", dataset: {step: step.trace_id, agent: step.agent ?? ""},
      hidden: this.agent !== null && step.agent !== this.agent,
      "aria-label": `Step ${i + 1}`});
    const chips = [
      step.endpoint, step.finish_reason ? `finish: ${step.finish_reason}` : "",
      `${count(step.input_tokens)} in` + (step.cached_tokens ? ` (${count(step.cached_tokens)} cached)` : ""),
      `${count(step.output_tokens)} out`,
      step.ttft_ms !== undefined ? `first token ${ms(step.ttft_ms)}` : "",
      step.queue_ms !== undefined ? `queue ${ms(step.queue_ms)}` : "",
      step.prefill_ms !== undefined ? `prefill ${ms(step.prefill_ms)}` : "",
      step.tokens_per_second ? `${step.tokens_per_second.toFixed(1)} tok/s` : "",
      step.drafted ? `drafts ${step.accepted}/${step.drafted} accepted` + (step.draft_method ? ` (${step.draft_method})` : "") : "",
      step.backend || "",
      this.agents.length > 1 && step.agent ? `agent ${step.agent}` : "",
      step.route ? routeChip(step.route) : "",
    ].filter(Boolean);
    const why = step.continuity_fork ? ` (${step.continuity_fork})` : "";
    const badge = step.continuity ? h("span", {class: `badge continuity ${step.continuity}`,
      title: (CONTINUITY[step.continuity] || step.continuity) + (step.continuity_fork
        ? `: ${FORKS[step.continuity_fork] || step.continuity_fork}` : "")}, step.continuity + why) : "";
    el.append(h("header", {},
      h("h3", {}, h("a", {href: `/traces/${step.trace_id}`, onclick: (e) => this.follow(e, `/traces/${step.trace_id}`)}, `Step ${i + 1}`)),
      h("time", {}, when(step.start_ns)), badge, ...compactionBadges(step),
      h("ul", {class: "chips"}, chips.map((c) => typeof c === "string" ? h("li", {}, c) : h("li", {title: c.title}, c.text)))));
    if (step.error || (step.http_status && step.http_status >= 400)) {
      el.append(h("p", {class: "error"}, `Failed: ${step.error || "error"} (HTTP ${step.http_status ?? "–"})`));
    }
    if (step.lost_spans) {
      el.append(h("p", {class: "error lost"}, `Incomplete: ${step.lost_spans} span${step.lost_spans === 1 ? "" : "s"} of ` +
        "this step never reached the store (its queue was full or a write failed); what is shown may be missing parts."));
    }
    el.append(this.newMessages(step));
    const output = (step.output || [])[0];
    const generated = h("div", {class: "generated", dataset: {tokens: step.output_tokens ?? 0}},
      h("h4", {}, "Generated", h("span", {class: "note"}, ` ${count(step.output_tokens)} tokens`)));
    if (output) {
      const reasoning = partsText(output.parts, "reasoning"), text = partsText(output.parts, "text");
      if (reasoning) generated.append(h("div", {class: "placeholder thinking"}, longText(reasoning)));
      if (text) generated.append(h("div", {class: "placeholder"}, longText(text)));
    }
    el.append(generated);
    if ((step.tool_calls || []).length) el.append(this.toolCalls(step));
    el.append(h("div", {class: "actions"},
      h("button", {type: "button", onclick: (e) => this.showPrompt(e.target, step, previous)}, "Exact prompt"),
      (step.forks || []).length ? h("span", {class: "note"}, `${step.forks.length} fork${step.forks.length > 1 ? "s" : ""}: `,
        step.forks.map((id) => h("a", {href: `/traces/${id}`, class: "fork-link", onclick: (e) => this.follow(e, `/traces/${id}`)}, id.slice(0, 8)))) : ""));
    return el;
  }

  newMessages(step) {
    const box = h("div", {class: "new"});
    const messages = step.new_messages;
    if (!messages) {
      const refused = step.error || (step.http_status && step.http_status >= 400);
      box.append(h("p", {class: "note"}, step.new_from !== undefined ? ""
        : refused ? "Messages not kept: the request was refused before they reached the model (see its error)."
        : "Messages not recorded (--no-trace-content)."));
      return box;
    }
    box.append(h("h4", {}, "New in the prompt", h("span", {class: "note"}, step.new_from ? ` from message ${step.new_from + 1}` : "")));
    for (const m of messages) {
      if (m.role === "tool") {
        for (const part of m.parts || []) {
          const made = this.calls.get(part.id);
          const response = typeof part.response === "string" ? part.response : JSON.stringify(part.response);
          box.append(h("div", {class: "msg tool-result"},
            h("span", {class: "role"}, "tool result"),
            made ? h("span", {class: "answers"}, "for ", h("code", {}, made.call.name),
              made.sent ? " (in the history sent) " : ` (step ${made.step + 1}) `,
              h("code", {class: "args"}, made.call.arguments ?? "")) : h("span", {class: "answers"}, "for ", h("code", {}, part.id || "an earlier call")),
            longText(response)));
        }
      } else if (m.role === "assistant") {
        const text = m.parts.map((p) => p.type === "tool_call" ? `${p.name}(${JSON.stringify(p.arguments)})` : p.content ?? "").join("\n");
        box.append(h("details", {class: "msg assistant"}, h("summary", {}, h("span", {class: "role"}, "assistant"),
          " the previous answer, as the client sent it back"), longText(text)));
      } else {
        const text = partsText(m.parts, "text");
        const attached = (m.parts || []).filter((p) => p.type === "uri" || p.type === "blob");
        const el = h("div", {class: `msg ${m.role}`}, h("span", {class: "role"}, m.role), longText(text),
          attached.map((p) => h("span", {class: "attached", title: p.uri || ""}, `[${p.modality || "file"} ${p.mime_type || ""}]`)));
        if (m.role === "system" && text.length > 400) {
          box.append(h("details", {class: "msg system"}, h("summary", {}, h("span", {class: "role"}, "system"), ` ${count(text.length)} characters`), longText(text)));
        } else box.append(el);
      }
    }
    return box;
  }

  toolCalls(step) {
    return h("div", {class: "calls"}, h("h4", {}, "Tool calls"), step.tool_calls.map((call) => {
      const result = call.id && this.results.get(call.id);
      return h("div", {class: `call outcome-${call.outcome}`},
        h("div", {class: "call-head"}, h("code", {class: "name"}, call.name || "(unparsed)"),
          h("span", {class: `outcome ${call.outcome}`}, OUTCOMES[call.outcome] || call.outcome),
          call.id ? h("span", {class: "note"}, call.id) : ""),
        call.arguments !== undefined ? h("pre", {class: "args"}, pretty(call.arguments)) : "",
        call.raw !== undefined ? h("details", {}, h("summary", {}, "raw text"), h("pre", {class: "raw"}, call.raw)) : "",
        result ? h("details", {class: "result"}, h("summary", {}, `result, in step ${result.step + 1}`), longText(result.text)) : "");
    }));
  }

  async loadTokens(article) {
    if (!article || article.dataset.loaded) return;
    article.dataset.loaded = "loading";
    const traceId = article.dataset.step;
    let found;
    try {
      found = await get(`/v1/traces/${encodeURIComponent(traceId)}/tokens`);
    } catch (err) {
      article.dataset.loaded = "";
      return;
    }
    const generated = article.querySelector(".generated");
    if (!found.tokens.length) { article.dataset.loaded = "empty"; return; }
    const ratios = this.mode === "gap" ? this.rollout?.ratios(traceId) : null;
    const shown = ratios ? found.tokens.map((t, i) => ({...t, gap: ratios[i] ?? null})) : found.tokens;
    const stream = tokenStream(shown, {onPick: (i) => this.fork(article, traceId, found.tokens, i)});
    generated.querySelectorAll(".placeholder, .tokens").forEach((el) => el.remove());
    generated.append(stream);
    article.tokens = found.tokens;
    article.dataset.loaded = "yes";
    performance.mark("looptrace:tokens"); // for bench/viewer.py: when a step's heat map is drawn
  }

  // The heat maps by probability ("p") or by the trainer's log-ratio ("gap"): drawn again.
  heat(mode) {
    this.mode = mode;
    const legendNow = this.root.querySelector(".session-head .legend");
    legendNow.replaceWith(mode === "gap" ? gapLegend() : legend());
    for (const article of this.list.querySelectorAll("[data-step][data-loaded=yes]")) {
      article.dataset.loaded = "";
      this.loadTokens(article);
    }
  }

  fork(article, traceId, tokens, i) {
    article.querySelector(".fork")?.remove();
    const panel = forkPanel(traceId, tokens, i, {onClose: () => article.querySelector(".tokens")?.focus()});
    article.querySelector(".generated").after(panel);
    panel.querySelector("button.alt")?.focus();
  }

  async showPrompt(button, step, previous) {
    const article = button.closest("[data-step]");
    const open = article.querySelector(".prompt-view");
    if (open) { open.remove(); button.textContent = "Exact prompt"; return; }
    button.textContent = "Loading…";
    try {
      const view = await promptView(step.trace_id, previous?.trace_id);
      article.querySelector(".actions").after(view);
      button.textContent = "Hide the prompt";
    } catch (err) {
      button.textContent = "Exact prompt";
      article.querySelector(".actions").after(h("p", {class: "error"}, err.message));
    }
  }

  follow(e, path) {
    if (e.button || e.metaKey || e.ctrlKey || e.shiftKey) return;
    e.preventDefault();
    this.onNavigate(path);
  }

  // ↑ ↓ between steps; Enter into a step's tokens; Esc back out (tokens.js).
  keys(e) {
    const step = e.target.closest?.("[data-step]");
    if (!step || e.target.closest(".tokens, input, button, summary, a, .fork")) return;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const next = e.key === "ArrowDown" ? step.nextElementSibling : step.previousElementSibling;
      if (next) { e.preventDefault(); next.focus(); next.scrollIntoView({block: "nearest"}); }
    } else if (e.key === "Enter") {
      e.preventDefault();
      this.loadTokens(step).then(() => step.querySelector(".tokens")?.focus());
    }
  }
}

// How the session's requests were found to be one (looptrace.session.grouped_by: docs/clients.md#sessions):
// the header or body field the client named it in, or its history. Text from the trace, set as text.
function groupedBy(steps) {
  const how = steps.map((s) => s.grouped_by).filter(Boolean).pop();
  if (!how) return null;
  return h("p", {class: "facts grouped-by"}, how === "history"
    ? "grouped by its history (no session id sent: each request extends the last one's prompt and answer)"
    : `grouped by ${how === "prompt_cache_key" ? "the body's prompt_cache_key" : `the ${how} header`}`);
}
