"""Reading the store: traces, sessions, a session's steps, one trace whole.

The same queries read either store (the trace API, the viewer and fork call nothing else): a store
says how to open a connection for reading (`_reader`, a context manager whose connection runs
`execute(sql, args)` with `?` placeholders and rows read by column name), where it is (`where`, for
messages: never a password), what it raises when it cannot answer (interface.StoreUnavailable,
whatever its driver raised) and the few places where its SQL differs: how a trace's spans are
ordered, how a session's text is searched, how a substring is found.

SQLite: any thread may read; each query opens its own read-only connection, so readers never wait
for the writer (WAL mode). A store that does not exist yet reads as empty.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from looptrace.common import attributes as attr
from looptrace.common.jsonio import loads

from .agent_tree import agent_tree
from .chains import make_whole
from .interface import Row
from .packing import restored
from .records import OUTCOMES
from .tokens import expand_events

FORK_LIMIT = 50  # forks listed per step
RESULTS_AT_ONCE = 500  # call ids asked for in one statement


class TraceQueries:
    where = "?"
    ALL_ROWS = "-1"  # SQLite's LIMIT for "no limit" (PostgreSQL's is ALL, or none)
    SPAN_ORDER = "rowid"  # spans that start together (prefill and decode) in the order they were stored
    # A session whose conversation id holds the text, or one of whose steps says it.
    TEXT_MATCH = ("(instr(lower(coalesce(conversation, key)), lower(?)) > 0 OR key IN ("
                  "SELECT t.session FROM trace_text x JOIN traces t ON t.trace_id = x.trace_id "
                  "WHERE trace_text MATCH ?))")

    def _reader(self) -> AbstractContextManager:
        raise NotImplementedError

    @staticmethod
    def _text_args(text: str) -> list:
        return [text, _phrase(text)]

    # -- traces --

    def list_traces(self, *, conversation: str | None = None, model: str | None = None,
                    since_ns: int | None = None, before: tuple[int, str] | None = None, limit: int = 50,
                    tenant: str | None = None) -> dict:
        """Traces, newest first, `limit` at a time: `before` is the (start_ns, trace_id) of the previous
        page's last row (keyset paging: any page costs what the first does). `tenant`: its traces alone
        (None: everyone's, for the operator)."""
        where, args = [], []
        for column, value in (("conversation", conversation), ("model", model), ("tenant", tenant)):
            if value is not None:
                where.append(f"t.{column} = ?")
                args.append(value)
        if since_ns is not None:
            where.append("t.start_ns >= ?")
            args.append(since_ns)
        if before is not None:
            where.append("(t.start_ns, t.trace_id) < (?, ?)")  # a row comparison: the index seeks to it
            args += [before[0], before[1]]
        sql = ("SELECT t.*, l.spans AS lost FROM traces t LEFT JOIN lost_spans l USING (trace_id)"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY t.start_ns DESC, t.trace_id DESC LIMIT ?")
        with self._reader() as db:
            rows = db.execute(sql, (*args, limit + 1)).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        data = [{
            "trace_id": r["trace_id"], "start_time_unix_nano": r["start_ns"],
            "duration_ms": (r["end_ns"] - r["start_ns"]) / 1e6, "endpoint": r["endpoint"], "model": r["model"],
            "conversation": r["conversation"], "status": r["status"], "http_status": r["http_status"],
            "input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"],
            "complete": r["lost"] is None, **({"lost_spans": r["lost"]} if r["lost"] else {}),
        } for r in rows]
        last = data[-1] if more else None
        return {"data": data, "next": f"{last['start_time_unix_nano']}:{last['trace_id']}" if last else None}

    def get_trace(self, trace_id: str, tenant: str | None = None) -> dict | None:
        """A trace, or None; with `tenant`, only one of that tenant's (another's is as unknown)."""
        with self._reader() as db:
            # The trace's row first: it is written with the server span, after every other span, so once
            # it is seen the spans read next are all there (a batch commits spans and row together).
            step = db.execute("SELECT session, step, tenant FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
            if tenant is not None and (step is None or step["tenant"] != tenant):
                return None
            rows = db.execute(f"SELECT * FROM spans WHERE trace_id = ? ORDER BY start_ns, {self.SPAN_ORDER}",
                              (trace_id,)).fetchall()
            lost = db.execute("SELECT spans FROM lost_spans WHERE trace_id = ?", (trace_id,)).fetchone()
            spans = [self._span(r) for r in rows]
            make_whole(db, trace_id, spans)  # each step's prompt and messages, whole (chains.py)
        if not rows and lost is None:
            return None
        # The server span ends last: until it is written, the trace is still arriving. A trace that
        # lost spans on the way to the store is never complete.
        found = {"trace_id": trace_id, "complete": step is not None and lost is None, "spans": spans}
        if lost is not None:
            found["lost_spans"] = lost[0]
        if step is not None:
            found["session"] = step["session"]
            if step["step"]:
                found["step"] = loads(step["step"])
        return found

    @staticmethod
    def _span(r) -> dict:
        events = restored(loads(r["events"]), r["tokens"])
        span = {
            "trace_id": r["trace_id"], "span_id": r["span_id"], "parent_span_id": r["parent_id"],
            "name": r["name"], "kind": r["kind"], "start_time_unix_nano": r["start_ns"],
            "end_time_unix_nano": r["end_ns"], "duration_ms": (r["end_ns"] - r["start_ns"]) / 1e6,
            "status": r["status"], "attributes": loads(r["attributes"]), "events": events,
            "links": loads(r["links"]),
        }
        tokens = expand_events(events)
        if tokens:
            span["tokens"] = tokens
        return span

    def tokens(self, trace_id: str, tenant: str | None = None) -> dict | None:
        """A trace's generated tokens, one dict each, without its other spans (which hold whole prompts)."""
        with self._reader() as db:
            root = db.execute("SELECT model, session, fork_of, tenant FROM traces WHERE trace_id = ?",
                              (trace_id,)).fetchone()
            if tenant is not None and (root is None or root["tenant"] != tenant):
                return None
            decode = db.execute("SELECT events, tokens FROM spans WHERE trace_id = ? AND name = ?",
                                (trace_id, attr.SPAN_DECODE)).fetchone()
            lost = db.execute("SELECT spans FROM lost_spans WHERE trace_id = ?", (trace_id,)).fetchone()
        if root is None and decode is None and lost is None:
            return None
        found = {"trace_id": trace_id, "model": root["model"] if root else None,
                 "session": root["session"] if root else None, "fork_of": root["fork_of"] if root else None,
                 "tokens": expand_events(restored(loads(decode["events"]), decode["tokens"])) if decode else []}
        if lost is not None:
            found["lost_spans"] = lost[0]
        return found

    def tool_results(self, calls: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str | None]]:
        """The results joined to these calls (call id → the trace and span id of its execute_tool span):
        call id → (the result, the trace of the request that brought it), for the calls that have one."""
        found, ids = {}, list(calls)
        with self._reader() as db:
            for start in range(0, len(ids), RESULTS_AT_ONCE):
                chunk = ids[start:start + RESULTS_AT_ONCE]
                rows = db.execute("SELECT t.call_id, t.trace_id, t.span_id, s.attributes FROM tool_calls t "
                                  "JOIN spans s ON s.trace_id = t.trace_id AND s.span_id = t.span_id "
                                  f"WHERE t.call_id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
                for r in rows:
                    attrs = loads(r["attributes"]) if calls[r["call_id"]] == (r["trace_id"], r["span_id"]) else {}
                    if isinstance(attrs.get(attr.TOOL_RESULT), str):
                        found[r["call_id"]] = (attrs[attr.TOOL_RESULT], attrs.get(attr.TOOL_RESULT_TRACE_ID))
        return found

    def generated_ids(self, trace_id: str) -> list[int]:
        """The token ids a traced request generated, for the replay backend."""
        found = self.get_trace(trace_id)
        if found is None:
            raise LookupError(f"no trace {trace_id} in {self.where}")
        decode = [s for s in found["spans"] if s["name"] == attr.SPAN_DECODE]
        tokens = decode[0].get("tokens", []) if decode else []
        if not tokens:
            raise LookupError(f"trace {trace_id} has no generated tokens")
        if "id" not in tokens[0]:
            raise LookupError(f"trace {trace_id} was recorded with --no-trace-content: its token ids were not kept")
        return [t["id"] for t in tokens]

    def replay_steps(self, spec: str) -> list[dict]:
        """`--replay` from the store: trace ids (comma-separated), or `conversation:ID` for every trace of
        a session, oldest first; one step of generated token ids per trace."""
        if spec.startswith("conversation:"):
            conversation = spec.removeprefix("conversation:")
            trace_ids = [t["trace_id"] for t in reversed(self.list_traces(conversation=conversation, limit=100000)["data"])]
            if not trace_ids:
                raise ValueError(f"--replay {spec}: no traces of conversation {conversation!r} in {self.where}")
        elif all(len(t) == 32 for t in spec.split(",")):
            trace_ids = spec.split(",")
        else:
            raise ValueError(f"--replay {spec}: not a file, a trace id or conversation:ID")
        return [{"token_ids": self.generated_ids(trace_id)} for trace_id in trace_ids]

    # -- sessions --

    def list_sessions(self, *, model: str | None = None, client: str | None = None, since_ns: int | None = None,
                      until_ns: int | None = None, text: str | None = None, before: tuple[int, str] | None = None,
                      limit: int = 50, keys: list[str] | None = None, tenant: str | None = None) -> dict:
        """Sessions, most recently active first, `limit` at a time: `before` is the (last_ns, key) of
        the previous page's last row. `text` matches a conversation id or words a step said or read.
        `tenant`: its sessions alone, and its models and clients (None: everyone's)."""
        where, args = [], []
        for column, value in (("model", model), ("client", client), ("tenant", tenant)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        if since_ns is not None:
            where.append("last_ns >= ?")
            args.append(since_ns)
        if until_ns is not None:
            where.append("first_ns <= ?")
            args.append(until_ns)
        if keys is not None:  # a rollout group's sessions (rollouts.py keeps which those are)
            where.append(f"key IN ({','.join('?' * len(keys))})" if keys else "0 = 1")
            args += keys
        if text:
            where.append(self.TEXT_MATCH)
            args += self._text_args(text)
        if before is not None:
            where.append("(last_ns, key) < (?, ?)")
            args += [before[0], before[1]]
        sql = ("SELECT * FROM sessions" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY last_ns DESC, key DESC LIMIT ?")
        with self._reader() as db:
            rows = [_session(r) for r in db.execute(sql, (*args, limit + 1)).fetchall()]
            if tenant is None:
                facets = {"models": [r["v"] for r in db.execute(DISTINCT.format(column="model")).fetchall()],
                          "clients": [r["v"] for r in db.execute(DISTINCT.format(column="client")).fetchall()]}
            else:  # another tenant's models and clients are not this one's to see
                facets = {f"{column}s": [r["v"] for r in db.execute(
                    f"SELECT DISTINCT {column} AS v FROM sessions WHERE tenant = ? AND {column} IS NOT NULL "
                    f"ORDER BY v LIMIT 100", (tenant,)).fetchall()] for column in ("model", "client")}
        more = len(rows) > limit
        rows = rows[:limit]
        agents = self._agent_counts([r["key"] for r in rows])
        for row in rows:
            row["agents"] = agents.get(row["key"], 1)
        after = rows[-1] if more else None
        return {"data": rows, "next": f"{after['last_ns']}:{after['key']}" if after else None, **facets}

    def session(self, key: str, offset: int = 0, limit: int | None = None, tenant: str | None = None) -> dict | None:
        """A session and its steps in order, each the summary its request was stored with: all of them,
        or `limit` from step `offset` (a page of a session of hundreds of steps; `steps_total` says how
        many there are)."""
        page, args = (" LIMIT ? OFFSET ?", (limit, offset)) if limit is not None else \
            (" LIMIT -1 OFFSET ?" if self.ALL_ROWS == "-1" else " OFFSET ?", (offset,))
        with self._reader() as db:
            head = db.execute("SELECT * FROM sessions WHERE key = ?", (key,)).fetchone()
            if head is None or (tenant is not None and head["tenant"] != tenant):
                return None
            rows = db.execute("SELECT t.*, l.spans AS lost FROM traces t LEFT JOIN lost_spans l USING (trace_id) "
                              "WHERE t.session = ? AND t.fork_of IS NULL ORDER BY t.start_ns, t.trace_id" + page,
                              (key, *args)).fetchall()
            forks: dict[str, list[str]] = {}
            shown = [r["trace_id"] for r in rows]
            for start in range(0, len(shown), 500):  # the forks of the steps shown, whatever the session's size
                chunk = shown[start:start + 500]
                for fork in db.execute(
                        f"SELECT trace_id, fork_of FROM traces WHERE fork_of IN ({','.join('?' * len(chunk))}) "
                        "ORDER BY start_ns LIMIT ?", (*chunk, FORK_LIMIT * 20)):
                    forks.setdefault(fork["fork_of"], []).append(fork["trace_id"])
        steps = []
        for r in rows:
            step = loads(r["step"]) if r["step"] else _bare_step(r)
            if r["lost"]:
                step["lost_spans"] = r["lost"]  # the store never received all of this step's spans
            if r["trace_id"] in forks:
                step["forks"] = forks[r["trace_id"]][:FORK_LIMIT]
            steps.append(step)
        whole = offset == 0 and (limit is None or len(rows) < limit)  # the page is every step
        agents, of_step = agent_tree(steps if whole else self._session_steps(key))
        for step, agent in zip(steps, of_step if whole else self._agents_of(agents, steps)):
            step["agent"] = agent
        return {**_session(head), "agents": agents, "steps": steps, "steps_total": head["steps"],
                "steps_offset": offset}

    def _agent_counts(self, keys: list[str]) -> dict[str, int]:
        """How many agents each session had (the main agent and every subagent or side request named),
        read from the steps a subagent sent alone: a session list reads no main agent's step."""
        ids: dict[str, set] = {}
        with self._reader() as db:
            for start in range(0, len(keys), 500):
                chunk = keys[start:start + 500]
                for r in db.execute(f"SELECT session, step FROM traces WHERE session IN ({','.join('?' * len(chunk))}) "
                                    "AND fork_of IS NULL AND step LIKE ?", (*chunk, '%"subagent"%')):
                    said = loads(r["step"]).get("subagent")
                    if said:
                        ids.setdefault(r["session"], set()).add(said["id"])
        return {key: 1 + len(found) for key, found in ids.items()}

    def _session_steps(self, key: str) -> list[dict]:
        """Every step of a session, for its agents when a page shows only some."""
        with self._reader() as db:
            rows = db.execute("SELECT t.* FROM traces t WHERE t.session = ? AND t.fork_of IS NULL "
                              "ORDER BY t.start_ns, t.trace_id", (key,)).fetchall()
        return [loads(r["step"]) if r["step"] else _bare_step(r) for r in rows]

    @staticmethod
    def _agents_of(agents: list[dict], steps: list[dict]) -> list[str]:
        main = next(a["id"] for a in agents if a["parent"] is None)
        return [(s.get("subagent") or {}).get("id", main) for s in steps]


# The distinct values of an indexed column, one index seek each (a skip scan written out): listing
# sessions must not read every session to offer its filters.
DISTINCT = """
WITH RECURSIVE v (v) AS (SELECT min({column}) FROM sessions
                         UNION ALL SELECT (SELECT min({column}) FROM sessions WHERE {column} > v.v) FROM v
                         WHERE v.v IS NOT NULL)
SELECT v FROM v WHERE v IS NOT NULL LIMIT 100"""


def _session(row: Row) -> dict:
    return {
        "key": row["key"], "conversation": row["conversation"], "model": row["model"], "client": row["client"],
        "client_version": row["client_version"], "first_ns": row["first_ns"], "last_ns": row["last_ns"],
        "steps": row["steps"], "input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
        "tool_calls": {o: row[f"tools_{o}"] for o in OUTCOMES}, "errors": row["errors"],
        "last_trace_id": row["last_trace_id"], "tenant": row["tenant"],
    }


def _bare_step(row: Row) -> dict:
    """A trace stored before step summaries existed: what its row says."""
    return {"trace_id": row["trace_id"], "start_ns": row["start_ns"], "end_ns": row["end_ns"],
            "endpoint": row["endpoint"], "model": row["model"], "status": row["status"],
            "http_status": row["http_status"], "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"], "tool_calls": [], "tools": {}}


def _phrase(text: str) -> str:
    """The user's words as one FTS5 phrase: nothing they type is read as query syntax."""
    return '"' + text.replace('"', '""') + '"'
