"""Which vLLM server takes a request, and what the choice knows of each: the --routing policies and the receipt each
choice leaves (policies.py), a server's price in seconds (cost.py) and its load (load.py), where each conversation's
requests went (conversations.py), and what each server's prefix cache holds (kv_index.py: a prompt's blocks as keys,
block_keys.py; a hybrid model's cache groups, kv_groups.py; vLLM's KV events read into it, kv_events.py).

The pool of servers (../pool.py) asks; nothing here talks to a server. kv_events.py is not imported here: it needs
ZeroMQ and msgpack (the vllm extra), and is imported where a server publishes its events.
"""

from .conversations import Conversations
from .cost import Price, ServerCost
from .kv_index import Holdings, PromptBlocks, SharedPrefixes
from .load import Load
from .policies import LOAD_SECONDS, POLICIES, USES_LOAD, Route, choose

__all__ = ["LOAD_SECONDS", "POLICIES", "USES_LOAD", "Conversations", "Holdings", "Load", "Price", "PromptBlocks",
           "Route", "ServerCost", "SharedPrefixes", "choose"]
