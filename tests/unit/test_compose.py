"""compose/ and the Dockerfile: what `docker compose up` would trip on, checked without Docker.

No Docker engine runs in CI. The compose file is validated against the Compose specification's
schema, the entrypoint script run and the Prometheus config checked by promtool in
tests/integration/test_compose_schema.py (they run programs); here, read in this process, what a schema
cannot say: that names point at things that exist (volumes, configs, services, files,
ports), that nothing listens beyond loopback unless asked, and that the configs beside it (Prometheus,
Tempo, the entrypoint script, the image's build context) agree with it and with each other.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from compose_stack import (
    COMPOSE_DIR,
    ROOT,
    command_words,
    interpolate,
    is_path,
    mounts,
    option,
    port_mappings,
    raw_stack,
    two_vllm_stack,
)

HEALTH_CONDITIONS = {"service_healthy", "service_started", "service_completed_successfully"}



@pytest.fixture(scope="module")
def raw() -> dict:
    return raw_stack()


@pytest.fixture(scope="module")
def stack(raw) -> dict:
    """The compose file as `docker compose up` reads it with no variables set: the defaults."""
    return interpolate(raw, {})


# ---------------------------------------------------------------------------------------------
# The compose file
# ---------------------------------------------------------------------------------------------


def test_named_volumes_and_configs_are_declared_and_used(stack):
    declared_volumes = set(stack.get("volumes") or {})
    declared_configs = set(stack.get("configs") or {})
    used_volumes, used_configs = set(), set()
    for name, service in stack["services"].items():
        for source, target in mounts(service):
            assert source, f"{name}: an anonymous volume at {target} (not kept by name, piles up)"
            if not is_path(source):
                assert source in declared_volumes, f"{name} mounts undeclared volume {source!r}"
                used_volumes.add(source)
        for entry in service.get("configs", []):
            source = entry["source"] if isinstance(entry, dict) else entry
            assert source in declared_configs, f"{name} uses undeclared config {source!r}"
            used_configs.add(source)
    assert used_volumes == declared_volumes, f"declared but unused: {declared_volumes - used_volumes}"
    assert used_configs == declared_configs, f"declared but unused: {declared_configs - used_configs}"


def test_every_mounted_file_exists_in_the_repository(stack):
    for name, config in (stack.get("configs") or {}).items():
        assert (COMPOSE_DIR / config["file"]).is_file(), f"config {name}: {config['file']} is missing"
    for name, service in stack["services"].items():
        for source, _ in mounts(service):
            if is_path(source):
                assert (COMPOSE_DIR / source).exists(), f"{name} mounts {source}, which is not in the repository"
        build = service.get("build")
        if build:
            context = COMPOSE_DIR / build["context"]
            assert context.is_dir() and (context / build.get("dockerfile", "Dockerfile")).is_file(), name


def test_depends_on_names_real_services_with_conditions(stack):
    services = stack["services"]
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on without conditions starts before it is ready"
        for dependency, spec in depends.items():
            assert dependency in services, f"{name} depends on {dependency}, which is no service"
            assert spec.get("condition") in HEALTH_CONDITIONS, (name, dependency, spec)
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck to wait for"
            # A service that always runs may wait for a profiled one only if it is optional.
            if services[dependency].get("profiles") and not service.get("profiles"):
                assert spec.get("required") is False, f"{name} needs {dependency}, which runs only with a profile"


def test_every_service_has_a_healthcheck(stack):
    for name, service in stack["services"].items():
        check = service.get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no healthcheck"
        test = check["test"]
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and test != ["NONE"], (name, test)


def test_published_ports_listen_on_loopback_unless_asked(raw, stack):
    for name, service in stack["services"].items():
        assert service.get("network_mode") != "host", name
        for address, published, _ in port_mappings(service):
            assert address == "127.0.0.1", f"{name} publishes {published} on {address or 'every address'}"
    opted_in = interpolate(raw, {"LOOPTRACE_BIND_ADDRESS": "0.0.0.0"})
    addresses = {address for s in opted_in["services"].values() for address, _, _ in port_mappings(s)}
    assert addresses == {"0.0.0.0"}  # one variable opens every port


def test_images_are_pinned(stack):
    for name, service in stack["services"].items():
        if "build" in service:
            continue
        image = service["image"]
        assert re.search(r":v?\d+\.\d+\.\d+$", image), f"{name}: {image} is not pinned to a release"


def test_vllm_runs_only_under_the_gpu_profile_on_a_gpu(stack):
    services = stack["services"]
    assert services["vllm"]["profiles"] == ["gpu"]
    assert all(not s.get("profiles") for n, s in services.items() if n != "vllm")
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_vllm_serves_the_checkpoint_looptrace_reads(raw):
    # looptrace renders and tokenizes with the checkpoint's own files, so both must name the same
    # model at the same revision, by default and when the user picks another.
    for env in ({}, {"LOOPTRACE_MODEL": "org/other", "LOOPTRACE_MODEL_REVISION": "abc123"}):
        services = interpolate(raw, env)["services"]
        looptrace, vllm = (command_words(services[n]["command"]) for n in ("looptrace", "vllm"))
        assert looptrace[0] == vllm[0] == env.get("LOOPTRACE_MODEL", looptrace[0])
        assert option(looptrace, "--revision") == option(vllm, "--revision")
    revision = option(command_words(interpolate(raw, {})["services"]["vllm"]["command"]), "--revision")
    assert re.fullmatch(r"[0-9a-f]{40}", revision), "the default revision is a commit, not a moving branch"


def test_traces_go_to_tempo_on_the_ports_it_listens_on(stack):
    tempo = yaml.safe_load((COMPOSE_DIR / "tempo.yaml").read_text())
    protocols = tempo["distributor"]["receivers"]["otlp"]["protocols"]
    http_port, grpc_port = (protocols[p]["endpoint"].rsplit(":", 1)[1] for p in ("http", "grpc"))
    looptrace = command_words(stack["services"]["looptrace"]["command"])
    vllm = command_words(stack["services"]["vllm"]["command"])
    assert option(looptrace, "--otlp-endpoint") == f"http://tempo:{http_port}"  # OTLP/HTTP
    assert option(vllm, "--otlp-traces-endpoint") == f"http://tempo:{grpc_port}"  # vLLM's default: gRPC
    for protocol in protocols.values():
        assert protocol["endpoint"].startswith("0.0.0.0:"), "Tempo's default (localhost) is unreachable from others"


def test_looptrace_keeps_its_store_and_cache_on_named_volumes(stack):
    service = stack["services"]["looptrace"]
    volumes = dict(mounts(service))
    trace_db = Path(option(command_words(service["command"]), "--trace-db"))
    assert volumes["traces"] == str(trace_db.parent)
    hf_home = re.search(r"^ENV .*?HF_HOME=(\S+)", (ROOT / "Dockerfile").read_text(), re.S | re.M).group(1)
    assert volumes["hf-cache"] == hf_home
    assert option(command_words(service["command"]), "--port") == port_mappings(service)[0][2]


def test_grafana_reads_the_provisioned_dashboards(stack):
    grafana = stack["services"]["grafana"]
    volumes = {target: source for source, target in mounts(grafana)}
    assert volumes["/etc/grafana/provisioning"].startswith("../grafana/provisioning")
    provider = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/looptrace.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert volumes[path] == "../grafana/dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and (ROOT / "grafana/dashboards" / Path(home).name).is_file()
    sources = yaml.safe_load((ROOT / "grafana/provisioning/datasources/datasources.yaml").read_text())
    for source in sources["datasources"]:
        host = re.match(r"http://([a-z0-9-]+):\d+$", source["url"]).group(1)
        assert host in stack["services"], source["url"]


# ---------------------------------------------------------------------------------------------
# compose/two-vllm.yaml: a second vLLM server, merged over the stack
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_vllm(raw) -> dict:
    return two_vllm_stack(raw)


def test_the_second_vllm_serves_what_the_first_does_on_another_gpu(two_vllm):
    services = two_vllm["services"]
    first, second = services["vllm"], services["vllm-2"]
    assert second["profiles"] == first["profiles"] == ["gpu"]
    assert command_words(second["command"]) == command_words(first["command"])  # same model, revision, flags
    gpus = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in (first, second)]
    assert gpus == [["0"], ["1"]]
    assert second["healthcheck"] == first["healthcheck"] and second["image"] == first["image"]
    for source, _ in mounts(second):
        assert source in two_vllm["volumes"]
    for name in second["depends_on"]:
        assert name in services


# ---------------------------------------------------------------------------------------------
# Prometheus and Tempo
# ---------------------------------------------------------------------------------------------


def test_prometheus_scrapes_the_services_on_their_ports(stack):
    services = stack["services"]
    prometheus = services["prometheus"]
    flags = prometheus["command"]
    assert "--enable-feature=exemplar-storage" in flags  # else looptrace's trace_id exemplars are dropped
    config_path = next(f.split("=", 1)[1] for f in flags if f.startswith("--config.file="))
    assert config_path in {c["target"] for c in prometheus["configs"]}
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    host, port = jobs["looptrace"]["static_configs"][0]["targets"][0].split(":")
    assert host == "looptrace" and port == option(command_words(services["looptrace"]["command"]), "--port")
    vllm_sd = jobs["vllm"]["dns_sd_configs"][0]
    assert vllm_sd["names"][0] == "vllm"  # and vllm-2, from compose/two-vllm.yaml
    assert str(vllm_sd["port"]) == option(command_words(services["vllm"]["command"]), "--port")


def test_tempo_config_raises_the_limits_looptrace_needs(stack):
    tempo = yaml.safe_load((COMPOSE_DIR / "tempo.yaml").read_text())
    defaults = tempo["overrides"]["defaults"]
    # Tempo cuts string attributes at 2 KiB by default: a rendered prompt is hundreds of KB.
    assert tempo["distributor"]["max_attribute_bytes"] >= 1 << 20
    # Tempo refuses traces over 5 MB by default: a long decode with its token events is a few MB.
    max_trace = defaults["global"]["max_bytes_per_trace"]
    assert max_trace >= 20_000_000
    # The limits that carry one trace or one push must hold the largest ones.
    body = tempo["distributor"]["receivers"]["otlp"]["protocols"]["http"]["max_request_body_size"]
    assert body >= max_trace and defaults["ingestion"]["burst_size_bytes"] >= body
    assert tempo["server"]["grpc_server_max_recv_msg_size"] >= max_trace
    assert tempo["server"]["grpc_server_max_send_msg_size"] >= max_trace
    assert tempo["querier"]["frontend_worker"]["grpc_client_config"]["max_send_msg_size"] >= max_trace
    # Its storage is on the named volume, and compose hands it this file.
    service = stack["services"]["tempo"]
    volume_target = dict(mounts(service))["tempo-data"]
    for path in (tempo["storage"]["trace"]["wal"]["path"], tempo["storage"]["trace"]["local"]["path"]):
        assert path.startswith(volume_target + "/")
    config_flag = next(a for a in service["command"] if a.startswith("-config.file="))
    assert config_flag.split("=", 1)[1] in {c["target"] for c in service["configs"]}


# ---------------------------------------------------------------------------------------------
# The image
# ---------------------------------------------------------------------------------------------


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or a folder above it decides."""
    def matches(pattern: str, candidate: str) -> bool:
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        return re.fullmatch(regex.replace(r"\?", "[^/]"), candidate) is not None

    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(matches(pattern, prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [tuple(line.split(None, 1)) for line in lines]


def test_image_is_slim_and_runs_as_a_user():
    instructions = _dockerfile()
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", next(a for i, a in instructions if i == "FROM"))
    users = [a for i, a in instructions if i == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_image_installs_cpu_torch_unless_told_otherwise():
    args = dict(a.split("=", 1) for i, a in _dockerfile() if i == "ARG" and "=" in a)
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    run = " ".join(a for i, a in _dockerfile() if i == "RUN")
    assert '--index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"' in run


def test_image_build_context_holds_what_it_copies():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = []
    for instruction, args in _dockerfile():
        if instruction == "COPY" and "--from" not in args:
            copied += args.split()[:-1]
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not _dockerignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    # `pip install .` needs the folders pyproject.toml maps into the looptrace namespace, and its readme.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["package-dir"].values())
    assert folders | {"pyproject.toml", project["project"]["readme"]} <= set(copied)
    assert _dockerignored(".venv/bin/python", patterns) and _dockerignored(".git/HEAD", patterns)
