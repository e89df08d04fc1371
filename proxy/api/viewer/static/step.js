// One step of a session as drawn (session.js lists them): its header and chips, what was new in its
// prompt (tool results beside the calls they answer), what was generated, its tool calls with their
// results, and its actions. `view` is the session page: its steps, where each call was made and
// answered (`calls`, `results`), the agent shown, and how to follow a link or show the exact prompt.

import {compactionBadges} from "./compaction.js";
import {routeChip} from "./routing.js";
import {count, h, ms, pretty, when} from "./text.js";

const LONG = 4000; // characters of a message shown before "show all": a step stays quick to draw
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
export const OUTCOMES = {valid: "valid", invalid_args: "invalid arguments", unknown_tool: "unknown tool", unparsed: "unparsed"};

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

function partsText(parts, type) {
  return (parts || []).filter((p) => p.type === type).map((p) => p.content ?? "").join("");
}

// The step's article in the list: the `i`th step of the session's loop.
export function stepArticle(view, step, i) {
  const previous = i > 0 ? view.steps[i - 1] : null;
  const el = h("li", {class: "step" + (step.status === "error" ? " failed" : ""), tabindex: "-1", dataset: {step: step.trace_id, agent: step.agent ?? ""},
    hidden: view.agent !== null && step.agent !== view.agent,
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
    view.agents.length > 1 && step.agent ? `agent ${step.agent}` : "",
    step.route ? routeChip(step.route) : "",
  ].filter(Boolean);
  const why = step.continuity_fork ? ` (${step.continuity_fork})` : "";
  const badge = step.continuity ? h("span", {class: `badge continuity ${step.continuity}`,
    title: (CONTINUITY[step.continuity] || step.continuity) + (step.continuity_fork
      ? `: ${FORKS[step.continuity_fork] || step.continuity_fork}` : "")}, step.continuity + why) : "";
  el.append(h("header", {},
    h("h3", {}, h("a", {href: `/traces/${step.trace_id}`, onclick: (e) => view.follow(e, `/traces/${step.trace_id}`)}, `Step ${i + 1}`)),
    h("time", {}, when(step.start_ns)), badge, ...compactionBadges(step),
    h("ul", {class: "chips"}, chips.map((c) => typeof c === "string" ? h("li", {}, c) : h("li", {title: c.title}, c.text)))));
  if (step.error || (step.http_status && step.http_status >= 400)) {
    el.append(h("p", {class: "error"}, `Failed: ${step.error || "error"} (HTTP ${step.http_status ?? "–"})`));
  }
  if (step.lost_spans) {
    el.append(h("p", {class: "error lost"}, `Incomplete: ${step.lost_spans} span${step.lost_spans === 1 ? "" : "s"} of ` +
      "this step never reached the store (its queue was full or a write failed); what is shown may be missing parts."));
  }
  el.append(newMessages(view, step));
  const output = (step.output || [])[0];
  const generated = h("div", {class: "generated", dataset: {tokens: step.output_tokens ?? 0}},
    h("h4", {}, "Generated", h("span", {class: "note"}, ` ${count(step.output_tokens)} tokens`)));
  if (output) {
    const reasoning = partsText(output.parts, "reasoning"), text = partsText(output.parts, "text");
    if (reasoning) generated.append(h("div", {class: "placeholder thinking"}, longText(reasoning)));
    if (text) generated.append(h("div", {class: "placeholder"}, longText(text)));
  }
  el.append(generated);
  if ((step.tool_calls || []).length) el.append(toolCalls(view, step));
  el.append(h("div", {class: "actions"},
    h("button", {type: "button", onclick: (e) => view.showPrompt(e.target, step, previous)}, "Exact prompt"),
    (step.forks || []).length ? h("span", {class: "note"}, `${step.forks.length} fork${step.forks.length > 1 ? "s" : ""}: `,
      step.forks.map((id) => h("a", {href: `/traces/${id}`, class: "fork-link", onclick: (e) => view.follow(e, `/traces/${id}`)}, id.slice(0, 8)))) : ""));
  return el;
}

function newMessages(view, step) {
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
        const made = view.calls.get(part.id);
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

function toolCalls(view, step) {
  return h("div", {class: "calls"}, h("h4", {}, "Tool calls"), step.tool_calls.map((call) => {
    const result = call.id && view.results.get(call.id);
    return h("div", {class: `call outcome-${call.outcome}`},
      h("div", {class: "call-head"}, h("code", {class: "name"}, call.name || "(unparsed)"),
        h("span", {class: `outcome ${call.outcome}`}, OUTCOMES[call.outcome] || call.outcome),
        call.id ? h("span", {class: "note"}, call.id) : ""),
      call.arguments !== undefined ? h("pre", {class: "args"}, pretty(call.arguments)) : "",
      call.raw !== undefined ? h("details", {}, h("summary", {}, "raw text"), h("pre", {class: "raw"}, call.raw)) : "",
      result ? h("details", {class: "result"}, h("summary", {}, `result, in step ${result.step + 1}`), longText(result.text)) : "");
  }));
}
