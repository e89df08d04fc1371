// From a session to a comparison: "Compare with…" picks another session (its replays first: their
// keys hold this one's) and opens /compare/THIS/THAT; "Replay against…" shows the command that replays
// this session against another server, which stores the replay beside it (`looptrace replay`).

import {get, query} from "./api.js";
import {h} from "./text.js";

export function comparePath(a, b) {
  // A key of "." or ".." would be a step up the path however it is escaped: such keys go in the query.
  const dots = (k) => k === "." || k === "..";
  return dots(a) || dots(b) ? `/compare${query({a, b})}`
    : `/compare/${encodeURIComponent(a)}/${encodeURIComponent(b)}`;
}

// A shell word that stays one word whatever the key holds.
export function shellWord(text) {
  return /^[A-Za-z0-9_.:@%+=\/-]+$/.test(text) ? text : `'${text.replaceAll("'", `'"'"'`)}'`;
}

function replayPanel(sessionKey) {
  const target = h("input", {type: "url", placeholder: "http://other-server:8000", "aria-label": "The target server's URL"});
  const mode = h("select", {"aria-label": "Mode"}, h("option", {value: "forced"}, "forced: score the recorded answers"),
    h("option", {value: "step"}, "step: decode each prompt afresh"));
  const command = h("pre", {class: "command"});
  const update = () => {
    command.textContent = ["looptrace replay --store TRACE_DB", `--session ${shellWord(sessionKey)}`,
      `--target ${shellWord(target.value.trim() || "URL")}`, `--mode ${mode.value}`,
      "--report report.json --junit report.xml --min-agreement 1"].join(" \\\n    ");
  };
  target.addEventListener("input", update);
  mode.addEventListener("change", update);
  update();
  return h("details", {class: "links-panel replay-against"},
    h("summary", {}, "Replay against…"),
    h("p", {class: "note"}, "Another looptrace server (any backend), or a vLLM server for forced mode. TRACE_DB is " +
      "what this server's --trace-db names; the replay is stored there as a session of its own, to compare with this one."),
    target, mode, command);
}

function comparePanel(sessionKey) {
  const search = h("input", {type: "search", placeholder: "Conversation id or text", "aria-label": "Find a session to compare with"});
  const list = h("ul", {"aria-label": "Sessions to compare with"});
  let asked = 0;
  const show = async (text) => {
    const mine = ++asked;
    let page;
    try {
      page = await get(`/v1/sessions${query({q: text, limit: 20})}`);
    } catch (err) {
      list.replaceChildren(h("li", {class: "error"}, err.message));
      return;
    }
    if (mine !== asked) return;
    const others = page.data.filter((s) => s.key !== sessionKey);
    list.replaceChildren(...(others.length ? others.map((s) => h("li", {},
      h("a", {href: comparePath(sessionKey, s.key)}, s.key), h("span", {class: "note"},
        ` ${[s.client, s.model, `${s.steps} steps`].filter(Boolean).join(" · ")}`)))
      : [h("li", {class: "note"}, "No other session found.")]));
  };
  const panel = h("details", {class: "links-panel compare-with"}, h("summary", {}, "Compare with…"),
    h("p", {class: "note"}, "Its replays are listed first; search for any other session."), search, list);
  panel.addEventListener("toggle", () => { if (panel.open && !list.childElementCount) show(sessionKey); });
  let timer = null;
  search.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => show(search.value.trim() || sessionKey), 250);
  });
  return panel;
}

export function sessionLinks(sessionKey) {
  return h("div", {class: "session-links"}, comparePanel(sessionKey), replayPanel(sessionKey));
}
