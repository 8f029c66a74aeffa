"""Read infra/k8s: every document, the workloads' containers with their effective environment, the Services."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.deploy.k8s import Doc
from tests.project.project_files import ROOT

K8S = ROOT / "infra/k8s"
# Files in infra/k8s that `kubectl apply -k` leaves out: a template copied per use, the Secret's example.
TEMPLATES = {"replica-merged.yaml", "secret.example.yaml"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job"}


@functools.cache
def documents() -> tuple[Doc, ...]:
    """Every document of every manifest (the kustomization itself excluded)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [Doc(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return tuple(docs)


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def of_kind(kind: str) -> list[Doc]:
    return [d for d in documents() if d.kind == kind]


def one(kind: str, name: str) -> Doc:
    (doc,) = [d for d in of_kind(kind) if d.name == name]
    return doc


def config_map() -> dict[str, str]:
    """The lorafleet-config ConfigMap's data."""
    return dict(one("ConfigMap", "lorafleet-config").body["data"])


@dataclass(frozen=True)
class Container:
    """One container of a workload, with the pod it runs in."""

    doc: Doc
    spec: dict[str, Any]
    pod: dict[str, Any]
    pod_labels: dict[str, str]

    @property
    def argv(self) -> list[str]:
        return list(self.spec.get("args", []))

    def env_entries(self) -> dict[str, dict[str, Any]]:
        """name -> its env entry (value or valueFrom), as written in the manifest."""
        return {e["name"]: e for e in self.spec.get("env", [])}

    def literal_env(self) -> dict[str, str]:
        """The environment the process sees from literal values: envFrom ConfigMaps, then env `value`s."""
        env: dict[str, str] = {}
        for source in self.spec.get("envFrom", []):
            if source.get("configMapRef", {}).get("name") == "lorafleet-config":
                env.update(config_map())
        for name, entry in self.env_entries().items():
            if "value" in entry:
                env[name] = expand(str(entry["value"]))
        return env

    def settings_env(self) -> dict[str, str]:
        """literal_env() plus a stand-in for each variable read from a Secret (its value is the Secret's; a
        digest's stand-in is a digest)."""
        env = self.literal_env()
        for name, entry in self.env_entries().items():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                stand_in = f"secret-{ref['key']}"
                env[name] = (
                    hashlib.sha256(stand_in.encode()).hexdigest() if name.endswith("_SHA256") else stand_in
                )
        return env

    def port(self, name: str) -> int:
        (port,) = [p["containerPort"] for p in self.spec.get("ports", []) if p.get("name") == name]
        return int(port)

    def __str__(self) -> str:
        return f"{self.doc}/{self.spec['name']}"


def expand(value: str) -> str:
    """Kubernetes' $(VAR) references, replaced by a stand-in so a URL still parses."""
    return re.sub(r"\$\(([A-Z_]+)\)", lambda m: m[1].lower().replace("_", "-"), value)


def containers(include_init: bool = True) -> Iterator[Container]:
    """Every container of every Deployment, StatefulSet and Job (init containers too, unless told not to)."""
    for doc in documents():
        if doc.kind not in WORKLOAD_KINDS:
            continue
        template = doc.body["spec"]["template"]
        pod = template["spec"]
        labels = template["metadata"].get("labels", {})
        specs = pod["containers"] + (pod.get("initContainers", []) if include_init else [])
        for spec in specs:
            yield Container(doc, spec, pod, labels)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions with In / NotIn / Exists) selects labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def file_names() -> set[str]:
    return {p.name for p in K8S.glob("*.yaml")}


def readme() -> str:
    return Path(K8S / "README.md").read_text()
