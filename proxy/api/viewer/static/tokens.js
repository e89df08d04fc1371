// Generated tokens as a heat map: each token's text on a background that says how likely the model
// found it, on a colour-blind-safe sequential scale (pale yellow to dark brown: lightness carries the
// meaning, so it reads in grey too). Hover or keyboard focus shows the token's numbers and its five
// alternatives; a click or Enter forks from it. Tokens inside a tool call's arguments that the model
// was unsure of are flagged: that is where agents' calls go wrong.

import {h, percent, spaced, visible} from "./text.js";

export const BINS = [ // lower bound of p, class, label
  [0.9, "p0", "≥ 90%"], [0.7, "p1", "70–90%"], [0.4, "p2", "40–70%"],
  [0.15, "p3", "15–40%"], [0.05, "p4", "5–15%"], [0, "p5", "< 5%"],
];
export const FLAG_P = 0.5; // a tool-call token less likely than this is flagged…
export const FLAG_MARGIN = 0.2; // …and so is one that led its runner-up by less than this

const CHANNELS = {thought: "thinking", content: "answer", tool_call: "tool call"};
// --speculative-config's methods, as the tooltip names them (an unknown one shows as it was stored).
const DRAFT_METHODS = {
  ngram: "ngram (prompt lookup)", suffix: "suffix decoding", draft_model: "a draft model",
  mtp: "the model's own MTP drafter",
};

export function bin(p) {
  if (p === null || p === undefined) return "pn"; // not a number when recorded: no colour, not "< 5%"
  for (const [low, cls] of BINS) if (p >= low) return cls;
  return "p5";
}

// The alternatives' probabilities, whichever way the token came (stored: top_p; a fork's answer: top_logprobs).
export function topP(token) {
  if (token.top_p) return token.top_p;
  return (token.top_logprobs || []).map(Math.exp);
}

export function margin(token) {
  const ps = topP(token);
  const others = ps.filter((_, i) => token.top_ids?.[i] !== token.id);
  return token.p - (others.length ? Math.max(...others) : 0);
}

export function flagged(token) {
  return token.channel === "tool_call" && !token.special && (token.p < FLAG_P || margin(token) < FLAG_MARGIN);
}

// The gap mode's scale: |log π_trainer − log π_sampler|, pale where the two agree, dark where not.
export const GAP_BINS = [[1, "p5", "≥ 1"], [0.3, "p4", "0.3–1"], [0.1, "p3", "0.1–0.3"], [0.03, "p2", "0.03–0.1"],
  [0.01, "p1", "0.01–0.03"], [0, "p0", "< 0.01"]];

export function gapBin(ratio) {
  if (ratio === null || ratio === undefined) return "pn";
  for (const [low, cls] of GAP_BINS) if (Math.abs(ratio) >= low) return cls;
  return "p0";
}

export function gapLegend() {
  return h("div", {class: "legend gap-legend", "aria-label": "How far the trainer's logprob is from the sampler's"},
    h("span", {class: "legend-title"}, "|log-ratio|"),
    [...GAP_BINS].reverse().map(([, cls, label]) => h("span", {class: `tok ${cls}`}, label)));
}

export function legend() {
  return h("div", {class: "legend", "aria-label": "How likely the model found each token"},
    h("span", {class: "legend-title"}, "p(token)"),
    BINS.map(([, cls, label]) => h("span", {class: `tok ${cls}`}, label)),
    h("span", {class: "tok flag"}, "unsure tool-call argument"),
    h("span", {class: "tok special"}, "special token"),
    h("span", {class: "tok drafted-accepted"}, "drafted, and the draft stood"),
    h("span", {class: "tok drafted"}, "the model's own where a draft was rejected"));
}

function tokenText(token) {
  // A special token (a stop token adds no text) shows as what it is; a byte that only begins a
  // character shows empty, and the token that completes it carries the character.
  if (token.special) return token.piece || token.text || "";
  return token.text ?? "";
}

function tokenNode(token, i) {
  const classes = ["tok", token.gap !== undefined ? gapBin(token.gap) : bin(token.p)];
  if (token.special) classes.push("special");
  if (flagged(token)) classes.push("flag");
  if (token.drafted) classes.push(token.accepted ? "drafted-accepted" : "drafted");
  const el = h("span", {class: classes.join(" "), dataset: {i}});
  const text = tokenText(token);
  if (token.text === undefined && token.piece === undefined) {
    el.classList.add("notext"); // recorded with --no-trace-content: numbers, no words
    el.append("▪");
  } else if (token.special) {
    el.append(visible(text));
  } else {
    const parts = text.split("\n");
    parts.forEach((part, k) => {
      if (k) el.append(h("span", {class: "nl", "aria-hidden": "true"}, "↵"), "\n");
      if (part) el.append(visible(part));
    });
    if (!text) el.classList.add("empty-tok");
  }
  return el;
}

// A focusable stream of tokens. `onPick(index)` runs on click or Enter; `first` is the index the
// first token has in the whole answer (a fork's continuation starts after the fork point).
export function tokenStream(tokens, {onPick, first = 0, label = "Generated tokens"} = {}) {
  const box = h("div", {class: "tokens", tabindex: "0", role: "group",
    "aria-label": `${label}: ${tokens.length} tokens; arrow keys move, Enter forks from a token`});
  let channel = null;
  const frag = document.createDocumentFragment();
  tokens.forEach((token, i) => {
    if (token.channel && token.channel !== channel) {
      channel = token.channel;
      frag.append(h("span", {class: `chan chan-${channel}`, "aria-hidden": "true"}, CHANNELS[channel] || channel));
    }
    frag.append(tokenNode(token, i));
  });
  box.append(frag);
  let current = -1;
  const nodes = () => box.querySelectorAll(".tok[data-i]");
  function focusToken(i) {
    const all = nodes();
    if (!all.length) return;
    i = Math.max(0, Math.min(all.length - 1, i));
    all[current]?.classList.remove("current");
    current = i;
    all[i].classList.add("current");
    all[i].scrollIntoView({block: "nearest"});
    showTip(tokens[i], all[i], first + i);
  }
  box.addEventListener("mouseover", (e) => {
    const el = e.target.closest(".tok[data-i]");
    if (el && box.contains(el)) showTip(tokens[+el.dataset.i], el, first + +el.dataset.i);
  });
  box.addEventListener("mouseleave", () => { if (document.activeElement !== box) hideTip(); });
  box.addEventListener("click", (e) => {
    const el = e.target.closest(".tok[data-i]");
    if (el && onPick) { focusToken(+el.dataset.i); onPick(+el.dataset.i); }
  });
  box.addEventListener("focus", () => { if (current < 0) focusToken(0); else focusToken(current); });
  box.addEventListener("blur", hideTip);
  box.addEventListener("keydown", (e) => {
    const moves = {ArrowRight: 1, ArrowLeft: -1, Home: -Infinity, End: Infinity};
    if (e.key in moves) {
      e.preventDefault();
      e.stopPropagation();
      const step = moves[e.key];
      focusToken(Number.isFinite(step) ? current + step : step > 0 ? tokens.length - 1 : 0);
    } else if (e.key === "Enter" && onPick && current >= 0) {
      e.preventDefault();
      e.stopPropagation();
      onPick(current);
    } else if (e.key === "Escape") {
      hideTip();
      box.closest("[data-step]")?.focus();
      e.stopPropagation();
    }
  });
  box.focusToken = focusToken;
  return box;
}

// What a token shows as in the tooltip: the text it adds, whitespace made visible; a special token
// (which adds none) as itself; "∅" for a byte that only begins a character (the next one completes it).
function tipText(text, special) {
  if (text === undefined) return "▪"; // recorded without content
  if (text === "") return h("span", {class: "no-text", title: "adds no text on its own"}, "∅");
  return special ? visible(text) : spaced(text);
}

// The one tooltip: what the model thought of a token. Its text first, the raw piece and id beside.
export function showTip(token, anchor, index) {
  const tip = document.getElementById("tip");
  const ps = topP(token);
  const alternatives = (token.top_ids || []).map((id, k) => {
    const p = ps[k];
    const text = token.top_texts?.[k] ?? token.top_pieces?.[k];
    const bar = h("span", {class: "bar"});
    bar.style.width = Math.max(1, Math.round((p ?? 0) * 100)) + "%";
    return h("li", {class: id === token.id ? "chosen" : ""},
      h("span", {class: "alt-text"}, text === undefined ? "▪" : h("code", {}, tipText(text, false))),
      h("span", {class: "alt-p"}, percent(p)), h("span", {class: "alt-bar"}, bar),
      h("span", {class: "alt-id"}, `#${id}`));
  });
  const head = h("div", {class: "tip-head"},
    h("code", {class: "tip-text"}, tipText(token.special ? tokenText(token) : token.text, token.special)),
    h("span", {class: "tip-raw"}, token.piece !== undefined ? [h("code", {}, token.piece), " · "] : "",
      `id ${token.id ?? "–"}`));
  const rows = [
    ["token", `${index} of the answer`],
    ["p", percent(token.p)],
    ["logprob", token.logprob?.toFixed(4)],
    ["rank", token.rank ?? "not in the top five"],
    ["channel", CHANNELS[token.channel] || token.channel || "–"],
  ];
  if (token.gap !== undefined) rows.push(["log-ratio", token.gap === null ? "–" : `${token.gap.toFixed(4)} (trainer − sampler)`]);
  if (token.special) rows.push(["special", "yes"]);
  if (token.drafted) {
    rows.push(["drafted", token.accepted ? "yes: the draft stood" : "the draft was rejected: this is the model's own token"]);
    if (token.draft_method) rows.push(["drafted by", DRAFT_METHODS[token.draft_method] || token.draft_method]);
  }
  if (flagged(token)) rows.push(["flag", `unsure: p ${percent(token.p)}, lead over the runner-up ${percent(margin(token))}`]);
  tip.replaceChildren(head,
    h("dl", {}, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "–")])),
    alternatives.length ? h("ol", {class: "alts", "aria-label": "The five most likely tokens"}, alternatives) : "",
    h("p", {class: "hint"}, "Click or Enter: fork from this token"));
  tip.hidden = false;
  const r = anchor.getBoundingClientRect();
  const width = tip.offsetWidth, height = tip.offsetHeight;
  let left = Math.min(window.innerWidth - width - 8, Math.max(8, r.left));
  let top = r.bottom + 6;
  if (top + height > window.innerHeight - 8) top = Math.max(8, r.top - height - 6);
  tip.style.left = left + "px";
  tip.style.top = top + "px";
}

export function hideTip() {
  document.getElementById("tip").hidden = true;
}
