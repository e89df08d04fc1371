// The sessions list: agent conversations, most recently active first, filtered by model, client and
// time, searched by conversation id or by text, paged; requests that carry no conversation are listed
// one by one. New steps refresh it as they are stored.

import {get, query, sessionPath} from "./api.js";
import {count, h, when} from "./text.js";

export class SessionList {
  constructor({list, more, note, form, onOpen}) {
    Object.assign(this, {list, more, note, form, onOpen});
    this.next = null;
    this.selected = null;
    this.timer = null;
    this.fields = {q: form.querySelector("#q"), model: form.querySelector("#model"),
      client: form.querySelector("#client"), since: form.querySelector("#since")};
    form.addEventListener("submit", (e) => { e.preventDefault(); this.load(); });
    this.fields.q.addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.load(), 250);
    });
    for (const name of ["model", "client", "since"]) this.fields[name].addEventListener("change", () => this.load());
    more.addEventListener("click", () => this.load({more: true}));
    list.addEventListener("keydown", (e) => this.keys(e));
  }

  params() {
    const since = this.fields.since.value;
    return {q: this.fields.q.value.trim(), model: this.fields.model.value, client: this.fields.client.value,
      since: since ? String(Date.now() / 1000 - +since) : ""};
  }

  // New steps were stored: refresh the first page in place, keeping the older pages already shown.
  soon(delay = 300) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.load({refresh: true}), delay);
  }

  async load({more = false, refresh = false} = {}) {
    const params = {...this.params(), limit: 50};
    if (more) params.before = this.next;
    let page;
    try {
      page = await get("/v1/sessions" + query(params));
    } catch (err) {
      this.note.textContent = err.status === 404 && err.code === "trace_store_off"
        ? "The trace store is off (--trace-db off): nothing is recorded." : `Could not list sessions: ${err.message}`;
      return;
    }
    this.facets(page);
    const focused = document.activeElement?.closest?.("a.session")?.dataset.key;
    const existing = (key) => this.list.querySelector(`a.session[data-key="${CSS.escape(key)}"]`)?.parentElement;
    if (refresh && this.list.children.length) {
      for (const s of [...page.data].reverse()) { // newest last, so it ends up on top
        existing(s.key)?.remove();
        this.list.prepend(this.row(s));
      }
    } else {
      const frag = document.createDocumentFragment();
      for (const s of page.data) if (!more || !existing(s.key)) frag.append(this.row(s));
      if (more) this.list.append(frag);
      else this.list.replaceChildren(frag);
      this.next = page.next;
      this.more.hidden = !page.next;
    }
    if (focused) existing(focused)?.querySelector("a").focus();
    performance.mark("looptrace:sessions"); // for bench/viewer.py: when a page of sessions is drawn
    const shown = this.list.children.length;
    this.note.textContent = shown ? "" : (params.q || params.model || params.client || params.since)
      ? "No session matches." : "Nothing recorded yet: point an agent at this server.";
    this.mark(this.selected);
  }

  facets(page) {
    for (const [name, values, all] of [["model", page.models, "All models"], ["client", page.clients, "All clients"]]) {
      const select = this.fields[name];
      const chosen = select.value;
      const options = [h("option", {value: ""}, all), ...values.map((v) => h("option", {value: v}, v))];
      if (chosen && !values.includes(chosen)) options.push(h("option", {value: chosen}, chosen));
      select.replaceChildren(...options);
      select.value = chosen;
    }
  }

  row(s) {
    const tools = s.tool_calls;
    const bad = tools.invalid_args + tools.unknown_tool + tools.unparsed;
    const title = s.conversation ?? `request ${s.key.replace(/^trace:/, "").slice(0, 12)}`;
    const a = h("a", {href: sessionPath("/sessions", s.key), class: "session", dataset: {key: s.key},
      onclick: (e) => {
        if (e.button || e.metaKey || e.ctrlKey || e.shiftKey) return;
        e.preventDefault();
        this.onOpen(s.key);
      }},
    h("span", {class: "title"}, h("code", {}, title), s.conversation ? "" : h("span", {class: "badge"}, "no conversation")),
    h("time", {}, when(s.last_ns)),
    h("span", {class: "who"}, [s.client ? `${s.client}${s.client_version ? " " + s.client_version : ""}` : "unknown client", s.model].filter(Boolean).join(" · ")),
    h("span", {class: "figures"},
      `${s.steps} step${s.steps === 1 ? "" : "s"}` + (s.agents > 1 ? ` · ${s.agents} agents` : "")
        + ` · ${count(s.input_tokens)} in / ${count(s.output_tokens)} out`,
      tools.valid ? h("span", {class: "ok", title: "valid tool calls"}, ` · ✓ ${tools.valid}`) : "",
      bad ? h("span", {class: "bad", title: "tool calls with invalid arguments, of unknown tools, or unparsed"}, ` · ✗ ${bad}`) : "",
      s.errors ? h("span", {class: "bad", title: "failed requests"}, ` · ⚠ ${s.errors} failed`) : ""));
    return h("li", {}, a);
  }

  mark(key) {
    this.selected = key;
    for (const a of this.list.querySelectorAll("a.session")) {
      if (a.dataset.key === key) a.setAttribute("aria-current", "true");
      else a.removeAttribute("aria-current");
    }
  }

  keys(e) {
    const a = e.target.closest("a.session");
    if (!a) return;
    const li = a.parentElement;
    const target = e.key === "ArrowDown" ? li.nextElementSibling : e.key === "ArrowUp" ? li.previousElementSibling : null;
    if (target) { e.preventDefault(); target.querySelector("a").focus(); }
  }
}
