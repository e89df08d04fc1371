"""The real application in this process on aiohttp's test server, with the SDK's in-memory exporter
beside its own sinks, so a test sees every span as it ends (tests/unit/test_tracing.py and the tests
that read its spans)."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace.proxy.api.app import create_app
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.settings import Settings
from waiting import wait_until_async


class App:
    """The real application in this process, with an in-memory exporter beside its sinks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.spans = InMemorySpanExporter()

    async def __aenter__(self):
        app = create_app(self.settings)
        self.telemetry = app[TELEMETRY]
        self.telemetry.provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.client = TestClient(TestServer(app))
        await self.client.start_server()
        await wait_until_async(self._healthy, timeout=300, what="/health answering 200")
        return self

    async def _healthy(self) -> bool:
        return (await self.client.get("/health")).status == 200

    async def __aexit__(self, *exc):
        await self.client.close()

    async def chat(self, headers=None, **body):
        body.setdefault("model", "qwen")
        response = await self.client.post("/v1/chat/completions", json=body, headers=headers or {})
        return response.status, await response.json()

    async def stream_text(self, headers=None, **body):
        body.update(model="qwen", stream=True)
        response = await self.client.post("/v1/chat/completions", json=body, headers=headers or {})
        text = await response.text()
        chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

    def tree(self, trace_id: int) -> dict:
        spans = [s for s in self.spans.get_finished_spans() if s.context.trace_id == trace_id]
        return {s.name: s for s in spans}


def run(coroutine):
    return asyncio.run(coroutine)
