"""Running one request, whatever API it came from: the served model, rendering, decoding, parsing.

Knows nothing of HTTP: it refuses with engine errors (errors.py) that the API maps to status codes.
"""
