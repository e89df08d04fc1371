"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from aiohttp import web

from ..engine.runtime import Runtime
from ..observe.telemetry import Telemetry
from ..settings import Settings
from .openai.response_store import ResponseStore

RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
TELEMETRY: web.AppKey[Telemetry] = web.AppKey("telemetry", Telemetry)
RESPONSE_STORE: web.AppKey[ResponseStore] = web.AppKey("response_store", ResponseStore)
