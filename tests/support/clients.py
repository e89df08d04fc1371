"""The real agent clients (codex, pi, Claude Code, opencode, qwen-code), installed from npm once per
cache and run in isolated homes, with nothing that calls elsewhere than looptrace.

`python tests/support/clients.py` installs them (CI does this before the tests); the tests install them on
first use too. They land in `<test cache>/npm-clients-<key>` (`npm_packages`, which installs the other
harnesses' npm programs too), built in a temporary folder under a file lock and renamed into place.

`RecordingProxy` sits between a client and looptrace and keeps every request body the client sent,
so a test can assert on exactly what reached the server (a tool result, say) without the server
having to log anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_cache

# The versions ../shared/clients/README.md was recorded with; bump both here and re-run the client tests.
CODEX = "@openai/codex@0.171.0"
PI = "@mariozechner/pi-coding-agent@0.73.1"
# Claude Code (a native binary inside the npm package), opencode (likewise) and qwen-code.
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.332"
OPENCODE = "opencode-ai@1.18.33"
QWEN_CODE = "@qwen-code/qwen-code@0.24.4"
# opencode installs this into its configuration folder on first start, from the npm registry: it is
# installed here once instead, and each run's home links to it (opencode then fetches nothing).
OPENCODE_PLUGIN = "@opencode-ai/plugin@" + OPENCODE.rsplit("@", 1)[1]
NPM_CLIENTS = (CODEX, PI, CLAUDE_CODE, OPENCODE, QWEN_CODE)
API_KEY_ENV = "LOOPTRACE_API_KEY"


class MissingNpm(RuntimeError):
    """npm is not installed, so the clients cannot be."""


@dataclass(frozen=True)
class Clients:
    codex: Path
    pi: Path
    claude: Path
    opencode: Path
    qwen: Path
    opencode_config: Path  # a configuration folder with opencode's plugin installed


def npm_packages(kind: str, packages: tuple[str, ...], also: dict[str, tuple[str, ...]] | None = None) -> Path:
    """A folder with `packages` installed from npm (their programs in node_modules/.bin), and each of
    `also`'s subfolders with its own, built once per cache (build_cache.cached: a temporary folder under
    a file lock, renamed into place). Every npm-installed program of the tests comes through here."""
    npm = shutil.which("npm")
    if npm is None:
        raise MissingNpm(f"npm is not installed: the tests need it to install {', '.join(packages)}")
    prefixes = {"": packages, **(also or {})}

    def build(out: Path) -> dict:
        for sub, wanted in prefixes.items():
            done = subprocess.run([npm, "install", "--prefix", str(out / sub), "--no-audit", "--no-fund",
                                   "--loglevel=error", *wanted], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=1200)
            if done.returncode != 0:
                raise RuntimeError(f"npm install {' '.join(wanted)} failed ({done.returncode}):\n{done.stdout[-4000:]}")
        return {}

    return build_cache.cached(kind, {"packages": {sub or ".": list(w) for sub, w in prefixes.items()}}, build)


def install() -> Clients:
    final = npm_packages("npm-clients", NPM_CLIENTS, {"opencode-config": (OPENCODE_PLUGIN,)})
    bin_dir = final / "node_modules" / ".bin"
    return Clients(codex=bin_dir / "codex", pi=bin_dir / "pi", claude=bin_dir / "claude",
                   opencode=bin_dir / "opencode", qwen=bin_dir / "qwen", opencode_config=final / "opencode-config")


# -- running them --

def client_env(home: Path, api_key: str, **extra: str) -> dict:
    """A bare environment: nothing of the machine's own configuration or keys reaches the client."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            API_KEY_ENV: api_key, **extra}


def codex_home(home: Path, base_url: str, model: str, catalog: Path | None = None, *, name: str | None = "looptrace",
               settings: dict | None = None, provider: dict | None = None) -> Path:
    """codex's config: a custom provider called `name` (docs/clients.md's is "looptrace"; one named
    "OpenAI" or "Azure" compacts remotely), or with `name` None the built-in `openai` provider pointed at
    `base_url` (`openai_base_url`; the key in OPENAI_API_KEY). `settings`: more top-level keys; `provider`:
    more keys of the custom provider's table (`supports_websockets`)."""
    codex = home / ".codex"
    codex.mkdir(parents=True, exist_ok=True)
    lines = [f'model = "{model}"']
    lines += [f'openai_base_url = "{base_url}"'] if name is None else ['model_provider = "looptrace"']
    if catalog is not None:
        lines.append(f'model_catalog_json = "{catalog}"')
    lines += [f"{key} = {json.dumps(value)}" for key, value in (settings or {}).items()]
    if name is not None:
        lines += ["", "[model_providers.looptrace]", f'name = "{name}"', f'base_url = "{base_url}"',
                  f'env_key = "{API_KEY_ENV}"', 'wire_api = "responses"', "request_max_retries = 0",
                  "stream_max_retries = 0"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in (provider or {}).items()]
    (codex / "config.toml").write_text("\n".join(lines) + "\n")
    return codex


def codex_catalog(path: Path, model: str) -> Path:
    """shared/clients' model catalog with its one entry renamed to `model`: codex then offers apply_patch."""
    catalog = json.loads((build_cache.shared_dir() / "clients" / "codex-model-catalog.json").read_text())
    for entry in catalog["models"]:
        entry["slug"] = model
    path.write_text(json.dumps(catalog))
    return path


def run_codex(clients: Clients, home: Path, workdir: Path, api_key: str, prompt: str, *args: str,
              timeout: float = 60) -> subprocess.CompletedProcess:
    command = [str(clients.codex), "exec", "--skip-git-repo-check", "--ephemeral", "-C", str(workdir), *args, prompt]
    # OPENAI_API_KEY: the built-in provider's key (codex_home with name None); the others read API_KEY_ENV.
    env = client_env(home, api_key, CODEX_HOME=str(home / ".codex"), OPENAI_API_KEY=api_key)
    return subprocess.run(command, env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def pi_home(home: Path, base_url: str, model: str, *, max_tokens: int = 4096, context: int = 32768,
            images: bool = False) -> Path:
    """`images`: the model entry declares image input (pi strips images otherwise)."""
    agent = home / ".pi" / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    entry = {"id": model, "contextWindow": context, "maxTokens": max_tokens}
    if images:
        entry["input"] = ["text", "image"]
    provider = {"baseUrl": base_url, "api": "openai-completions", "apiKey": API_KEY_ENV,
                "compat": {"sendSessionAffinityHeaders": True}, "models": [entry]}
    (agent / "models.json").write_text(json.dumps({"providers": {"looptrace": provider}}))
    return agent


def run_pi(clients: Clients, home: Path, workdir: Path, api_key: str, model: str, prompt: str,
           timeout: float = 60) -> subprocess.CompletedProcess:
    command = [str(clients.pi), "--provider", "looptrace", "--model", model, "--no-session", "--mode", "json", prompt]
    env = client_env(home, api_key, PI_CODING_AGENT_DIR=str(home / ".pi" / "agent"), PI_OFFLINE="1")
    return subprocess.run(command, env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


# Claude Code, pointed at looptrace: what docs/clients.md's setup says, so the tests run what users paste.
# CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC turns off its telemetry, error reports, auto-updates and
# feedback surveys (without it, it looks up api.anthropic.com); CLAUDE_CODE_ATTRIBUTION_HEADER=0
# leaves out the billing line it puts first in the system prompt.
CLAUDE_SETTINGS = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}


def claude_env(home: Path, url: str, api_key: str, model: str, *, context: int = 32768, max_tokens: int = 4096,
               **extra: str) -> dict:
    """`url`: the server's root (Claude Code adds /v1/messages). Every model it would pick (its
    background "haiku" tasks too) is the one served; its context and answer fit the model's."""
    return client_env(home, api_key, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=api_key,
                      ANTHROPIC_DEFAULT_HAIKU_MODEL=model, ANTHROPIC_DEFAULT_SONNET_MODEL=model,
                      ANTHROPIC_DEFAULT_OPUS_MODEL=model, CLAUDE_CODE_MAX_CONTEXT_TOKENS=str(context),
                      CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(max_tokens), **CLAUDE_SETTINGS, **extra)


def run_claude(clients: Clients, env: dict, workdir: Path, model: str, prompt: str, *args: str,
               timeout: float = 90, connections: Path | None = None) -> subprocess.CompletedProcess:
    """`claude -p` (print mode; JSON result on stdout). With `connections`, run under strace, which
    writes every socket connect to that file (see `connected_to`)."""
    command = [str(clients.claude), "-p", prompt, "--model", model, "--output-format", "json", *args]
    return _run(command, env, workdir, timeout, connections)


def opencode_home(home: Path, clients: Clients, base_url: str, model: str) -> Path:
    """opencode's configuration: looptrace as an OpenAI-compatible provider, and the plugin it would
    otherwise install from npm on first start, linked in."""
    config = home / ".config" / "opencode"
    config.mkdir(parents=True, exist_ok=True)
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "looptrace",
                "options": {"baseURL": base_url, "apiKey": "{env:" + API_KEY_ENV + "}"},
                "models": {model: {"name": model}}}
    (config / "opencode.json").write_text(json.dumps({"provider": {"looptrace": provider},
                                                      "model": f"looptrace/{model}"}))
    for name in ("package.json", "package-lock.json"):
        shutil.copy(clients.opencode_config / name, config / name)
    (config / "node_modules").symlink_to(clients.opencode_config / "node_modules")
    return config


OPENCODE_SETTINGS = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
                     "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"}


def run_opencode(clients: Clients, home: Path, workdir: Path, api_key: str, prompt: str, *args: str,
                 timeout: float = 90, connections: Path | None = None) -> subprocess.CompletedProcess:
    """`opencode run` with JSON events on stdout; `--title` so that it asks the model for no title
    (a request of its own, which would take a replayed answer meant for the agent)."""
    command = [str(clients.opencode), "run", "--pure", "--title", "looptrace test", "--format", "json", *args, prompt]
    return _run(command, client_env(home, api_key, **OPENCODE_SETTINGS), workdir, timeout, connections)


def qwen_home(home: Path) -> Path:
    """qwen-code's settings: no usage statistics (it sends them to Alibaba Cloud otherwise), and no
    memory extraction after each turn (a request of its own, which would take a replayed answer)."""
    qwen = home / ".qwen"
    qwen.mkdir(parents=True, exist_ok=True)
    (qwen / "settings.json").write_text(json.dumps({"privacy": {"usageStatisticsEnabled": False},
                                                    "memory": {"enableManagedAutoMemory": False}}))
    return qwen


def run_qwen(clients: Clients, home: Path, workdir: Path, base_url: str, api_key: str, model: str, prompt: str,
             *args: str, timeout: float = 90, connections: Path | None = None) -> subprocess.CompletedProcess:
    """qwen-code's one-shot mode (the prompt first: its array options would take it), JSON on stdout."""
    command = [str(clients.qwen), prompt, "--auth-type", "openai", "--openai-base-url", base_url, "--openai-api-key",
               api_key, "-m", model, "-o", "json", *args]
    return _run(command, client_env(home, api_key), workdir, timeout, connections)


def _run(command: list[str], env: dict, workdir: Path, timeout: float,
         connections: Path | None) -> subprocess.CompletedProcess:
    if connections is not None:
        command = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(connections), *command]
    return subprocess.run(command, env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def connected_to(log: Path) -> set[str]:
    """The IP addresses and ports a traced client connected to (or tried to): `host:port`, DNS
    servers included. Local sockets (AF_UNIX, netlink) are not network."""
    import re

    found = set()
    for line in log.read_text().splitlines():
        match = re.search(r'sin6?_port=htons\((\d+)\).*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")',
                          line)
        if match:
            found.add(f"{match.group(2) or match.group(3)}:{match.group(1)}")
    return found


def json_lines(text: str) -> list[dict]:
    """The JSON objects of a client's line-per-event output (anything else on stdout is skipped)."""
    out = []
    for line in text.split("\n"):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


# -- seeing what the client sent --

class RecordingProxy:
    """A reverse proxy on 127.0.0.1 in its own thread: forwards every request to `upstream`, streams
    the answer back untouched, and keeps (method, path, headers, JSON body) of each request."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def __enter__(self) -> "RecordingProxy":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the recording proxy did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def bodies(self, path: str) -> list[dict]:
        return [r["body"] for r in self.requests if r["path"] == path]

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, web

        self._stop = asyncio.Event()
        session = ClientSession(timeout=ClientTimeout(total=None), auto_decompress=False)

        async def forward(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode(errors="replace")
            self.requests.append({"method": request.method, "path": request.path,
                                  "headers": dict(request.headers), "body": body})
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            async with session.request(request.method, self.upstream + request.path_qs, data=raw,
                                       headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")})
                await response.prepare(request)
                try:
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                except ConnectionResetError:
                    pass  # the client hung up once it had what it needed
                return response

        app = web.Application(client_max_size=256 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        await session.close()
        await runner.cleanup()


if __name__ == "__main__":
    installed = install()
    for name in ("codex", "pi", "claude", "opencode", "qwen"):
        print(f"{name}: {getattr(installed, name)}")
