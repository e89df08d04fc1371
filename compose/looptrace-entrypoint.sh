#!/bin/sh
# `looptrace serve ARGS`, with the backend chosen for the compose stack. Compose cannot change a
# service's command by profile, but the `vllm` service exists, and its name resolves, only under
# `--profile gpu`: then looptrace forwards to it; otherwise it decodes here (the local backend).
# LOOPTRACE_VLLM_URL names other vLLM servers instead: one URL, or several separated by spaces or
# commas (all serving the model), each passed as --vllm-url.
set -eu

vllm_host="${VLLM_HOST:-vllm}"
relay=""
if [ -n "${LOOPTRACE_VLLM_URL:-}" ]; then
    urls=""
    for url in $(printf '%s' "$LOOPTRACE_VLLM_URL" | tr ',' ' '); do
        urls="$urls --vllm-url $url"
    done
    # shellcheck disable=SC2086  # split on purpose: one --vllm-url per URL (URLs hold no spaces)
    set -- --backend vllm $urls "$@"
    relay=yes
elif getent hosts "$vllm_host" >/dev/null 2>&1; then
    set -- --backend vllm --vllm-url "http://$vllm_host:${VLLM_INTERNAL_PORT:-8000}" "$@"
    relay=yes
fi
# compose/postgres.yaml: the shared store (the last --trace-db given is the one taken), and workers,
# which only a relay may have (the local backend holds the model in its one process).
if [ -n "${LOOPTRACE_TRACE_DB:-}" ]; then
    set -- "$@" --trace-db "$LOOPTRACE_TRACE_DB"
fi
if [ -n "${LOOPTRACE_WORKERS:-}" ]; then
    if [ -n "$relay" ]; then
        set -- "$@" --workers "$LOOPTRACE_WORKERS"
    else
        echo "LOOPTRACE_WORKERS: one process, as looptrace decodes here (workers need vLLM: --profile gpu)" >&2
    fi
fi
echo "looptrace serve $*" >&2
exec looptrace serve "$@"
