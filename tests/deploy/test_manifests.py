"""The Dockerfile, the Helm chart and the KServe manifests, checked offline with the real tools:
hadolint, helm lint and helm template (scripts/deploy-tools.sh installs helm), the rendered
Kubernetes objects against Kubernetes' own schemas (kubernetes-validate), and yamllint.

Custom resources (ServiceMonitor, KServe's ClusterServingRuntime and InferenceService) have no
schema in kubernetes-validate: their pod parts are validated as a real Pod, their own fields
against what the CRDs require, checked here. A missing tool skips on a developer's machine and
fails in CI (CI=true), where scripts/test.sh installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from oceanus.cli import parse_args

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "oceanus"
KSERVE = ROOT / "deploy" / "kserve"
K8S_VERSION = "1.30"

VARIANTS = {
    "url": ["--set", "modelRepository.url=s3://models/repository"],
    "pvc": ["--set", "modelRepository.pvc.claimName=models"],
    "image": ["--set", "modelRepository.image.repository=registry.local/models", "--set",
              "modelRepository.image.tag=1"],
    "everything": [
        "--set", "modelRepository.url=gs://models/repository",
        "--set", "modelRepository.credentialsSecret=gcs-credentials",
        "--set", "autoscaling.enabled=true",
        "--set", "serviceMonitor.enabled=true",
        "--set", "exitTimeoutSeconds=120",
        "--set", "shmSize=4Gi",
        "--set", "serverArgs={--model-control-mode=poll,--repository-poll-secs=30}",
    ],
}  # fmt: skip


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(ROOT / ".tools" / "bin"))
    if found is None:
        message = f"{name} is not installed (bash scripts/deploy-tools.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def render_text(variant: str) -> str:
    return run(tool("helm"), "template", "demo", str(CHART), *VARIANTS[variant])


def render(variant: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(render_text(variant)) if doc]


def test_dockerfile_is_hadolint_clean() -> None:
    run(tool("hadolint"), str(ROOT / "Dockerfile"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chart_lints(variant: str) -> None:
    run(tool("helm"), "lint", "--strict", str(CHART), *VARIANTS[variant])


def test_chart_without_a_repository_fails_clearly() -> None:
    result = subprocess.run(
        [tool("helm"), "template", "demo", str(CHART)], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "set one of modelRepository.url" in result.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_objects_match_kubernetes_schemas(variant: str, tmp_path: Path) -> None:
    documents = render(variant)
    kinds = sorted(doc["kind"] for doc in documents)
    expected = ["Deployment", "PodDisruptionBudget", "Service"]
    if variant == "everything":
        expected += ["HorizontalPodAutoscaler", "ServiceMonitor"]
    assert kinds == sorted(expected)
    for doc in documents:
        if doc["kind"] == "ServiceMonitor":
            check_service_monitor(doc)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(render_text(variant))
    run(tool("yamllint"), "-s", "-c", str(ROOT / ".yamllint"), str(rendered))


def test_deployment_drains_and_probes_like_triton() -> None:
    documents = {doc["kind"]: doc for doc in render("everything")}
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] > 120 + 5  # exit timeout + preStop sleep
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "dshm")
    assert mount["mountPath"] == "/dev/shm"
    assert container["envFrom"] == [{"secretRef": {"name": "gcs-credentials"}}]
    assert container["args"][0] == "tritonserver"
    settings, ignored = parse_args(container["args"][1:])
    assert settings.model_repositories == ["gs://models/repository"]
    assert settings.exit_timeout_secs == 120
    assert settings.model_control_mode == "poll" and ignored == []
    metric = documents["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]
    assert metric["name"] == "oceanus_queue_time_per_request_us"


def check_service_monitor(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    endpoint = doc["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert doc["spec"]["selector"]["matchLabels"]


def as_pod(name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": containers}}  # fmt: skip


def test_kserve_runtime_and_inference_service() -> None:
    yamllint = tool("yamllint")
    run(yamllint, "-s", "-c", str(ROOT / ".yamllint"), str(KSERVE), str(CHART / "values.yaml"))
    runtime = yaml.safe_load((KSERVE / "cluster-serving-runtime.yaml").read_text())
    assert (runtime["apiVersion"], runtime["kind"]) == (
        "serving.kserve.io/v1alpha1",
        "ClusterServingRuntime",
    )
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {f["name"] for f in spec["supportedModelFormats"]} >= {"triton", "onnx"}
    assert all(isinstance(f["version"], str) for f in spec["supportedModelFormats"])
    kubernetes_validate.validate(as_pod("runtime", spec["containers"]), K8S_VERSION, strict=True)
    container = spec["containers"][0]
    assert container["name"] == "kserve-container" and container["args"][0] == "tritonserver"
    settings, ignored = parse_args(container["args"][1:])
    assert settings.model_repositories == ["/mnt/models"] and ignored == []
    assert (settings.http_port, settings.grpc_port) == (8080, 9000)

    service = yaml.safe_load((KSERVE / "inference-service.yaml").read_text())
    assert (service["apiVersion"], service["kind"]) == (
        "serving.kserve.io/v1beta1",
        "InferenceService",
    )
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    container = {"name": "kserve-container", "image": "x", "resources": model["resources"]}
    kubernetes_validate.validate(as_pod("predictor", [container]), K8S_VERSION, strict=True)


def test_kserve_llm_inference_service_runs_oceanus_serve() -> None:
    """KServe's LLMInferenceService (llm-d) with vLLM's command swapped for `oceanus serve`: the
    pod part is a valid Pod, the command line parses as `oceanus serve` reads it (no flag left
    over), the probes ask GET /health on the serve port."""
    from oceanus.serve import parse_args as serve_args

    path = KSERVE / "llm-inference-service.yaml"
    run(tool("yamllint"), "-s", "-c", str(ROOT / ".yamllint"), str(path))
    service = yaml.safe_load(path.read_text())
    assert (service["apiVersion"], service["kind"]) == (
        "serving.kserve.io/v1alpha1",
        "LLMInferenceService",
    )
    spec = service["spec"]
    assert spec["model"]["uri"] and spec["model"]["name"]
    assert set(spec["router"]) == {"gateway", "route", "scheduler"}
    (container,) = spec["template"]["containers"]
    assert container["name"] == "main"  # the name KServe's template merges over
    kubernetes_validate.validate(as_pod("llm", [container]), K8S_VERSION, strict=True)
    command = container["command"] + container["args"]
    assert command[:3] == ["oceanus", "serve", "/mnt/models"]
    settings, ignored = serve_args(command[2:])
    assert ignored == [] and settings.model == "/mnt/models"
    assert settings.served_model_name == [spec["model"]["name"]] and settings.port == 8000
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == ("/health", 8000, "HTTP")
