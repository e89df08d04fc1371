// The server's /v1 API, as this page uses it. Where the server asks for a key (a 401), the person enters it
// once and it goes to POST /v1/login, nowhere else: the server answers with a session cookie this page's
// scripts cannot read (HttpOnly), which the browser sends with the page's requests. The key is kept in no
// page storage and no URL.

let loginWanted = null; // a pending "log in" promise, shared by requests that hit a 401

// A session's address under `prefix` ("/sessions" for the page, "/v1/sessions" for its data). A key
// that is "." or ".." would be a step up the path however it is escaped (browsers resolve "%2E%2E" as
// ".." too), so it goes in the query instead: /sessions/?key=..
export function sessionPath(prefix, sessionKey) {
  const dots = sessionKey === "." || sessionKey === "..";
  return dots ? `${prefix}/?key=${encodeURIComponent(sessionKey)}` : `${prefix}/${encodeURIComponent(sessionKey)}`;
}

export class APIError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code;
  }
}

export const login = {
  ask: null, // set by the page (login.js): shows the key dialog, resolves once logged in (or rejects)
};

// POST /v1/login: resolves to null once the session cookie is set, or to the server's reason for refusing.
export async function logIn(key) {
  const response = await fetch("/v1/login", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({key}), cache: "no-store"});
  if (response.ok) {
    window.dispatchEvent(new Event("looptrace-login"));
    return null;
  }
  const data = await response.json().catch(() => null);
  return data?.error?.message || `HTTP ${response.status}`;
}

export async function logOut() {
  await fetch("/v1/logout", {method: "POST", cache: "no-store"});
}

async function call(method, path, body) {
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(path, {
      method,
      headers: body === undefined ? {} : {"Content-Type": "application/json"},
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
    if (response.status === 401 && attempt < 3 && login.ask) {
      loginWanted = loginWanted || login.ask().finally(() => { loginWanted = null; });
      await loginWanted;
      continue;
    }
    const data = await response.json().catch(() => null);
    if (!response.ok) throw new APIError(response.status, data);
    return data;
  }
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? "?" + s : "";
}

// GET /v1/live, read as server-sent events through fetch (its 401 is told apart from a dropped stream). Calls
// onStep(step) for every request stored, onGap() when the stream fell behind or reconnected;
// reconnects until stop() is called.
export function watch({onStep, onGap, onState}) {
  let stopped = false;
  let controller = null;
  async function run() {
    let wait = 500;
    while (!stopped) {
      controller = new AbortController();
      try {
        const response = await fetch("/v1/live", {headers: {Accept: "text/event-stream"}, signal: controller.signal});
        if (response.status === 401) { // the sessions list asks for the key; try again once logged in
          onState("locked");
          await new Promise((r) => {
            const retry = () => { window.removeEventListener("looptrace-login", retry); r(); };
            window.addEventListener("looptrace-login", retry);
            setTimeout(retry, 10000);
          });
          continue;
        }
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        onState("on");
        onGap(); // whatever was stored before the stream (re)opened
        wait = 500;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            let event = "message", data = "";
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) event = line.slice(6).trim();
              else if (line.startsWith("data:")) data += line.slice(5).trim();
            }
            if (event === "gap") onGap();
            else if (event === "message" && data) onStep(JSON.parse(data));
            // `ended`: the login ended (logout, expiry) or its key was revoked; the server closes the
            // stream, and the reconnect below is told so (401: "locked").
          }
        }
      } catch (err) {
        if (stopped) return;
      }
      onState("off");
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(wait * 2, 10000);
    }
  }
  run();
  return () => { stopped = true; controller?.abort(); };
}
