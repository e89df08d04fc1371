"""The Gemini API (Gemini CLI, the google-genai SDK): its routes, and its error shape for them.

Under /v1beta (Gemini CLI's, and the API's own reference) and /v1 (the google-genai SDK's default since
3.0); the model list only under /v1beta, as GET /v1/models is the OpenAI API's."""

from __future__ import annotations

from aiohttp import web

from ..clients import ROLLOUT_PREFIX
from ..errors import error_shape
from ..route import Route, Scope
from .errors import google_body
from .generate import count_tokens, generate_content, stream_generate_content
from .models import get_model, list_models

VERSIONS = ("/v1beta", "/v1")
GENERATING = tuple(
    Route("POST", f"{version}/models/{{model}}:{action}", handler, Scope.INFER, rollout=True)
    for version in VERSIONS
    for action, handler in (("generateContent", generate_content), ("streamGenerateContent", stream_generate_content),
                            ("countTokens", count_tokens)))
ROUTES = (
    *GENERATING,
    Route("GET", "/v1beta/models", list_models, Scope.INFER, rollout=True),
    Route("GET", "/v1beta/models/{model}", get_model, Scope.INFER, rollout=True),
)


def setup(app: web.Application) -> None:
    for prefix in ("", ROLLOUT_PREFIX):
        error_shape(app, prefix + "/v1beta", google_body)
        for route in GENERATING:  # under /v1 its own paths only: the rest of /v1 is the OpenAI API's
            if not route.path.startswith("/v1beta/"):
                error_shape(app, prefix + route.path, google_body)
