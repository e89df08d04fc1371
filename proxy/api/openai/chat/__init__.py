"""Chat Completions: the route (completions.py), its request (request.py) and its answer, whole or
streamed (response.py)."""
