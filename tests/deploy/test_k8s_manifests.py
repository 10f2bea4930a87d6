"""The Kubernetes manifests, rendered and checked with no cluster: schema, CLI, ports, security."""

from __future__ import annotations

import functools
import inspect
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from skyfed.agent.cli import main as agent_cli
from skyfed.agent.config import AgentConfig
from skyfed.agent.launch import EXIT_NO_SESSION, EXIT_REFUSED
from skyfed.config.load import load_config
from skyfed.coordinator.cli import main as coordinator_cli
from skyfed.coordinator.config import CoordinatorConfig

K8S = Path(__file__).parents[2] / "deploy" / "k8s"
OVERLAYS = ("aws", "gcp", "azure")
# The oldest Kubernetes the manifests promise to work on (docs/deployment.md).
KUBERNETES_VERSION = "1.31"
CLIS = {"coordinator": coordinator_cli, "agent": agent_cli}
CONFIGS = {"coordinator": CoordinatorConfig, "agent": AgentConfig}
GPU = "nvidia.com/gpu"


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize`` of one overlay: the resources ``kubectl apply -k`` would send."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail(
            "kubectl is not on PATH: the manifest tests render deploy/k8s with "
            "`kubectl kustomize` (install kubectl, which bundles kustomize)"
        )
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize overlays/{overlay}:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def of_kind(overlay: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in render(overlay) if r["kind"] == kind]


def workloads(overlay: str) -> list[dict[str, Any]]:
    return [r for r in render(overlay) if r["kind"] in ("StatefulSet", "Job")]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def containers(overlay: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of the overlay."""
    return [(w, c) for w in workloads(overlay) for c in pod_spec(w)["containers"]]


TORCHRUN = ["torchrun", "-m", "skyfed.agent"]


def argv(container: dict[str, Any]) -> list[str]:
    """The skyfed command line the container runs (``agent start ...`` also where torchrun
    starts it once per GPU)."""
    words = [*container.get("command", []), *container.get("args", [])]
    return ["agent", *words[len(TORCHRUN) :]] if words[: len(TORCHRUN)] == TORCHRUN else words


def env(container: dict[str, Any]) -> dict[str, Any]:
    """The container's variables: a value, or its ``valueFrom`` source."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def flag(container: dict[str, Any], name: str) -> str:
    words = argv(container)
    assert words.count(name) == 1, f"{container['name']}: {name} given {words.count(name)} times"
    return words[words.index(name) + 1]


def port_of(container: dict[str, Any], port: int | str) -> int:
    """A probe's or policy's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"{container['name']}: no container port named {port!r}"
    return named[port]


def mount(workload: dict[str, Any], container: dict[str, Any], volume: str) -> dict[str, Any]:
    found = [m for m in container.get("volumeMounts", []) if m["name"] == volume]
    assert len(found) == 1, f"{container['name']}: volume {volume!r} mounted {len(found)} times"
    return found[0]


def coordinator_toml(overlay: str, tmp_path: Path) -> Path:
    """The TOML file of the coordinator's ConfigMap, as the pod sees it mounted."""
    (config_map,) = of_kind(overlay, "ConfigMap")
    path = tmp_path / "coordinator.toml"
    path.write_text(config_map["data"]["coordinator.toml"])
    return path


def parse(container: dict[str, Any], files: dict[str, Path]) -> tuple[str, click.Context]:
    """Parse the container's command line with the real click CLI, as the pod will; paths
    that the pod mounts (``files``) are swapped for local copies so ``exists=True`` holds."""
    words = [str(files.get(w, w)) for w in argv(container)]
    component, sub, rest = words[0], words[1], words[2:]
    assert component in CLIS, f"{container['name']}: runs {component!r}, not a skyfed command"
    command = CLIS[component].get_command(click.Context(CLIS[component]), sub)
    assert command is not None, f"`{component} {sub}` is not a command"
    return component, command.make_context(f"{component} {sub}", rest)


def build_config(component: str, ctx: click.Context) -> Any:
    """The component's configuration from parsed flags, as its command builds it: the
    options the command's function names itself are not configuration fields, the rest
    (its ``**flags``) are."""
    named = inspect.signature(ctx.command.callback).parameters
    flags = {k: v for k, v in ctx.params.items() if k not in named}
    path = ctx.params.get("config_path")
    return load_config(CONFIGS[component], component=component, path=path, flags=flags)


# ---- rendering and schema ------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_a_site_and_its_policies(overlay):
    kinds = {r["kind"] for r in render(overlay)}
    assert {"Namespace", "Job", "NetworkPolicy", "ServiceAccount"} <= kinds


def test_exactly_one_overlay_hosts_the_coordinator():
    hosts = [o for o in OVERLAYS if of_kind(o, "StatefulSet")]
    assert hosts == ["aws"]
    (sts,) = of_kind("aws", "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    claims = [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]]
    assert claims == ["state"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_validates_against_the_kubernetes_schema(overlay):
    for resource in render(overlay):
        try:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            name = f"{resource['kind']}/{resource['metadata']['name']}"
            pytest.fail(f"overlays/{overlay}: {name}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_namespaced_resource_lands_in_the_skyfed_namespace(overlay):
    for resource in render(overlay):
        if resource["kind"] != "Namespace":
            assert resource["metadata"].get("namespace") == "skyfed", resource["metadata"]


# ---- the command lines ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifest_arguments_parse_with_the_real_clis(overlay, tmp_path):
    """A flag renamed or retyped in the CLI fails here, not in a user's cluster."""
    files = {}
    if of_kind(overlay, "ConfigMap"):
        files["/etc/skyfed/coordinator.toml"] = coordinator_toml(overlay, tmp_path)
    for _, container in containers(overlay):
        build_config(*parse(container, files))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_prometheus_point_at_the_port_in_metrics_listen(overlay):
    for workload, container in containers(overlay):
        host, port = flag(container, "--metrics-listen").rsplit(":", 1)
        assert host == "0.0.0.0", "the kubelet and Prometheus dial the pod's address"
        probes = [k for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in container]
        assert {"livenessProbe", "readinessProbe"} <= set(probes), container["name"]
        for kind in probes:
            get = container[kind]["httpGet"]
            assert port_of(container, get["port"]) == int(port), (container["name"], kind)
            assert get["path"] in ("/healthz", "/readyz"), (container["name"], kind)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        notes = workload["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert notes["prometheus.io/port"] == port
        assert notes["prometheus.io/path"] == "/metrics"


def test_coordinator_toml_agrees_with_its_pod_and_service(tmp_path):
    toml = coordinator_toml("aws", tmp_path)
    (sts,) = of_kind("aws", "StatefulSet")
    (container,) = pod_spec(sts)["containers"]
    config = build_config(*parse(container, {"/etc/skyfed/coordinator.toml": toml}))
    transport = config.transport
    assert tomllib.loads(toml.read_text())["transport"]["listen"] == transport.listen
    assert mount(sts, container, "config")["mountPath"] == flag(container, "--config")
    assert port_of(container, "grpc") == int(transport.listen.rsplit(":", 1)[1])
    assert port_of(container, "probe") == transport.probe_port
    protocols = {p["name"]: p["protocol"] for p in container["ports"]}
    assert protocols == {"grpc": "TCP", "probe": "UDP", "metrics": "TCP"}
    state = Path(mount(sts, container, "state")["mountPath"])
    for path in (
        config.checkpoints.checkpoint_dir,
        config.metrics.run_dir,
        config.checkpoints.export,
    ):
        assert path is not None and path.is_relative_to(state), f"{path} is not on the volume"
    assert mount(sts, container, "certs")["mountPath"] == str(transport.certs)
    for service in of_kind("aws", "Service"):
        if not service["spec"]["selector"].items() <= pod_labels(sts).items():
            continue  # another workload's (the multi-node site's rendezvous)
        targets = {p["name"]: (p["targetPort"], p["protocol"]) for p in service["spec"]["ports"]}
        assert targets == {"grpc": ("grpc", "TCP"), "probe": ("probe", "UDP")}
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()


def test_each_site_has_its_own_name_shard_and_certificates():
    sites = []
    for overlay in OVERLAYS:
        (job,) = of_kind(overlay, "Job")
        (container,) = pod_spec(job)["containers"]
        config = build_config(*parse(container, {}))
        assert config.cloud == overlay
        assert str(config.certs) == mount(job, container, "certs")["mountPath"]
        (certs,) = [v for v in pod_spec(job)["volumes"] if v["name"] == "certs"]
        assert certs["secret"]["secretName"] == f"skyfed-certs-{config.name}"
        hosts_coordinator = bool(of_kind(overlay, "StatefulSet"))
        in_cluster = config.coordinator.startswith("skyfed-coordinator:")
        assert in_cluster == hosts_coordinator, (overlay, config.coordinator)
        sites.append((config.name, config.shard, config.num_shards))
    names, shards, counts = zip(*sites, strict=True)
    assert len(set(names)) == len(names)
    assert set(counts) == {len(OVERLAYS)} and sorted(shards) == list(range(len(OVERLAYS)))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_sites_layout_fills_its_gpus(overlay):
    """dp x tp ranks, one per GPU: the pod's GPUs, or the nodes' of a multi-node site, whose
    TP groups stay within a node."""
    (job,) = of_kind(overlay, "Job")
    (container,) = pod_spec(job)["containers"]
    config = build_config(*parse(container, {}))
    resources = container["resources"]
    gpus = int(resources["limits"][GPU])
    assert int(resources["requests"][GPU]) == gpus
    if container["command"][0] == "torchrun":
        nodes, per_node = (
            int(env(container)["PET_NNODES"]),
            int(env(container)["PET_NPROC_PER_NODE"]),
        )
        assert per_node == gpus and per_node % config.tp == 0
        assert config.dp in (0, nodes * per_node // config.tp)
    else:
        assert max(1, config.dp) * config.tp == gpus
    assert flag(container, "--device") == "cuda"
    for name in ("--reconnect-initial-s", "--reconnect-max-s", "--give-up-after-s"):
        float(flag(container, name))


def test_a_multi_node_site_is_an_indexed_job_whose_pods_meet_at_pod_0():
    """aws-1 spans two nodes: one pod each (an indexed Job), torchrun over the pod's GPUs,
    the rendezvous at pod 0 through a headless Service, and site traffic between the pods
    let through by a policy that admits the site's pods alone."""
    (job,) = of_kind("aws", "Job")
    pod = pod_spec(job)
    (container,) = pod["containers"]
    variables = env(container)
    nodes = int(variables["PET_NNODES"])
    assert nodes > 1 and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nodes
    annotation = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert variables["PET_NODE_RANK"] == {"fieldRef": {"fieldPath": annotation}}
    (service,) = [s for s in of_kind("aws", "Service") if s["metadata"]["name"] == pod["subdomain"]]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels(job).items()
    name = job["metadata"]["name"]
    assert variables["PET_MASTER_ADDR"] == f"{name}-0.{service['metadata']['name']}"
    (port,) = service["spec"]["ports"]
    assert int(variables["PET_MASTER_PORT"]) == port["port"]
    assert port_of(container, port["targetPort"]) == port["port"]
    admits_site = [
        p
        for p in of_kind("aws", "NetworkPolicy")
        if p["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(job).items()
        and any(
            peer.get("podSelector", {}).get("matchLabels", {}).items() <= pod_labels(job).items()
            and "podSelector" in peer
            for rule in p["spec"]["ingress"]
            for peer in rule.get("from", [])
        )
    ]
    assert admits_site, "nothing lets the site's pods reach each other"


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


# ---- security ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_non_root_read_only_with_no_capabilities(overlay):
    """The restricted Pod Security Standard the namespace enforces, checked before a cluster."""
    (namespace,) = of_kind(overlay, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in workloads(overlay):
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, container["name"]
            assert ctx["readOnlyRootFilesystem"] is True, container["name"]
            assert ctx["capabilities"]["drop"] == ["ALL"], container["name"]
            assert "add" not in ctx["capabilities"], container["name"]
            mounted = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounted, "a read-only root needs a writable /tmp"


def test_only_agents_reach_the_coordinators_port():
    (sts,) = of_kind("aws", "StatefulSet")
    (container,) = pod_spec(sts)["containers"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    policies = [
        p
        for p in of_kind("aws", "NetworkPolicy")
        if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(policies) == 1
    (policy,) = policies
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    grpc = port_of(container, "grpc")
    reaching = []
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from"), "an ingress rule without `from` admits every pod"
        ports = {port_of(container, p["port"]) for p in rule["ports"]}
        if grpc in ports:
            reaching.extend(rule["from"])
        else:
            assert ports == {port_of(container, "metrics")}, rule
    agents = [peer for peer in reaching if "podSelector" in peer]
    assert agents == [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "agent"}}}]
    remote = [peer["ipBlock"]["cidr"] for peer in reaching if "ipBlock" in peer]
    assert len(remote) == len(OVERLAYS) - 1, "one address block per site in another cloud"
    assert all(not cidr.endswith("/0") for cidr in remote), remote
    assert len(agents) + len(remote) == len(reaching), "nothing else reaches the gRPC port"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_material_is_in_the_manifests(overlay):
    """Certificates come from `certs k8s-secret` at deploy time; the CA key never does."""
    assert not of_kind(overlay, "Secret")
    text = yaml.safe_dump_all(render(overlay))
    assert "ca.key" not in text and "PRIVATE KEY" not in text


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_job_fails_fast_only_where_a_retry_cannot_help(overlay):
    """Exit 2 (a CLI mistake) and 3 (refused: revoked, wrong identity) end the Job; 4 (no
    session for --give-up-after-s) and crashes get a fresh pod, which resyncs."""
    (job,) = of_kind(overlay, "Job")
    (rule, *_) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert set(rule["onExitCodes"]["values"]) == {click.UsageError.exit_code, EXIT_REFUSED}
    assert EXIT_NO_SESSION not in rule["onExitCodes"]["values"]
    assert job["spec"]["backoffLimit"] > 0
    assert pod_spec(job)["restartPolicy"] == "Never"  # what podFailurePolicy requires


def test_the_public_nlb_keeps_the_agents_source_addresses():
    """The NetworkPolicy admits the other clouds by their NAT addresses: an NLB with IP
    targets passes them on for TCP only where its target group preserves the client IP."""
    services = of_kind("aws", "Service")
    (public,) = [s for s in services if s["spec"].get("type") == "LoadBalancer"]
    annotations = public["metadata"]["annotations"]
    prefix = "service.beta.kubernetes.io/aws-load-balancer-"
    assert annotations[prefix + "nlb-target-type"] == "ip"
    attributes = dict(
        pair.strip().split("=", 1)
        for pair in annotations[prefix + "target-group-attributes"].split(",")
    )
    assert attributes["preserve_client_ip.enabled"] == "true"
    assert {p["protocol"] for p in public["spec"]["ports"]} == {"TCP", "UDP"}
