# looptrace in a container: `docker build -t looptrace .`, then
#   docker run -p 127.0.0.1:8000:8000 -v looptrace-hf:/home/looptrace/.cache/huggingface \
#     -v looptrace-traces:/data looptrace serve MODEL --host 0.0.0.0 --trace-db /data/traces.sqlite3
# compose/compose.yaml builds and runs it with Prometheus, Tempo, Grafana and (optionally) vLLM.
FROM python:3.11-slim

# CPU torch by default: PyPI's Linux torch wheel pulls several GB of CUDA libraries that a CPU
# image (or one that forwards to vLLM) never uses. For local decoding on a GPU, build with
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cuXYZ (the CUDA build that suits the
# host's driver) and run with --gpus all.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The extras installed: local decodes here (torch); a relay's image (--backend vllm or replay) needs
# none of it: --build-arg EXTRAS=postgres leaves torch out (about 2 GB less).
ARG EXTRAS=local,postgres

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/home/looptrace/.cache/huggingface

# /data (the trace store) and the Hugging Face cache exist and belong to the user, so an empty named
# volume mounted on either starts with that ownership and the non-root user can write it.
RUN useradd --create-home --uid 10001 --user-group looptrace \
    && mkdir -p /data "$HF_HOME" \
    && chown -R looptrace:looptrace /data /home/looptrace

# torch first, in its own layer: it is the largest and changes least.
RUN case ",$EXTRAS," in *,local,*) pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION" ;; esac

WORKDIR /opt/looptrace
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY families ./families
COPY backends ./backends
COPY trace_store ./trace_store
COPY common ./common
# The postgres extra: psycopg, for --trace-db postgresql://… (compose/postgres.yaml).
RUN pip install ".[$EXTRAS]"

USER looptrace
WORKDIR /home/looptrace
EXPOSE 8000
ENTRYPOINT ["looptrace"]
CMD ["serve", "--host", "0.0.0.0", "--trace-db", "/data/traces.sqlite3"]
