"""The Kubernetes example (config/k8s): the executor pod template and its ConfigMap validate against the Kubernetes
API schema (kubernetes-validate, strict: unknown fields are errors), globald runs as a native sidecar whose
readiness is /readyz, the executor finds it through GLOBALD_CONFIG on a shared state_dir, the config is one globald
accepts, and the sidecar keeps the systemd unit's hardening."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from globald.settings.config import load
from globald.spark.host import CONFIG_ENV
from tests.ci import require_module
from tests.harness import REPO
from tests.unit.test_systemd_units import settings

K8S = REPO / "config" / "k8s"
TEMPLATE = K8S / "executor-pod-template.yaml"
CONFIGMAP = K8S / "globald-configmap.yaml"
# Native sidecars (restartPolicy on an init container) are on by default from 1.29.
VERSIONS = ["1.29.0", "1.33.0", "latest"]


def doc(path: Path) -> dict[str, Any]:
    (only,) = list(yaml.safe_load_all(path.read_text()))  # Spark reads the template as exactly one Pod
    assert isinstance(only, dict)
    return only


def validator() -> Any:
    # In the test extra; this only spares a checkout installed without it (and fails in CI).
    return require_module("kubernetes_validate", "test")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", [TEMPLATE, CONFIGMAP], ids=lambda p: p.name)
def test_manifests_validate_against_the_kubernetes_schema(path: Path, version: str) -> None:
    kv = validator()
    kv.validate(doc(path), kv.latest_version() if version == "latest" else version, strict=True)


def test_the_validator_rejects_a_sidecar_before_kubernetes_had_them() -> None:
    """The strict schema is really consulted: 1.27 knew no restartPolicy on a container."""
    kv = validator()
    with pytest.raises(kv.ValidationError, match="restartPolicy"):
        kv.validate(doc(TEMPLATE), "1.27.0", strict=True)


def containers(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    (sidecar,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "globald"]
    executor = pod["spec"]["containers"][0]  # Spark's executor container: the first, or the one named
    assert executor["name"] == "spark-kubernetes-executor"
    return sidecar, executor


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container["volumeMounts"]}


def test_globald_is_a_native_sidecar_the_executor_finds_through_globald_config(tmp_path: Path) -> None:
    pod = doc(TEMPLATE)
    sidecar, executor = containers(pod)
    assert sidecar["restartPolicy"] == "Always"
    config_path = sidecar["command"][sidecar["command"].index("--config") + 1]
    assert sidecar["command"][:2] == ["globald", "run"]
    assert {"name": CONFIG_ENV, "value": config_path} in executor["env"]

    # The config the ConfigMap carries is one globald accepts, its state_dir is the volume both containers mount.
    (text,) = doc(CONFIGMAP)["data"].values()
    (tmp_path / "globald.toml").write_text(text)
    cfg = load(tmp_path / "globald.toml")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    state = [n for n, m in mounts(sidecar).items() if m["mountPath"] == str(cfg.state_dir)]
    assert state and mounts(executor)[state[0]]["mountPath"] == str(cfg.state_dir)
    assert not mounts(executor)[state[0]].get("readOnly"), "readers write leases and requests in the state_dir"
    conf = [n for n, m in mounts(sidecar).items() if config_path.startswith(m["mountPath"] + "/")]
    assert conf and volumes[conf[0]]["configMap"]["name"] == doc(CONFIGMAP)["metadata"]["name"]
    assert mounts(executor)[conf[0]]["mountPath"] == mounts(sidecar)[conf[0]]["mountPath"]

    # Readiness (and the startup gate before the executor starts) is /readyz on the port the config binds.
    assert cfg.http.enabled and cfg.http.host == "127.0.0.1"
    for probe, path in (("startupProbe", "readyz"), ("readinessProbe", "readyz"), ("livenessProbe", "healthz")):
        command = " ".join(sidecar[probe]["exec"]["command"])
        assert re.search(rf"http://127\.0\.0\.1:{cfg.http.port}/{path}\b", command), (probe, command)
    assert {"cpu", "memory"} <= set(sidecar["resources"]["requests"])


def test_executor_pods_bootstrap_from_a_bucket_with_credentials_from_a_secret(tmp_path: Path) -> None:
    """Issue 34: a new executor pod starts from the bucket's newest export; the bucket's credentials reach the
    sidecar from a Secret, never as values in the template or the ConfigMap."""
    (text,) = doc(CONFIGMAP)["data"].values()
    (tmp_path / "globald.toml").write_text(text)
    cfg = load(tmp_path / "globald.toml")
    assert cfg.export is not None and cfg.export.bootstrap and cfg.export.uri.startswith("s3://")
    assert "@" not in cfg.export.uri and "secret" not in cfg.export.uri.lower()
    sidecar, _ = containers(doc(TEMPLATE))
    env = {e["name"]: e for e in sidecar["env"]}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name] and env[name]["valueFrom"]["secretKeyRef"]["name"], env[name]


def test_the_sidecar_keeps_the_systemd_units_hardening() -> None:
    unit = settings("globald.service")
    pod = doc(TEMPLATE)
    sidecar, executor = containers(pod)
    ctx, pod_ctx = sidecar["securityContext"], pod["spec"]["securityContext"]
    # Each hardening setting of the unit, and what stands for it in the pod.
    mapping = {
        "NoNewPrivileges": ctx["allowPrivilegeEscalation"] is False,
        "ProtectSystem": ctx["readOnlyRootFilesystem"] is True,
        "ReadWritePaths": {m["mountPath"] for m in sidecar["volumeMounts"] if not m.get("readOnly")}
        == {"/var/lib/globald", "/tmp"},
        "PrivateTmp": "/tmp" in {m["mountPath"] for m in sidecar["volumeMounts"]},
        "CapabilityBoundingSet": ctx["capabilities"]["drop"] == ["ALL"] and "add" not in ctx["capabilities"],
        "SystemCallFilter": ctx["seccompProfile"]["type"] == "RuntimeDefault",
        "User": ctx["runAsNonRoot"] is True and pod_ctx["runAsNonRoot"] is True,
        "PrivateDevices": ctx["privileged"] is False,
        "TimeoutStopSec": pod["spec"]["terminationGracePeriodSeconds"] >= int(unit["TimeoutStopSec"][0]),
    }
    assert set(mapping) <= set(unit), "the unit no longer has a setting this test maps"
    assert all(mapping.values()), {k: v for k, v in mapping.items() if not v}
    assert unit["ReadWritePaths"] == ["/var/lib/globald"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    # The executor runs as the same user (the state_dir is 0700) and escalates nothing either.
    assert "runAsUser" not in sidecar["securityContext"] and "runAsUser" not in executor["securityContext"]
    assert executor["securityContext"]["allowPrivilegeEscalation"] is False
