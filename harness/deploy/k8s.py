"""infra/k8s as data: the workloads `kubectl apply -k` creates, each pod's containers as native processes with
exactly the command and environment the manifests give them (harness/deploy/network.py says what running
them natively on one machine changes).

A container's environment is built as the kubelet builds it: the ConfigMaps of envFrom, then each env
entry in order, a value with its $(VAR) references expanded from the entries before it, a secretKeyRef
from the Secret, a fieldRef from the pod (metadata.name is its name, status.podIP loopback). Its command is
`lorafleet` (the image's entrypoint) with the container's args.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from harness.deploy.network import LOOPBACK, Network, listen_locally
from harness.ports import free_port
from harness.spec import CheckReady, HttpReady, Probe, ProcessSpec

REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# the probe a kubelet waits for before a pod counts as started (startup), then as ready
PROBE_ORDER = ("startupProbe", "readinessProbe")


@dataclass(frozen=True)
class Doc:
    file: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def __str__(self) -> str:
        return f"{self.file}:{self.kind}/{self.name}"


def applied_documents(folder: Path) -> list[Doc]:
    """Every document of the files the folder's kustomization lists (what `kubectl apply -k` creates)."""
    resources = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    docs = []
    for name in resources:
        docs += [Doc(name, d) for d in yaml.safe_load_all((folder / name).read_text()) if d]
    return docs


def secret_data(doc: Mapping[str, Any]) -> dict[str, str]:
    """A Secret's stringData (the example ships its values as text)."""
    return {str(k): str(v) for k, v in doc.get("stringData", {}).items()}


@dataclass
class Pod:
    """One pod of a workload: its name, its ports on loopback and its volumes' folders."""

    name: str
    workload: Doc
    ports: dict[int, int]  # containerPort -> loopback port
    volumes: dict[str, Path]  # volume name -> folder

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.workload.body["spec"]["template"]["spec"])

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.workload.body["spec"]["template"]["metadata"].get("labels", {}))

    def container(self, name: str | None = None) -> dict[str, Any]:
        """The named container, or the pod's only one."""
        found = [c for c in self.spec["containers"] if name in (None, c["name"])]
        if len(found) != 1:
            raise ValueError(f"{self.name}: no single container {name or ''}")
        return dict(found[0])

    def mounts(self, container: Mapping[str, Any]) -> dict[str, Path]:
        """mount path -> folder, for the container's volume mounts."""
        return {m["mountPath"]: self.volumes[m["name"]] for m in container.get("volumeMounts", [])}


@dataclass
class Cluster:
    """The manifests' workloads, run natively: pods made on demand, their processes built from the files."""

    docs: list[Doc]
    secret: dict[str, str]  # the lorafleet-secrets Secret's data
    network: Network
    work: Path
    # process (its command's first words) -> variables the test sets over the files' (say why there)
    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    base_env: Mapping[str, str] = field(default_factory=dict)  # what every process inherits (no LORAFLEET_*)
    pods: dict[str, Pod] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d.kind == kind]

    def workload(self, name: str) -> Doc:
        (doc,) = [d for d in self.docs if d.kind in ("Deployment", "StatefulSet", "Job") and d.name == name]
        return doc

    def config_maps(self) -> dict[str, dict[str, str]]:
        maps = self.of_kind("ConfigMap")
        return {d.name: {k: str(v) for k, v in d.body.get("data", {}).items()} for d in maps}

    def pod(self, workload: str, ordinal: int = 0) -> Pod:
        """A pod of the workload (a StatefulSet's by its ordinal, a Deployment's or a Job's with a random
        suffix), with loopback ports for its containers' ports, reachable by the Services that select it."""
        doc = self.workload(workload)
        name = f"{workload}-{ordinal}" if doc.kind == "StatefulSet" else f"{workload}-{secrets.token_hex(3)}"
        template = doc.body["spec"]["template"]["spec"]
        ports = {
            int(p["containerPort"]): free_port()
            for c in [*template.get("initContainers", []), *template["containers"]]
            for p in c.get("ports", [])
        }
        volume_names = [v["name"] for v in template.get("volumes", [])]
        volume_names += [t["metadata"]["name"] for t in doc.body["spec"].get("volumeClaimTemplates", [])]
        volumes = {v: self.work / "pods" / name / v for v in volume_names}
        for folder in volumes.values():
            folder.mkdir(parents=True, exist_ok=True)
        pod = Pod(name, doc, ports, volumes)
        self._route(pod)
        self.pods[name] = pod
        return pod

    def _route(self, pod: Pod) -> None:
        """Make the Services that select the pod resolve to it (the first such pod, for a ClusterIP one)."""
        named = _named_ports(pod)
        for svc in self.of_kind("Service"):
            spec = svc.body["spec"]
            if any(pod.labels.get(k) != v for k, v in spec["selector"].items()):
                continue
            for port in spec["ports"]:
                target = port.get("targetPort", port["port"])
                container_port = named[target] if isinstance(target, str) else int(target)
                loopback = pod.ports[container_port]
                if spec.get("clusterIP") == "None":  # headless: <pod>.<service> is the pod itself
                    self.network.add(f"{pod.name}.{svc.name}", int(port["port"]), loopback)
                elif (svc.name, int(port["port"])) not in self.network.ports:
                    self.network.add(svc.name, int(port["port"]), loopback)

    def env(self, pod: Pod, container: Mapping[str, Any]) -> dict[str, str]:
        """The container's environment as the kubelet builds it, then moved to loopback."""
        maps = self.config_maps()
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            env.update(maps[source["configMapRef"]["name"]])
        for entry in container.get("env", []):
            env[entry["name"]] = self._value(pod, entry, env)
        mounts = pod.mounts(container)
        moved = {k: self.network.rewrite(v, pod.ports, mounts) for k, v in env.items()}
        return listen_locally(moved, pod.ports)

    def _value(self, pod: Pod, entry: Mapping[str, Any], before: Mapping[str, str]) -> str:
        if "value" in entry:
            return REF.sub(lambda m: before.get(m[1], m[0]), str(entry["value"]))
        source = entry["valueFrom"]
        if "secretKeyRef" in source:
            return self.secret[source["secretKeyRef"]["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self.config_maps()[ref["name"]][ref["key"]]
        path = source["fieldRef"]["fieldPath"]
        fields = {"metadata.name": pod.name, "status.podIP": LOOPBACK, "metadata.namespace": "lorafleet"}
        return fields[path]

    def argv(self, pod: Pod, container: Mapping[str, Any], argv: list[str]) -> tuple[str, ...]:
        """A command line of the container, with its hosts, ports and volume paths moved like its env."""
        mounts = pod.mounts(container)
        return tuple(self.network.rewrite(str(a), pod.ports, mounts) for a in argv)

    def process_env(self, process: str, env: Mapping[str, str]) -> dict[str, str]:
        """The whole environment of a process: the inherited one, the container's, then the overrides."""
        return {**self.base_env, **env, **self.overrides.get(process, {})}

    def spec(self, pod: Pod, container_name: str | None = None, probe_s: float = 180.0) -> ProcessSpec:
        """The container as a ProcessSpec: `lorafleet <args>`, its environment, ready on its probes."""
        container = pod.container(container_name)
        args = self.argv(pod, container, container.get("args", []))
        env = self.process_env(process_of(args), self.env(pod, container))
        probes = tuple(p for key in PROBE_ORDER if (p := self._probe(pod, container.get(key), probe_s)))
        grace = float(pod.spec.get("terminationGracePeriodSeconds", 30))
        return ProcessSpec(pod.name, args, None, env, probes, log=pod.name, stop_grace_s=grace)

    def _probe(self, pod: Pod, probe: Mapping[str, Any] | None, within_s: float) -> Probe | None:
        if probe is None:
            return None
        named = _named_ports(pod)
        action = probe.get("httpGet") or probe.get("tcpSocket") or {}
        port = action["port"]
        loopback = pod.ports[named[port] if isinstance(port, str) else int(port)]
        if "httpGet" in probe:
            return HttpReady(f"http://{LOOPBACK}:{loopback}{action['path']}", within_s)
        return CheckReady(f"TCP {LOOPBACK}:{loopback}", lambda: _connects(loopback), within_s)

    def init_commands(self, pod: Pod) -> list[ProcessSpec]:
        """The pod's init containers, in order, each as a ProcessSpec to run to completion."""
        out = []
        for container in pod.spec.get("initContainers", []):
            args = self.argv(pod, container, container.get("args", []))
            env = self.process_env(process_of(args), self.env(pod, container))
            name = f"{pod.name}-{container['name']}"
            out.append(ProcessSpec(name, args, None, env, log=f"{pod.name}-init"))
        return out

    def pre_stop(self, pod: Pod, container_name: str | None = None) -> ProcessSpec | None:
        """The container's preStop hook (exec `lorafleet ...`) as a ProcessSpec, with the container's env."""
        container = pod.container(container_name)
        hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if not hook:
            return None
        if hook[0] != "lorafleet":
            raise ValueError(f"{pod.name}: a preStop hook that is not `lorafleet ...`: {hook}")
        args = self.argv(pod, container, hook[1:])
        env = self.process_env(process_of(args), self.env(pod, container))
        return ProcessSpec(f"{pod.name}-prestop", args, None, env, log=f"{pod.name}-prestop")


def _named_ports(pod: Pod) -> dict[str, int]:
    """A pod's named container ports."""
    return {p["name"]: int(p["containerPort"]) for c in pod.spec["containers"] for p in c.get("ports", [])}


def process_of(args: tuple[str, ...]) -> str:
    """A command line's process: its command, or group and sub-command (`replica serve`)."""
    from lorafleet.cli import SUBCOMMANDS

    return " ".join(args[:2]) if args and args[0] in SUBCOMMANDS else (args[0] if args else "")


async def _connects(port: int) -> bool:
    """A kubelet's tcpSocket probe: the port accepts a connection."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1):
            return True
    except OSError:
        return False


def seed_from_cache(folder: Path, prepared: Path) -> None:
    """folder as a node's image cache would have it: the prepared checkpoint's files, hard-linked (copied
    across file systems)."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in prepared.iterdir():
        target = folder / item.name
        if item.is_file() and not target.exists():
            try:
                os.link(item, target)
            except OSError:
                shutil.copy2(item, target)
