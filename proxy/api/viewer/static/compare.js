// Two sessions side by side, aligned by step: an original and its replay (`looptrace replay`), or any two
// (one task run on two models). Per step: how the prompts differ, both answers as heat maps with the
// tokens where they diverge marked, and both sides' tool calls; on top, how many steps agree, the first
// divergence and each side's mean surprise. The address says which two: /compare/KEY_A/KEY_B (each key
// percent-encoded), or /compare?a=KEY_A&b=KEY_B.

import {get, query, sessionPath} from "./api.js";
import {installLogin} from "./login.js";
import {count, h, pretty} from "./text.js";
import {legend, tokenStream} from "./tokens.js";

const $ = (id) => document.getElementById(id);
const OUTCOMES = {valid: "valid", invalid_args: "invalid arguments", unknown_tool: "unknown tool", unparsed: "unparsed"};

// The two keys from the address. The path keeps each key percent-encoded (a "/" in a key is "%2F").
export function keysFrom(loc) {
  const params = new URLSearchParams(loc.search);
  if (params.has("a") || params.has("b")) return [params.get("a") || "", params.get("b") || ""];
  const parts = loc.pathname.replace(/^\/compare\/?/, "").split("/");
  if (parts.length !== 2) return null;
  try {
    return parts.map(decodeURIComponent);
  } catch {
    return null;
  }
}

function surprise(value) {
  return value === null || value === undefined ? "–" : `${value.toFixed(3)} nats`;
}

function sideHead(label, session) {
  return h("div", {class: "side"},
    h("span", {class: "label"}, label),
    h("h2", {}, h("a", {href: sessionPath("/sessions", session.key)}, h("code", {}, session.key))),
    h("p", {class: "note"}, [session.client || "client unknown", session.model, `${session.steps} steps`,
      `${count(session.input_tokens)} in / ${count(session.output_tokens)} out`].filter(Boolean).join(" · ")));
}

function summary(data) {
  const s = data.summary;
  const first = s.first_divergence;
  const figure = (label, value, cls = "") => h("span", {class: `figure ${cls}`}, `${label} `, h("b", {}, value));
  const replay = data.steps.find((p) => p.replay)?.replay;
  return h("section", {class: "compare-summary", "aria-label": "Summary"},
    figure("steps agreeing", `${s.steps_agreeing} of ${s.compared}`, s.steps_agreeing === s.compared ? "ok" : "bad"),
    figure("first divergence", first ? `step ${first.step}, token ${first.token}` : "none", first ? "bad" : "ok"),
    figure("mean surprise", `${surprise(s.mean_surprise_a)} | ${surprise(s.mean_surprise_b)}`),
    s.steps_a !== s.steps_b ? h("span", {class: "note"}, `${s.steps_a} steps against ${s.steps_b}: the rest are not aligned`) : "",
    replay ? h("span", {class: "note"}, `right: a ${replay.mode} replay against ${replay.target}`) : "");
}

function calls(list) {
  if (!list?.length) return h("p", {class: "note"}, "no tool calls");
  return h("div", {class: "calls"}, list.map((call) => h("div", {class: `call outcome-${call.outcome}`},
    h("div", {class: "call-head"}, h("code", {class: "name"}, call.name || "(unparsed)"),
      h("span", {class: `outcome ${call.outcome}`}, OUTCOMES[call.outcome] || call.outcome)),
    call.arguments !== undefined ? h("pre", {class: "args"}, pretty(call.arguments)) : "",
    call.outcome === "unparsed" && call.raw !== undefined ? h("pre", {class: "raw"}, call.raw) : "")));
}

function promptDiff(prompt) {
  if (!prompt.known) return h("p", {class: "prompt-diff note"}, "Prompts not recorded (--no-trace-content).");
  if (prompt.same) return h("p", {class: "prompt-diff note"}, `The same prompt, ${count(prompt.tokens_a)} tokens.`);
  return h("details", {class: "prompt-diff"},
    h("summary", {}, `The prompts differ from token ${prompt.common_tokens} (${count(prompt.tokens_a)} tokens | ` +
      `${count(prompt.tokens_b)}); the differing parts, from character ${prompt.at_char}`),
    h("div", {class: "cols"}, h("pre", {class: "a"}, prompt.text_a || "∅"), h("pre", {class: "b"}, prompt.text_b || "∅")));
}

function heatMap(tokens, divergent, label) {
  if (!tokens.length) return h("p", {class: "note"}, "no tokens");
  const stream = tokenStream(tokens, {label});
  for (const i of divergent) stream.querySelector(`.tok[data-i="${i}"]`)?.classList.add("diverged");
  return stream;
}

function pair(p) {
  const diverged = p.divergent.length > 0 || p.parted_at !== null || !p.tool_calls_equal;
  const verdict = (same, yes, no) => h("span", {class: `verdict ${same ? "same" : "differ"}`}, same ? yes : no);
  const notes = [];
  if (p.first_divergence !== null) notes.push(`first divergence at token ${p.first_divergence}`);
  if (p.parted_at !== null && p.parted_at !== p.first_divergence) notes.push(`one answer goes on from token ${p.parted_at}`);
  const el = h("li", {class: "pair" + (diverged ? " diverged" : ""), tabindex: "-1", dataset: {step: p.step},
    "aria-label": `Step ${p.step}`},
    h("header", {}, h("h3", {}, `Step ${p.step}`),
      verdict(!p.divergent.length && p.parted_at === null, "same tokens", `${p.divergent.length} divergent`),
      verdict(p.tool_calls_equal, "same tool calls", "different tool calls"),
      notes.length ? h("span", {class: "note"}, notes.join("; ")) : ""),
    promptDiff(p.prompt),
    h("div", {class: "cols"},
      ["a", "b"].map((side) => h("div", {class: "col"},
        h("h4", {}, side === "a" ? "left" : "right", h("span", {class: "note"},
          ` ${count(p[`tokens_${side}`].length)} tokens · finish: ${p[side].finish_reason || "–"}`)),
        heatMap(p[`tokens_${side}`], p.divergent, `Step ${p.step}, ${side === "a" ? "left" : "right"}`),
        calls(p[side].tool_calls)))));
  return el;
}

async function load() {
  const root = $("compare");
  const keys = keysFrom(location);
  if (!keys || !keys[0] || !keys[1]) {
    root.replaceChildren(h("p", {class: "error"}, "Name two sessions: /compare/KEY_A/KEY_B (each key percent-encoded) " +
      "or /compare?a=KEY_A&b=KEY_B."));
    return;
  }
  let data;
  try {
    // ?agent_a=&agent_b=: one agent's line of each session (docs/viewer.md, "Agents and subagents").
    const params = new URLSearchParams(location.search);
    data = await get(`/v1/compare${query({a: keys[0], b: keys[1], agent_a: params.get("agent_a"), agent_b: params.get("agent_b")})}`);
  } catch (err) {
    root.replaceChildren(h("p", {class: "error"}, err.message));
    return;
  }
  const steps = h("ol", {class: "pairs", "aria-label": "Steps, aligned"}, data.steps.map(pair));
  root.replaceChildren(
    h("header", {class: "compare-head"}, sideHead("left", data.a), sideHead("right", data.b)),
    summary(data),
    h("div", {class: "legend-row"}, legend(), h("div", {class: "legend"}, h("span", {class: "tok diverged"}, "diverges"))),
    steps);
  performance.mark("looptrace:compare"); // for bench/viewer.py and the tests: the page is drawn
}

// ↑ ↓ between steps, Enter into the left answer's tokens (→ ← move, Esc back: tokens.js).
$("compare").addEventListener("keydown", (e) => {
  const step = e.target.closest?.(".pair");
  if (!step || e.target.closest(".tokens, a, button, summary")) return;
  if (e.key === "ArrowDown" || e.key === "ArrowUp") {
    const next = e.key === "ArrowDown" ? step.nextElementSibling : step.previousElementSibling;
    if (next) { e.preventDefault(); next.focus(); next.scrollIntoView({block: "nearest"}); }
  } else if (e.key === "Enter") {
    e.preventDefault();
    step.querySelector(".tokens")?.focus();
  }
});

installLogin(load); // the key dialog (login.js), as the main page has it

load();
