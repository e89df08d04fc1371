// Fork from a token: pick one of its alternatives (or type text), and the server runs the request again
// from there (POST /v1/traces/{id}/fork): the same prompt, the tokens before this one, the replacement,
// then whatever the model writes next, shown beside the original.

import {post} from "./api.js";
import {h, percent} from "./text.js";
import {legend, tokenStream, topP} from "./tokens.js";

export function forkPanel(traceId, tokens, index, {onClose} = {}) {
  const token = tokens[index];
  const panel = h("section", {class: "fork", "aria-label": `Fork from token ${index}`});
  const result = h("div", {class: "fork-result", "aria-live": "polite"});
  const ps = topP(token);
  const choices = (token.top_ids || []).map((id, k) => {
    const text = token.top_texts?.[k] ?? token.top_pieces?.[k] ?? "";
    return h("button", {type: "button", class: "alt" + (id === token.id ? " chosen" : ""), dataset: {tokenId: id},
      onclick: () => run({token_id: id}, `#${id}`)},
    h("code", {}, text === "" ? "∅" : text), " ", h("span", {class: "alt-p"}, percent(ps[k])));
  });
  const typed = h("input", {type: "text", "aria-label": "Text to put in place of this token", placeholder: "or type text"});
  const maxTokens = h("input", {type: "number", min: "1", value: "", placeholder: "as before", "aria-label": "Most tokens to generate", class: "max-tokens"});
  const form = h("form", {class: "fork-text", onsubmit: (e) => {
    e.preventDefault();
    if (typed.value) run({text: typed.value}, JSON.stringify(typed.value));
  }}, typed, h("button", {type: "submit"}, "Fork with this text"), h("label", {}, " max tokens ", maxTokens));
  const close = h("button", {type: "button", class: "close", "aria-label": "Close the fork panel", onclick: () => { panel.remove(); onClose?.(); }}, "×");
  panel.append(
    h("header", {}, h("h4", {}, `Fork from token ${index}`), close),
    h("p", {class: "note"}, "Run this request again with another token here (greedy from there on):"),
    h("div", {class: "alts-row"}, choices), form, result);
  panel.addEventListener("keydown", (e) => {
    if (e.key === "Escape") { e.stopPropagation(); panel.remove(); onClose?.(); }
  });

  async function run(what, label) {
    result.replaceChildren(h("p", {class: "note"}, `Running from token ${index} with ${label}…`));
    const body = {index, ...what};
    if (maxTokens.value) body.max_tokens = +maxTokens.value;
    let answer;
    try {
      answer = await post(`/v1/traces/${encodeURIComponent(traceId)}/fork`, body);
    } catch (err) {
      result.replaceChildren(h("p", {class: "error"}, `The fork failed: ${err.message}`));
      return;
    }
    const lt = answer.looptrace;
    const replaced = lt.replacement_ids.length;
    const original = tokens.slice(index);
    const message = answer.choices[0].message;
    const column = (title, stream, note) => h("div", {class: "fork-col"}, h("h5", {}, title), note, stream);
    const forkedStream = tokenStream(lt.tokens, {first: index + replaced, label: "The fork's tokens"});
    const forced = h("span", {class: "tok forced", title: "the replacement, put here by hand"}, replacementText(lt, token, label));
    const channel = forkedStream.querySelector(".chan");
    channel ? channel.after(forced) : forkedStream.prepend(forced);
    result.replaceChildren(
      h("div", {class: "fork-cols"},
        column("Original, from here", tokenStream(original, {first: index, label: "The original tokens"}),
          h("p", {class: "note"}, `${original.length} tokens`)),
        column("Fork", forkedStream, h("p", {class: "note"},
          `trace ${lt.trace_id ?? "(not recorded)"} · ${lt.tokens.length} new tokens · finish: ${answer.choices[0].finish_reason}`))),
      message.tool_calls?.length ? h("div", {class: "fork-calls"}, h("h5", {}, "Tool calls in the fork"),
        message.tool_calls.map((c) => h("pre", {class: "call"}, `${c.function.name}(${c.function.arguments})`))) : "",
      legend());
    result.dataset.forkTrace = lt.trace_id || "";
  }
  return panel;
}

function replacementText(lt, token, label) {
  const k = (token.top_ids || []).indexOf(lt.replacement_ids[0]);
  if (lt.replacement_ids.length === 1 && k >= 0) return token.top_texts?.[k] ?? token.top_pieces?.[k] ?? label;
  return label.startsWith('"') ? JSON.parse(label) : label;
}
