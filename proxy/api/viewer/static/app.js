// The trace viewer: the sessions list on the left, the selected session's steps on the right, the
// selection in the URL (/sessions/KEY, /traces/TRACE_ID), so a link from Grafana opens that view.

import {get, sessionPath, watch} from "./api.js";
import {installLogin} from "./login.js";
import {SessionView} from "./session.js";
import {SessionList} from "./sessions.js";
import {h} from "./text.js";

const $ = (id) => document.getElementById(id);

const view = new SessionView($("detail"), {onNavigate: navigate});
const list = new SessionList({list: $("session-list"), more: $("more"), note: $("list-note"), form: $("filters"),
  onOpen: (sessionKey) => navigate(sessionPath("/sessions", sessionKey))});

function navigate(path) {
  history.pushState(null, "", path);
  route();
}

async function route() {
  const path = location.pathname;
  const session = path.match(/^\/sessions\/(.*)$/);
  const trace = path.match(/^\/traces\/([0-9a-fA-F]{32})$/);
  const sessionKey = session && (session[1] ? decodeURIComponent(session[1]) : new URLSearchParams(location.search).get("key"));
  if (sessionKey) {
    list.mark(sessionKey);
    await view.open(sessionKey);
  } else if (trace) {
    // A trace opens as its step in its session (a fork: the step it forked from).
    let found;
    try {
      found = await get(`/v1/traces/${trace[1]}/tokens`);
    } catch (err) {
      $("detail").replaceChildren(h("p", {class: "error"}, err.status === 404
        ? `No trace ${trace[1]} in the store (not written yet, or retired).` : err.message));
      return;
    }
    let focus = found.trace_id, traceSession = found.session;
    if (found.fork_of) {
      const original = await get(`/v1/traces/${found.fork_of}/tokens`).catch(() => null);
      if (original) { focus = original.trace_id; traceSession = original.session; }
    }
    if (!traceSession) {
      $("detail").replaceChildren(found.lost_spans
        ? h("p", {class: "error"}, `This trace is incomplete: ${found.lost_spans} of its spans never reached the store ` +
            "(its queue was full or a write failed), its request's own span among them, so it belongs to no session.")
        : h("p", {class: "note"}, "This trace is still being stored; reload in a moment."));
      return;
    }
    list.mark(traceSession);
    await view.open(traceSession, {focus});
    const article = document.querySelector(`[data-step="${CSS.escape(focus)}"]`);
    if (article) {
      await view.loadTokens(article);
      article.scrollIntoView({block: "start"});
    }
  }
}

// The key dialog (login.js): once logged in, or out, the list and the open view load again.
installLogin(() => { list.load(); route(); });

window.addEventListener("popstate", route);
document.addEventListener("keydown", (e) => {
  if (e.key === "/" && !e.target.closest("input, textarea")) { e.preventDefault(); $("q").focus(); }
});

// New steps as they are stored: the list refreshes, and the open session grows.
watch({
  onStep: (step) => { list.soon(); view.add(step); },
  onGap: () => { list.soon(); view.refresh(); },
  onState: (state) => { $("live").dataset.state = state; $("live").title = {
    on: "Watching: new requests appear as they are stored", off: "Not connected; retrying",
    locked: "Needs the API key"}[state]; },
});

get("/health").then((health) => {
  $("where").textContent = [health.model, health.backend, health.status].filter(Boolean).join(" · ");
}).catch(() => {});
list.load();
route();
