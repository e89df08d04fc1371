"""looptrace's own routes, which run token ids as they are: a stored trace forked from one of its
tokens (fork.py), a given answer scored (score.py), a prompt decoded afresh (generate.py); what they
share (stored_run.py)."""

from .routes import ROUTES, setup

__all__ = ["ROUTES", "setup"]
