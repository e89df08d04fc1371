"""The Responses API: a response's run over HTTP (http.py) or a WebSocket (websocket.py), its request
(request.py) and the fields a response repeats (fields.py), its answer and event stream (stream.py),
stored responses (store.py) and running ones (running.py), the routes on a response (input_items.py,
input_tokens.py, cancel.py), and compaction (compaction/)."""
