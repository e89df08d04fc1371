"""The vLLM server behind the vllm backend: what it serves, by which route, and whether it answers.

On connecting, `/v1/models` gives the model, the checkpoint it was loaded from (`root`) and its
context; a POST of no tokens to `/inference/v1/generate` tells whether that route is there (400: it
is, the body failed validation at no cost to the engine; 403: started without --enable-scale-out;
404: a vLLM too old to have it). The body is `{"token_ids": []}`, not `{}`: a router in front
(vllm-router) answers `{}` itself (422, a field missing) and forwards this one to a server, whose
answer it is. Behind a router the servers may differ, so a request the generate route refuses goes
again by `/v1/completions` (stream.py), and the server's route stays that from then on. Once connected, its /health is probed so that requests go only to a
server that answers (the pool of servers, pool.py, keeps that going), and its /metrics read for its
load and its prefix cache's shape (routing/policies.py, routing/kv_index.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from . import protocol
from .routing import Holdings, Load, ServerCost

log = logging.getLogger("looptrace")

# vLLM's HTTP server (uvicorn) closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE): ours are
# dropped sooner, so a request seldom goes out on one it is closing.
KEEPALIVE_SECONDS = 4.0
RESENDS = 2  # a request sent again when the connection it went on closed unanswered (below, Upstream.send)


class Unreachable(Exception):
    """The server did not answer at all (refused, unknown host, no answer in time)."""


class Upstream:
    """One vLLM server: where it is, what it serves, by which route, and whether it answers now."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        url = url.rstrip("/")
        self.url = url[: -len("/v1")] if url.endswith("/v1") else url  # people paste their OpenAI base URL
        parts = urlsplit(self.url)
        self.address = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        # How traces and metrics name it: from the command line, never from a client.
        self.name = f"{self.address}:{self.port}"
        self.timeout = timeout
        # A stream's own: sock_read bounds each wait for data, and stops counting while the consumer is slow.
        self.stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = ""  # the id vLLM serves, sent as `model`
        self.root = ""  # the checkpoint vLLM loaded (a Hub id or a folder on its machine)
        self.max_model_len = 0
        self.route = protocol.COMPLETIONS
        self.route_note = ""  # why not the generate route
        self.connected = False  # its model, context and route are known
        self.reachable = False  # it answered last time it was asked
        self.error: str | None = None
        self.load = Load()  # requests in flight on it (this process's, and as it says), and averaged
        # What its prefix cache holds: read from its KV events (vllm/routing/kv_events.py) when the loader gives it
        # them, else estimated from what was sent to it.
        self.holdings = Holdings()
        self.cost = ServerCost()  # what a request would wait there for its first token, as measured (routing/cost.py)
        # Its weights' label (GET /weight_info: vLLM started with VLLM_SERVER_DEV_MODE=1), read with each probe; for a
        # response that does not say which weights sampled it.
        self.weight_version: str | None = None
        self._weight_info = True  # it offers /weight_info, until it answers otherwise
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No total limit: a stream lasts as long as the generation; waits are bounded per read.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS),
                json_serialize=json.dumps,
            )
        return self._session

    async def send(self, path: str, data: bytes, headers: dict,
                   timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """POST, answered with the response's headers. A pooled connection the server closed as the request
        went out (its keep-alive ran out at that moment: "Server disconnected", a reset) is a request the
        server never read, so it goes again on another connection, as aiohttp does for a GET; a connection
        that cannot be made is not retried here."""
        resends = 0
        while True:
            try:
                return await self.session.post(self.url + path, data=data, headers=headers, timeout=timeout)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError) or resends == RESENDS:
                    raise
                resends += 1
                log.debug("the vLLM server at %s closed the connection unanswered (%s); sending again", self.url,
                          describe(exc))

    @property
    def running(self) -> int:
        """Requests this process is streaming from it now."""
        return self.load.own

    @running.setter
    def running(self, value: int) -> None:
        self.load.set_own(value)

    # -- connecting --

    async def connect(self, model: str | None) -> None:
        """Read what the server serves and probe for the generate route (one attempt)."""
        status, body = await self._call("GET", "/v1/models")
        if status != 200:
            raise RuntimeError(f"the vLLM server at {self.url} answered {status} to GET /v1/models: "
                               f"{protocol.error_message(body, str(body))}")
        cards = [c for c in body.get("data") or () if isinstance(c, dict) and not c.get("parent")]
        card = _choose(cards, model, self.url)
        self.model, self.root = card["id"], card.get("root") or card["id"]
        if not isinstance(card.get("max_model_len"), int):
            raise RuntimeError(f"the vLLM server at {self.url} did not say max_model_len for {self.model}")
        self.max_model_len = card["max_model_len"]
        # No tokens fail validation where the route exists (400), and cost the engine nothing.
        status, body = await self._call("POST", protocol.GENERATE, {"token_ids": []})
        if status in (400, 422):
            self.route, self.route_note = protocol.GENERATE, ""
        else:
            why = {403: "the server was started without --enable-scale-out",
                   404: "this vLLM is too old to have it"}.get(status) or protocol.error_message(body, "unexpected")
            self.route, self.route_note = protocol.COMPLETIONS, f"{protocol.GENERATE} answered {status}: {why}"
        self.connected = True
        self.answered()
        await self.read_weight_version()
        log.info("vLLM at %s serves %s (context %d) from %s; using %s%s", self.url, self.model, self.max_model_len,
                 self.root, self.route, f" ({self.route_note})" if self.route_note else "")

    def generate_refused(self, status: int, message: str) -> None:
        """The generate route, which the probe found, refused a request (a server behind a router
        without it): this server's requests go by /v1/completions from now on, said once."""
        self.route = protocol.COMPLETIONS
        self.route_note = f"{protocol.GENERATE} refused a request ({status}: {message[:200]!r}); behind a router?"
        log.warning("the vLLM server at %s: %s; using %s from now on", self.url, self.route_note, self.route)

    def checkpoint_source(self) -> str:
        """Where looptrace reads the same tokenizer and template: the Hub id, or the same folder here."""
        root = self.root
        looks_local = root.startswith(("/", ".", "~")) or root.count("/") > 1 or root.endswith(".gguf")
        if looks_local and not Path(root).expanduser().exists():
            raise FileNotFoundError(
                f"the vLLM server at {self.url} loaded {self.model} from {root}, which is not on this machine: "
                f"looptrace reads the tokenizer and chat template from the same checkpoint, so that folder must be "
                f"at the same path here (copy or mount it), or named with --tokenizer PATH, or the server must be "
                f"started from a Hub id")
        return root

    async def probe(self) -> None:
        """Ask /health whether it can serve now."""
        try:
            status, body = await self._call("GET", "/health")
        except Unreachable as exc:
            self.unreachable(str(exc))
            return
        if status == 200:
            self.answered()
            await self.read_weight_version()
        else:
            self.unreachable(f"GET /health answered {status}: {protocol.error_message(body, '')}")

    async def read_weight_version(self) -> None:
        """Its weights' label, from GET /weight_info where it offers it (vLLM's RL routes, in its dev mode; a weight
        update's `finish_weight_update` or `update_weight_version` sets it): asked no more once it says it has none."""
        if not self._weight_info:
            return
        try:
            status, body = await self._call("GET", "/weight_info")
        except Unreachable:
            return
        if status != 200:
            self._weight_info, self.weight_version = status >= 500, None  # 404: not offered; a 5xx: asked again
            return
        self.weight_version = protocol.weight_label(body.get("weight_version") if isinstance(body, dict) else None)

    async def read_metrics(self, load: bool) -> None:
        """Its prefix cache's block size and capacity (for the estimate of what it holds), and with `load` its
        requests running and waiting, from its /metrics."""
        try:
            async with asyncio.timeout(self.timeout):
                async with self.session.get(self.url + "/metrics", headers=self.headers) as response:
                    if response.status != 200:
                        return
                    text = await response.text()
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise Unreachable(f"cannot read the /metrics of the vLLM server at {self.url}: {describe(exc)}") from exc
        counts, block_size, blocks = protocol.metrics_load(text)
        if load and counts is not None:
            self.load.report(*counts)
            self.cost.reported(*counts)
        if block_size:
            self.holdings.sent.resize(block_size, blocks)

    async def _call(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        try:
            async with asyncio.timeout(self.timeout):
                async with self.session.request(method, self.url + path, json=body, headers=self.headers) as response:
                    text = await response.text()
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise Unreachable(f"cannot reach the vLLM server at {self.url}: {describe(exc)}") from exc
        try:
            return response.status, json.loads(text) if text else {}
        except json.JSONDecodeError:
            return response.status, {"detail": text}

    # -- state --

    def answered(self) -> None:
        if not self.reachable and self.connected:
            self.holdings.back()
        self.reachable, self.error = True, None

    def unreachable(self, message: str) -> None:
        if self.reachable:
            self.holdings.left()  # it may be restarting: what it held is unknown until it is back
        self.reachable, self.error = False, message

    @property
    def serving(self) -> bool:
        """Whether requests go to it now."""
        return self.connected and self.reachable

    def health(self) -> dict:
        body = {"url": self.url, "server": self.name, "model": self.model, "route": self.route,
                "reachable": self.reachable, "serving": self.serving, "requests_running": self.running}
        if self.route_note:
            body["route_note"] = self.route_note
        if self.weight_version is not None:
            body["weight_version"] = self.weight_version
        if self.error:
            body["error"] = self.error
        body.update(self.holdings.health())
        body["cost"] = self.cost.health()
        return body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _choose(cards: list[dict], wanted: str | None, url: str) -> dict:
    if not cards:
        raise RuntimeError(f"the vLLM server at {url} serves no model")
    if wanted is None:
        return cards[0]
    for card in cards:
        if wanted in (card.get("id"), card.get("root")):
            return card
    served = ", ".join(f"{c.get('id')} (from {c.get('root')})" for c in cards)
    raise RuntimeError(f"the vLLM server at {url} serves {served}, not {wanted}: name one of those, or leave MODEL "
                       f"out to use what it serves")


def describe(exc: BaseException) -> str:
    """An aiohttp failure in a few words a person can act on."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the connection closed before the response was complete"
    os_error = getattr(exc, "os_error", None)
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused"
    return str(exc) or "the connection failed"  # never the class's name: a person reads this
