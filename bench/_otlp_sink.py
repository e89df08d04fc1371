"""An OTLP/HTTP trace receiver that only counts what it is sent, for the relay benchmark.

    python bench/_otlp_sink.py PORT

POST /v1/traces takes an ExportTraceServiceRequest (protobuf, what the SDK's OTLP/HTTP exporter
sends), answers 200 with an empty ExportTraceServiceResponse, and counts the requests, the spans and
the spans by name; GET /counts returns those counts as JSON. It runs in a process of its own so that
parsing the exports costs the benchmark's client nothing, and so that a proxy's OpenTelemetry
callback can be shown to have really exported (a count of zero fails the benchmark).
"""

from __future__ import annotations

import collections
import sys

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def app() -> web.Application:
    counts = {"requests": 0, "spans": 0, "bytes": 0, "names": collections.Counter()}

    async def traces(request: web.Request) -> web.Response:
        data = await request.read()
        export = ExportTraceServiceRequest()
        export.ParseFromString(data)
        counts["requests"] += 1
        counts["bytes"] += len(data)
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    counts["spans"] += 1
                    counts["names"][span.name] += 1
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def report(request: web.Request) -> web.Response:
        return web.json_response(counts)

    application = web.Application(client_max_size=64 * 1024**2)
    application.router.add_post("/v1/traces", traces)
    application.router.add_get("/counts", report)
    return application


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
