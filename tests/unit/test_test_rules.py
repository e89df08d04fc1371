"""Rules the tests keep, read from their source: a wait goes through tests/support/waiting.py (one poll,
with a deadline, that says what it awaited), and an install that breaks fails instead of skipping.

Each rule is a check on the syntax tree, run over every module under tests/ and, to show it can fail,
over a snippet of the kind it forbids."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
WAITING = TESTS / "support" / "waiting.py"
POLL_HELPER_NAMES = ("wait_for", "until", "wait_until")  # and any wait_for_… / until_…


def modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p != WAITING and ".venv" not in p.parts)


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def is_call(node: ast.AST, *names: str) -> bool:
    """A call of `names` (the last part: `time.monotonic()` and `monotonic()` alike)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in names


def own_nodes(nodes: list[ast.AST]):
    """Every node below `nodes`, not entering functions defined there (their loops are their own)."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node)
                     if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def deadline_loops(tree: ast.Module) -> list[int]:
    """Lines of `while` loops that poll against the clock: one that compares `time.monotonic()` and
    sleeps, or compares it with a deadline taken as `time.monotonic() + …`. (A loop that only looks at
    the clock, a relay timing out an idle connection, is not a wait.)"""
    deadlines = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add)
                 and any(is_call(n, "monotonic") for n in ast.walk(node.value))
                 for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.While):
            continue
        inside = list(own_nodes([loop.test, *loop.body]))
        clocked = [c for c in inside if isinstance(c, ast.Compare)
                   and any(is_call(n, "monotonic") for n in ast.walk(c))]
        sleeps = any(is_call(n, "sleep") for n in inside)
        against_deadline = any(isinstance(n, ast.Name) and n.id in deadlines for c in clocked for n in ast.walk(c))
        if clocked and (sleeps or against_deadline):
            found.append(loop.lineno)
    return found


def poll_helpers(tree: ast.Module) -> list[str]:
    """Functions (not methods: a support class's own waits, built on waiting.py, are its interface)
    named as a private poll helper."""
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    return [f"{f.name} (line {f.lineno})" for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(f) not in methods
            and (f.name in POLL_HELPER_NAMES or f.name.startswith(("wait_for_", "until_")))]


ABSENT = ("Missing", "Unavailable")  # exception classes that say a prerequisite is not on this machine


def skipped_installs(tree: ast.Module) -> list[int]:
    """Lines of `pytest.skip` in an `except` whose `try` imports or installs something (an import, a
    call of `*install*` or of a builder of an environment's Python, `*_python()`), unless the handler
    catches only the classes that say a prerequisite is absent (MissingShared, postgres.Unavailable):
    a broken install then fails the test rather than hiding it."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        tried = list(own_nodes(node.body))
        installs = any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tried) or any(
            isinstance(n, ast.Call) and (name := _called(n)) and ("install" in name or name.endswith("_python"))
            for n in tried)
        if not installs:
            continue
        for handler in node.handlers:
            caught = _names(handler.type)
            if caught and all(c.startswith(ABSENT) for c in caught):
                continue
            found += [n.lineno for n in own_nodes(handler.body) if is_call(n, "skip")]
    return found


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _names(caught: ast.AST | None) -> list[str]:
    """The class names an `except` catches ([] for a bare one: it catches everything)."""
    if caught is None:
        return []
    items = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return [i.attr if isinstance(i, ast.Attribute) else getattr(i, "id", "") for i in items]


RULES = {"a deadline loop of its own (use waiting.wait_until)": deadline_loops,
         "a private poll helper (use waiting.wait_until)": poll_helpers,
         "a skip on an install failure (a broken install must fail)": skipped_installs}


@pytest.mark.parametrize("rule", RULES)
def test_the_tests_keep_the_rule(rule):
    check = RULES[rule]
    broken = {str(p.relative_to(TESTS)): found for p in modules() if (found := check(parsed(p)))}
    assert not broken, f"{rule}: {broken}"


# What each rule forbids, as the tests wrote it before waiting.py was theirs: the checks find it.
FORBIDDEN = {
    deadline_loops: '''
def stored(app):
    deadline = time.monotonic() + 10
    while True:
        found = app.get()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)

def quiet(vllm):
    left = time.monotonic()
    while vllm.running() and time.monotonic() - left < 5:
        time.sleep(0.1)

class Client:
    def call(self, number):
        deadline = time.monotonic() + 60
        while number not in self.answers:
            if time.monotonic() > deadline:
                raise TimeoutError()
            self.pump(deadline)
''',
    poll_helpers: '''
def wait_for(check, timeout=20):
    pass

async def until(check):
    pass

def wait_for_session(server, steps):
    pass
''',
    skipped_installs: '''
def test_tinker():
    try:
        python = _tinker_python()
    except RuntimeError as exc:
        pytest.skip(f"tinker does not install here: {exc}")

def test_import():
    try:
        import verifiers
    except Exception:
        pytest.skip("no verifiers")

def test_npm():
    try:
        installed = clients.install()
    except OSError as exc:
        pytest.skip(str(exc))
''',
}

ALLOWED = {
    deadline_loops: '''
async def relay(reader, idle):
    last = []
    while data := await reader.read(65536):
        if last and time.monotonic() - last[0] >= idle:
            break
        last[:] = [time.monotonic()]

def fake_clock():
    later = time.monotonic() + 1
    return later
''',
    poll_helpers: '''
class Prometheus:
    def wait_for(self, promql):
        return waiting.wait_until(lambda: self.query(promql), 60)
''',
    skipped_installs: '''
def test_shared():
    try:
        checkpoint = tiny_gemma4.gemma4_checkpoint()
    except (MissingShared, MissingPackage) as exc:
        pytest.skip(str(exc))

def test_npm():
    try:
        installed = clients.install()
    except clients.MissingNpm as exc:
        pytest.skip(str(exc))
''',
}


@pytest.mark.parametrize("check", list(FORBIDDEN), ids=lambda c: c.__name__)
def test_each_rule_finds_what_it_forbids(check):
    assert len(check(ast.parse(FORBIDDEN[check]))) == 3


@pytest.mark.parametrize("check", list(ALLOWED), ids=lambda c: c.__name__)
def test_each_rule_lets_pass_what_is_not_a_wait_or_an_install(check):
    assert check(ast.parse(ALLOWED[check])) == []
