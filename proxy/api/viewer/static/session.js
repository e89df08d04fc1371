// A session as the agent's loop: one step per request, in order, each with what was new in its prompt
// (the user's message, tool results beside the calls they answer), what the model thought and said
// token by token, its tool calls, why it stopped, and how long each part took.

import {get, sessionPath} from "./api.js";
import {agentTree} from "./agents.js";
import {sessionLinks} from "./compare-links.js";
import {forkPanel} from "./fork.js";
import {promptView} from "./prompt.js";
import {rolloutFacts, rolloutPanel} from "./rollout.js";
import {OUTCOMES, stepArticle} from "./step.js";
import {count, h, when} from "./text.js";
import {gapLegend, legend, tokenStream} from "./tokens.js";

// Steps drawn at once when a session opens, then per page as the list's end scrolls into view: a session
// of hundreds of steps shows its first ones at once (its steps' tokens and prompts load when shown).
const FIRST_PAGE = 50, PAGE = 200;

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
    return stepArticle(this, step, i);
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
