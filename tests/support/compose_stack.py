"""compose/ read as `docker compose` reads it, for the compose tests (tests/unit/test_compose.py, and
tests/integration/test_compose_schema.py, which runs the schema check, the entrypoint and promtool): Compose's
variable substitution, its merge of a second -f file, and the parts of a service the tests look at.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
TWO_VLLM_FILE = COMPOSE_DIR / "two-vllm.yaml"  # added with a second -f: two vLLM servers behind looptrace
POSTGRES_FILE = COMPOSE_DIR / "postgres.yaml"  # added with a second -f: the trace store in PostgreSQL, workers


def raw_stack() -> dict:
    """The compose file as written, variables and all."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def two_vllm_stack(raw: dict) -> dict:
    """compose.yaml with two-vllm.yaml merged over it, as `docker compose -f ... -f ...` reads it with no
    variables set."""
    return interpolate(merged(raw, yaml.safe_load(TWO_VLLM_FILE.read_text())), {})


def postgres_stack(raw: dict, env: dict[str, str]) -> dict:
    """compose.yaml with postgres.yaml merged over it, read with these variables set."""
    return interpolate(merged(raw, yaml.safe_load(POSTGRES_FILE.read_text())), env)


_VARIABLE = re.compile(r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
                       r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: dict[str, str]):
    """Compose's variable substitution (`${X}`, `${X:-default}`, `${X-default}`, `${X:?}`, `$$`)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("plain")
        op, arg = match.group("op"), match.group("arg") or ""
        is_set, current = name in env, env.get(name, "")
        if op in (":-", "-"):
            return current if (current if op == ":-" else is_set) else arg
        if op in (":?", "?"):
            if not (current if op == ":?" else is_set):
                raise KeyError(f"${{{name}}} is required: {arg}")
            return current
        if op in (":+", "+"):
            return arg if (current if op == ":+" else is_set) else ""
        return current

    return _VARIABLE.sub(one, value)


def command_words(command) -> list[str]:
    """A service's command as compose runs it: a string is split the way a shell would."""
    return shlex.split(command) if isinstance(command, str) else list(command)


def option(words: list[str], name: str) -> str:
    assert name in words, (name, words)
    return words[words.index(name) + 1]


def port_mappings(service: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port."""
    found = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            found.append((entry.get("host_ip", ""), str(entry.get("published", "")), str(entry["target"])))
            continue
        parts = str(entry).rsplit(":", 2)
        found.append(tuple(parts) if len(parts) == 3 else ("", *(["", *parts][-2:])))
    return found


def mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of each volume entry, short or long syntax."""
    found = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            found.append((entry.get("source", ""), entry["target"]))
        else:
            source, target = str(entry).split(":")[:2]
            found.append((source, target))
    return found


def is_path(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def merged(base: dict, override: dict) -> dict:
    """`docker compose -f base -f override` for what the override holds: mappings merge key by key,
    and anything else (a command, a list) is replaced, as Compose does for these keys."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
