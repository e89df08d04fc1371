// The server's /v1 API, as this page uses it. With --api-key set, the key the person enters goes in the
// Authorization header of every request; it is kept in this tab's session storage, never in a URL.

const STORAGE = "looptrace-api-key";
let keyWanted = null; // a pending "ask for the key" promise, shared by requests that hit a 401

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

export const key = {
  get: () => sessionStorage.getItem(STORAGE) || "",
  set: (value) => {
    value ? sessionStorage.setItem(STORAGE, value) : sessionStorage.removeItem(STORAGE);
    window.dispatchEvent(new Event("looptrace-key"));
  },
  ask: null, // set by the page: shows the key dialog, resolves when a key was entered (or rejects)
};

function headers(extra) {
  const out = {...extra};
  const k = key.get();
  if (k) out.Authorization = "Bearer " + k;
  return out;
}

async function call(method, path, body) {
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(path, {
      method,
      headers: headers(body === undefined ? {} : {"Content-Type": "application/json"}),
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
    if (response.status === 401 && attempt < 3 && key.ask) {
      keyWanted = keyWanted || key.ask(key.get() ? "That key was refused." : "").finally(() => { keyWanted = null; });
      await keyWanted;
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

// GET /v1/live, read as server-sent events through fetch (EventSource cannot send a header). Calls
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
        const response = await fetch("/v1/live", {headers: headers({Accept: "text/event-stream"}), signal: controller.signal});
        if (response.status === 401) { // the sessions list asks for the key; try again once one is set
          onState("locked");
          await new Promise((r) => {
            const retry = () => { window.removeEventListener("looptrace-key", retry); r(); };
            window.addEventListener("looptrace-key", retry);
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
            else if (data) onStep(JSON.parse(data));
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
