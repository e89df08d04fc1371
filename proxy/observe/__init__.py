"""Observation: spans, per-request traces and metrics. Watches the engine through its Observer
interface and never changes what it sees."""
