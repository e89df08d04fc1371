"""The MCP server itself: the SDK's MCPServer with the tools of tools.py and diffs.py declared (their
arguments, bounds and descriptions, which the SDK checks and lists), each reading the store as the
call's tenant on a thread of its own, off the SDK's event loop.

Imported only once the `mcp` SDK is known to be installed (server.py).
"""

from __future__ import annotations

import functools
from typing import Annotated, Callable

import anyio
from mcp.server import MCPServer
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from . import diffs, tools
from .access import READ, tenant_of
from .text import Refused

INSTRUCTIONS = ("Read-only access to looptrace's recorded agent sessions: list_sessions, then get_session for what "
                "each step added and answered, get_step for one step's exact prompt and least likely tokens, "
                "diff_steps for how two prompts differ, search for text across sessions. Results are bounded: long "
                "texts are elided, with a count of what was left out.")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

Limit = Annotated[int, Field(ge=1, le=tools.LIST_MAX, description="sessions at most")]
Key = Annotated[str, Field(description="a session's key, as list_sessions shows it")]
Step = Annotated[int, Field(ge=0, le=1 << 31, description="a step's number in its session, from 1")]
Offset = Annotated[int, Field(ge=0, le=1 << 31, description="steps to skip")]
Steps = Annotated[int, Field(ge=1, le=tools.STEPS_MAX, description="steps shown")]
Since = Annotated[str, Field(description="active since: Unix seconds or ISO 8601")]
Words = Annotated[str, Field(description="a conversation id or words a step read or wrote")]
Found = Annotated[int, Field(ge=1, le=50, description="sessions at most")]
TraceId = Annotated[str, Field(description="a step's trace id, instead of key and step")]
OtherKey = Annotated[str, Field(description="step b's session, where it is not key's")]


class Reader:
    """Runs a tool's reading of the store as the caller's tenant: --tenant's (or every tenant's) over
    stdio; over HTTP the tenant of the key the request carried (access.py)."""

    def __init__(self, store, tenant: str | None, http: bool) -> None:
        self.store, self.tenant, self.http = store, tenant, http

    def tenant_for(self, ctx: Context) -> str | None:
        if not self.http:
            return self.tenant
        request = ctx.request_context.request
        user = request.scope.get("user") if request is not None else None
        token = getattr(user, "access_token", None)
        if token is None:  # the SDK refuses such a request before it gets here
            raise ToolError("This call carries no key: send 'Authorization: Bearer KEY'.")
        return tenant_of(token, None)

    async def __call__(self, ctx: Context, function: Callable[..., str], **arguments) -> str:
        call = functools.partial(function, self.store, self.tenant_for(ctx), **arguments)
        try:
            return await anyio.to_thread.run_sync(call)
        except Refused as exc:
            raise ToolError(str(exc)) from None


def build(store, tenant: str | None, *, http: bool, verifier=None, host: str = "127.0.0.1", port: int = 0) -> MCPServer:
    """The server over `store`, read as `tenant` over stdio, as each key's tenant over HTTP (`verifier`)."""
    # The SDK asks an issuer of any server that checks tokens; with no resource_server_url it is never
    # advertised (no OAuth metadata is served): keys are made by `looptrace keys`, not by OAuth.
    auth = AuthSettings(issuer_url=f"http://{host}:{port}", resource_server_url=None, required_scopes=[READ]) \
        if http else None
    server = MCPServer("looptrace", instructions=INSTRUCTIONS, token_verifier=verifier, auth=auth, log_level="WARNING")
    declare(server, Reader(store, tenant, http))
    return server


def declare(server: MCPServer, read: Reader) -> None:
    @server.tool(annotations=READ_ONLY)
    async def list_sessions(ctx: Context, model: str = "", client: str = "", since: Since = "", q: Words = "",
                            limit: Limit = 20) -> str:
        """Recent agent sessions, most recently active first: key, client, model, steps, tokens, tool calls,
        errors, agents. Filters as the HTTP API's /v1/sessions."""
        return await read(ctx, tools.list_sessions, model=model, client=client, since=since, q=q, limit=limit)

    @server.tool(annotations=READ_ONLY)
    async def get_session(ctx: Context, key: Key, offset: Offset = 0, limit: Steps = 20) -> str:
        """A session's agents and steps in order: each step's new prompt text (what the turn added), its
        answer and its tool calls (long texts elided with counts)."""
        return await read(ctx, tools.get_session, key=key, offset=offset, limit=limit)

    @server.tool(annotations=READ_ONLY)
    async def get_step(ctx: Context, key: Key = "", step: Step = 0, trace_id: TraceId = "") -> str:
        """One step whole: its exact prompt as the model read it, its answer, its tool calls and the least
        likely tokens it generated (from the recorded logprobs)."""
        return await read(ctx, tools.get_step, key=key, step=step, trace_id=trace_id)

    @server.tool(annotations=READ_ONLY)
    async def search(ctx: Context, q: Words, limit: Found = 10) -> str:
        """Text across sessions: the sessions whose steps read or wrote it, with the steps and a snippet."""
        return await read(ctx, tools.search, q=q, limit=limit)

    @server.tool(annotations=READ_ONLY)
    async def diff_steps(ctx: Context, key: Key, a: Step, b: Step, other_key: OtherKey = "") -> str:
        """Two steps' prompts as a unified diff: what the later prompt added, dropped or rewrote (bounded)."""
        return await read(ctx, diffs.diff_steps, key=key, a=a, b=b, other_key=other_key)
