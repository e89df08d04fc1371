"""The real agent clients, codex and pi, installed from npm once per cache and run in isolated homes.

`python tests/clients.py` installs them (CI does this before the tests); the tests install them on
first use too. They land in `<test cache>/npm-clients-<versions>`, built in a temporary folder under
a file lock and renamed into place, like the test checkpoints.

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
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_cache

# The versions shared/clients/README.md was recorded with; bump both here and re-run the client tests.
CODEX = "@openai/codex@0.169.0"
PI = "@mariozechner/pi-coding-agent@0.73.1"
API_KEY_ENV = "LOOPTRACE_API_KEY"


class MissingNpm(RuntimeError):
    """npm is not installed, so the clients cannot be."""


@dataclass(frozen=True)
class Clients:
    codex: Path
    pi: Path


def install_dir() -> Path:
    tag = f"{CODEX}-{PI}".replace("@", "").replace("/", "_")
    return build_cache.cache_root() / f"npm-clients-{tag}"


def install() -> Clients:
    final = install_dir()
    clients = Clients(codex=final / "node_modules" / ".bin" / "codex", pi=final / "node_modules" / ".bin" / "pi")
    if clients.codex.exists() and clients.pi.exists():
        return clients
    npm = shutil.which("npm")
    if npm is None:
        raise MissingNpm("npm is not installed: the client tests need it to install codex and pi")
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with build_cache.locked(root / f".{final.name}.lock"):
        if not final.is_dir():
            for stale in root.glob(f".tmp-{final.name}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
            try:
                subprocess.run([npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--loglevel=error",
                                CODEX, PI], check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
                os.chmod(tmp, 0o755)
                os.rename(tmp, final)
            except subprocess.CalledProcessError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise RuntimeError(f"npm install failed:\n{exc.stdout.decode(errors='replace')}") from exc
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return clients


# -- running them --

def client_env(home: Path, api_key: str, **extra: str) -> dict:
    """A bare environment: nothing of the machine's own configuration or keys reaches the client."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            API_KEY_ENV: api_key, **extra}


def codex_home(home: Path, base_url: str, model: str, catalog: Path | None = None) -> Path:
    codex = home / ".codex"
    codex.mkdir(parents=True, exist_ok=True)
    lines = [f'model = "{model}"', 'model_provider = "looptrace"']
    if catalog is not None:
        lines.append(f'model_catalog_json = "{catalog}"')
    lines += ["", "[model_providers.looptrace]", 'name = "looptrace"', f'base_url = "{base_url}"',
              f'env_key = "{API_KEY_ENV}"', 'wire_api = "responses"', "request_max_retries = 0",
              "stream_max_retries = 0"]
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
    env = client_env(home, api_key, CODEX_HOME=str(home / ".codex"))
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
    print(f"codex: {installed.codex}\npi: {installed.pi}")
