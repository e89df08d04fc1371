// Everything this page shows was written by a model or by whoever sent the request. It goes into the
// page as text nodes, never as markup, and the characters that hide or reorder text (bidi controls,
// zero-width characters, other control characters) are shown as visible marks, so that what a person
// reads is what the model read.

const HIDDEN = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\ufff9-\ufffb]/g;

export function codepoint(ch) {
  return "U+" + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
}

// A fragment of text nodes, with a visible mark for each hidden character.
export function visible(text) {
  const out = document.createDocumentFragment();
  const s = String(text ?? "");
  let last = 0;
  for (const m of s.matchAll(HIDDEN)) {
    if (m.index > last) out.append(s.slice(last, m.index));
    const mark = document.createElement("span");
    mark.className = "hidden-char";
    mark.title = "an invisible character in the text";
    mark.textContent = "⟨" + codepoint(m[0]) + "⟩";
    out.append(mark);
    last = m.index + m[0].length;
  }
  if (last < s.length) out.append(s.slice(last));
  return out;
}

// A token's text with its whitespace made visible (a newline ⏎, a space ·, a tab →, a carriage
// return ␍), each mark set apart as whitespace so that a real "·" in the text still reads as itself.
const WHITESPACE = {"\n": "⏎", " ": "·", "\t": "→", "\r": "␍"};
const WHITESPACE_NAMES = {"\n": "a newline", " ": "a space", "\t": "a tab", "\r": "a carriage return"};

export function spaced(text) {
  const out = document.createDocumentFragment();
  const s = String(text ?? "");
  let last = 0;
  for (const m of s.matchAll(/[\n \t\r]/g)) {
    if (m.index > last) out.append(visible(s.slice(last, m.index)));
    out.append(h("span", {class: "ws", title: WHITESPACE_NAMES[m[0]]}, WHITESPACE[m[0]]));
    last = m.index + 1;
  }
  if (last < s.length) out.append(visible(s.slice(last)));
  return out;
}

// h("div", {class: "x", onclick: fn, dataset: {i: 1}}, "text", child): an element; strings become
// visible text. Attribute values are set as strings by the DOM, never parsed as markup.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : visible(child));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

// Numbers and times as a person reads them.
export function count(n) {
  if (n === undefined || n === null) return "–";
  return n >= 10000 ? (n / 1000).toFixed(1) + "k" : String(n);
}

export function ms(value) {
  if (value === undefined || value === null) return "–";
  return value >= 1000 ? (value / 1000).toFixed(2) + " s" : value.toFixed(value < 10 ? 1 : 0) + " ms";
}

export function when(ns) {
  if (!ns) return "";
  const d = new Date(ns / 1e6);
  const today = new Date();
  const time = d.toLocaleTimeString([], {hour12: false});
  return d.toDateString() === today.toDateString() ? time : d.toLocaleDateString() + " " + time;
}

export function percent(p) {
  if (p === undefined || p === null || p < 0) return "–";
  return p >= 0.995 ? (p * 100).toFixed(1) + "%" : p >= 0.0995 ? (p * 100).toFixed(1) + "%" : (p * 100).toPrecision(2) + "%";
}

// JSON pretty-printed for reading; text that is not JSON stays as it is.
export function pretty(value) {
  if (typeof value !== "string") return JSON.stringify(value, null, 2);
  try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
}
