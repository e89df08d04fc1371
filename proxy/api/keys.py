"""Typed keys for what the aiohttp application holds, for every API (an API's own state keys its own:
openai/responses/store.py's RESPONSE_STORE)."""

from __future__ import annotations

from aiohttp import web

from ..engine.memory import Memory
from ..engine.runtime import Runtime
from ..observe.telemetry import Telemetry
from ..settings import Settings
from .cache_salts import CacheSalts
from .history_sessions import HistorySessions

CACHE_SALTS: web.AppKey[CacheSalts] = web.AppKey("cache_salts", CacheSalts)  # each tenant's prefix-cache salt
HISTORY_SESSIONS: web.AppKey[HistorySessions] = web.AppKey("history_sessions", HistorySessions)  # sessions no header names
MEMORY: web.AppKey[Memory] = web.AppKey("memory", Memory)  # what each conversation's model read and sampled
RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
TELEMETRY: web.AppKey[Telemetry] = web.AppKey("telemetry", Telemetry)
