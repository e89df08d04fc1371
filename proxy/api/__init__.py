"""The HTTP API: routes, request parsing, answer formats and errors. The only layer that knows aiohttp.web."""
