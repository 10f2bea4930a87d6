"""The coordinator as replicas on Kubernetes (overlays/aws-replicas: the replica and etcd
components), rendered and checked with no cluster: schema, security, and the replica's
configuration as its pod builds it (docs/failover.md; why etcd and not a Lease:
docs/decisions/kubernetes-lease.md)."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
from click.testing import CliRunner

from skyfed.certs.cli import cli
from skyfed.coordinator.replicas.settings import parse_endpoints

from .test_k8s_manifests import (
    KUBERNETES_VERSION,
    build_config,
    coordinator_toml,
    mount,
    of_kind,
    parse,
    pod_spec,
    port_of,
    render,
)

OVERLAY = "aws-replicas"


def statefulset(name: str) -> dict[str, Any]:
    (found,) = [s for s in of_kind(OVERLAY, "StatefulSet") if s["metadata"]["name"] == name]
    return found


def pod_env(container: dict[str, Any], pod: str, index: int) -> dict[str, str]:
    """The container's environment as the kubelet makes it for pod ``pod``: field
    references resolved, ``$(VAR)`` expanded from the variables before it."""
    fields = {"metadata.name": pod, "metadata.labels['apps.kubernetes.io/pod-index']": str(index)}
    env: dict[str, str] = {}
    for var in container["env"]:
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
    return env


def test_every_resource_validates_against_the_kubernetes_schema():
    for resource in render(OVERLAY):
        try:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            name = f"{resource['kind']}/{resource['metadata']['name']}"
            pytest.fail(f"overlays/{OVERLAY}: {name}: {exc.message} at {list(exc.path)}")
    for resource in render(OVERLAY):
        if resource["kind"] != "Namespace":
            assert resource["metadata"].get("namespace") == "skyfed", resource["metadata"]


def test_three_replicas_and_three_etcd_members():
    assert statefulset("skyfed-coordinator")["spec"]["replicas"] == 3
    etcd = statefulset("skyfed-etcd")
    assert etcd["spec"]["replicas"] == 3
    (container,) = pod_spec(etcd)["containers"]
    (cluster,) = [a for a in container["command"] if a.startswith("--initial-cluster=")]
    members = dict(m.split("=", 1) for m in cluster.split("=", 1)[1].split(","))
    service = etcd["spec"]["serviceName"]
    assert members == {
        f"skyfed-etcd-{i}": f"http://skyfed-etcd-{i}.{service}:{port_of(container, 'peer')}"
        for i in range(3)
    }


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_replica_configures_itself_from_its_pod(index, tmp_path, monkeypatch):
    """TOML, flags and the pod's environment give the replica its name (its ordinal), its
    own certificate, an address others can dial, and every etcd member."""
    sts = statefulset("skyfed-coordinator")
    (container,) = pod_spec(sts)["containers"]
    pod = f"skyfed-coordinator-{index}"
    for name, value in pod_env(container, pod, index).items():
        monkeypatch.setenv(name, value)
    toml = coordinator_toml(OVERLAY, tmp_path)
    config = build_config(*parse(container, {"/etc/skyfed/coordinator.toml": toml}))
    cert, replicas = config.transport.cert, config.replicas
    assert replicas.replica == str(index)
    assert cert.name == f"coordinator-{index}.crt"
    assert str(cert.parent) == mount(sts, container, "certs")["mountPath"]
    host, _, port = replicas.advertise.rpartition(":")
    assert host == f"{pod}.{sts['spec']['serviceName']}"
    assert int(port) == port_of(container, "grpc")
    (peers,) = [
        s for s in of_kind(OVERLAY, "Service") if s["metadata"]["name"] == host.split(".")[1]
    ]
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    etcd = statefulset("skyfed-etcd")
    (etcd_container,) = pod_spec(etcd)["containers"]
    hosts = {urlsplit(u).hostname: urlsplit(u).port for u in parse_endpoints(replicas.etcd)}
    service = etcd["spec"]["serviceName"]
    client = port_of(etcd_container, "client")
    assert hosts == {f"skyfed-etcd-{i}.{service}": client for i in range(3)}


def test_only_the_leader_is_ready_and_the_probe_is_quick():
    (container,) = pod_spec(statefulset("skyfed-coordinator"))["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["readinessProbe"]["periodSeconds"] <= 2


def test_replica_secret_is_the_one_the_statefulset_mounts(pki):
    for index in range(3):
        pki.issue_coordinator(f"coordinator-{index}", hosts=("skyfed-coordinator",))
    (certs,) = [
        v for v in pod_spec(statefulset("skyfed-coordinator"))["volumes"] if v["name"] == "certs"
    ]
    wanted = certs["secret"]["secretName"]
    names = [f"coordinator-{i}" for i in range(3)]
    args = ["k8s-secret", *names, "--dir", str(pki.directory), "--secret-name", wanted]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.output)
    assert manifest["metadata"]["name"] == wanted
    assert set(manifest["data"]) == {"ca.crt", "crl.pem"} | {
        f"{n}.{ext}" for n in names for ext in ("crt", "key")
    }
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    several = CliRunner().invoke(cli, ["k8s-secret", *names, "--dir", str(pki.directory)])
    assert several.exit_code == 2 and "--secret-name" in several.output


def test_only_coordinators_reach_etcd_and_only_members_its_peers():
    (policy,) = [
        p for p in of_kind(OVERLAY, "NetworkPolicy") if p["metadata"]["name"] == "skyfed-etcd"
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (container,) = pod_spec(statefulset("skyfed-etcd"))["containers"]
    reach = {}
    for rule in policy["spec"]["ingress"]:
        (peer,) = rule["from"]
        (port,) = rule["ports"]
        reach[port_of(container, port["port"])] = peer["podSelector"]["matchLabels"]
    assert reach == {
        port_of(container, "client"): {"app.kubernetes.io/component": "coordinator"},
        port_of(container, "peer"): {"app.kubernetes.io/component": "etcd"},
    }


def test_etcd_runs_non_root_read_only_with_no_capabilities():
    pod = pod_spec(statefulset("skyfed-etcd"))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["capabilities"]["drop"] == ["ALL"]


def test_the_replicas_reach_each_others_grpc_port_and_nothing_else():
    """A standby replays the leader's rounds over its gRPC port (Replicate)."""
    (policy,) = [
        p
        for p in of_kind(OVERLAY, "NetworkPolicy")
        if p["metadata"]["name"] == "skyfed-coordinator-replicas"
    ]
    coordinator = {"app.kubernetes.io/component": "coordinator"}
    assert policy["spec"]["podSelector"]["matchLabels"] == coordinator
    (rule,) = policy["spec"]["ingress"]
    assert [peer["podSelector"]["matchLabels"] for peer in rule["from"]] == [coordinator]
    assert rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
