"""The trace viewer and the data it reads: traces, sessions, forks, the prompt view, the page."""
