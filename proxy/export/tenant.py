"""`looptrace export --tenant T`: the store as tenant T's keys see it, for the export's readers.

The export reads the store through three queries (a session, a trace, the session list); each takes a
tenant (trace_store/queries.py), and this passes T to every one, so a session, a trace or a listed
session of another tenant is as absent as one never stored: nothing of it is exported."""

from __future__ import annotations


class TenantView:
    """The read side of a store, filtered to one tenant's records."""

    def __init__(self, store, tenant: str) -> None:
        self._store, self.tenant = store, tenant

    def session(self, key: str, offset: int = 0, limit: int | None = None) -> dict | None:
        return self._store.session(key, offset, limit, tenant=self.tenant)

    def get_trace(self, trace_id: str) -> dict | None:
        return self._store.get_trace(trace_id, tenant=self.tenant)

    def list_sessions(self, **query) -> dict:
        return self._store.list_sessions(**query, tenant=self.tenant)

    def __getattr__(self, name: str):
        # Any other read would not be filtered: refused, so that a new one is made to take the tenant.
        raise AttributeError(f"{name}: not read by tenant ({type(self).__name__} filters session, get_trace "
                             "and list_sessions)")
