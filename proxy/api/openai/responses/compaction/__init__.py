"""Compaction on the Responses API: what a request asks and how its compaction items are read
(plan.py), compactions run (run.py), the answer that carries one (answer.py), and where the summaries
are kept (summaries.py)."""
