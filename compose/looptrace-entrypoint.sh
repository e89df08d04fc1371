#!/bin/sh
# `looptrace serve ARGS`, with the backend chosen for the compose stack. Compose cannot change a
# service's command by profile, but the `vllm` service exists, and its name resolves, only under
# `--profile gpu`: then looptrace forwards to it; otherwise it decodes here (the local backend).
# LOOPTRACE_VLLM_URL names other vLLM servers instead: one URL, or several separated by spaces or
# commas (all serving the model), each passed as --vllm-url.
set -eu

vllm_host="${VLLM_HOST:-vllm}"
if [ -n "${LOOPTRACE_VLLM_URL:-}" ]; then
    urls=""
    for url in $(printf '%s' "$LOOPTRACE_VLLM_URL" | tr ',' ' '); do
        urls="$urls --vllm-url $url"
    done
    # shellcheck disable=SC2086  # split on purpose: one --vllm-url per URL (URLs hold no spaces)
    set -- --backend vllm $urls "$@"
elif getent hosts "$vllm_host" >/dev/null 2>&1; then
    set -- --backend vllm --vllm-url "http://$vllm_host:${VLLM_INTERNAL_PORT:-8000}" "$@"
fi
echo "looptrace serve $*" >&2
exec looptrace serve "$@"
