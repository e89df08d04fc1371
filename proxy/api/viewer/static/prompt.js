// The exact prompt a step's model read: the rendered string with special tokens marked, the part new
// since the step before highlighted, token boundaries and ids on demand, and what changed against
// what the model had seen at the end of the previous step (its prompt, then its answer): what the
// template added, and what it dropped (reasoning of earlier turns, a system message moved).

import {get, query} from "./api.js";
import {h, visible} from "./text.js";

export async function promptView(traceId, previousId) {
  const view = await get(`/v1/traces/${encodeURIComponent(traceId)}/prompt` + query({against: previousId}));
  const box = h("div", {class: "prompt-view"});
  if (view.text === undefined || view.text === null) {
    const why = {
      past_context: `This prompt was past the model's context (${view.count ?? "?"} tokens): only its size was kept.`,
      not_rendered: "This request was refused before its prompt was rendered (see its error).",
    }[view.not_kept] ?? "This trace was recorded with --no-trace-content: the prompt's text was not kept.";
    box.append(h("p", {class: "note"}, why));
    return box;
  }
  if ((view.media || []).length) box.append(mediaStrip(view.media));
  const body = h("pre", {class: "prompt", tabindex: "0", "aria-label": "The exact prompt"});
  const controls = h("div", {class: "prompt-controls"});
  const summary = [`${view.count ?? "?"} tokens`];
  if (view.new_offset) summary.push(`new from token ${view.new_offset}`);
  controls.append(h("span", {class: "note"}, summary.join(" · ")));

  if (!view.tokens) {
    body.append(visible(view.text));
    controls.append(h("span", {class: "note"}, " · token boundaries need the trace's own model served"));
    box.append(controls, body);
    return box;
  }
  const inserted = new Uint8Array(view.tokens.length);
  const removedAt = new Map(Object.entries(view.removed || {}).map(([k, v]) => [+k, v]));
  let changes = 0;
  for (const edit of view.diff || []) {
    if (edit.op === "insert" || edit.op === "replace") {
      for (let i = edit.b[0]; i < edit.b[1]; i++) inserted[i] = 1;
    }
    if (edit.op !== "equal") changes++;
  }
  const frag = document.createDocumentFragment();
  view.tokens.forEach(([id, text, special], i) => {
    if (removedAt.has(i)) frag.append(h("del", {class: "removed", title: "in the previous step, not in this prompt"}, removedAt.get(i)));
    const classes = ["pt"];
    if (special) classes.push("special");
    if (i >= (view.new_offset || 0) && view.new_offset) classes.push("new");
    if (inserted[i]) classes.push("ins");
    frag.append(h("span", {class: classes.join(" "), dataset: {id}}, text));
  });
  if (removedAt.has(view.tokens.length)) frag.append(h("del", {class: "removed"}, removedAt.get(view.tokens.length)));
  body.append(frag);
  // The part worth reading first: what is new, or with the changes shown, the first change.
  const reveal = (selector) => {
    const el = body.querySelector(selector);
    if (el) body.scrollTop = Math.max(0, el.offsetTop - body.offsetTop - 40);
  };
  const toggle = (name, label, on) => {
    const input = h("input", {type: "checkbox", checked: on});
    if (on) body.classList.add(name);
    input.addEventListener("change", () => {
      body.classList.toggle(name, input.checked);
      if (input.checked) reveal(name === "show-diff" ? ".ins, del.removed" : ".new");
    });
    return h("label", {class: "toggle"}, input, " ", label);
  };
  requestAnimationFrame(() => reveal(".new"));
  controls.append(toggle("show-new", "new since the last step", true));
  if (view.diff) controls.append(toggle("show-diff", `changes against the previous step (${changes})`, false));
  controls.append(toggle("show-tokens", "token boundaries and ids", false));
  box.append(controls, body);
  return box;
}

// The attached items as the model got them: a thumbnail (the server's own small JPEG, when the
// trace keeps content), what it was, and the prompt tokens it became.
function mediaStrip(items) {
  return h("div", {class: "media-strip"}, items.map((m) => {
    const size = m.width ? `${m.width}×${m.height}` : "";
    const length = m.frames ? `${m.frames} of ${m.total_frames} frames, ${m.seconds} s`
      : m.seconds ? `${m.seconds} s` : "";
    const caption = [m.kind, size, length, m.format || m.mime, m.bytes ? `${(m.bytes / 1024).toFixed(1)} kB` : "",
      `${m.tokens} tokens` + (m.offset != null ? ` from token ${m.offset}` : "")].filter(Boolean).join(" · ");
    const thumb = typeof m.thumbnail === "string" && m.thumbnail.startsWith("data:image/jpeg;base64,")
      ? h("img", {src: m.thumbnail, alt: `attached ${m.kind}`}) : h("span", {class: "note"}, "(no thumbnail kept)");
    return h("figure", {class: "media-item", title: m.sha256 ? `sha256 ${m.sha256}` : ""}, thumb, h("figcaption", {}, caption));
  }));
}
