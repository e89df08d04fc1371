"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from .runtime import Runtime
    from .settings import Settings
    from .telemetry import Telemetry

RUNTIME: web.AppKey["Runtime"] = web.AppKey("runtime")
SETTINGS: web.AppKey["Settings"] = web.AppKey("settings")
TELEMETRY: web.AppKey["Telemetry"] = web.AppKey("telemetry")
