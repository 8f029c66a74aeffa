"""Every infra/k8s document validates: Kubernetes kinds against kubernetes-validate's strict schemas, the KEDA
and Prometheus Operator custom resources against the closed schemas in tests/project/schemas (which refer to
the same Kubernetes definitions for metadata, selectors and HPA behavior). Nothing is downloaded."""

from __future__ import annotations

import functools
import importlib.resources
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from referencing import Registry, Resource

from tests.project.k8s_files import TEMPLATES, Doc, documents, file_names, kustomization

KUBERNETES_VERSION = "1.31"
SCHEMAS = Path(__file__).parent / "schemas"
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.keda.sh-v1alpha1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.monitoring.coreos.com-v1.json",
}


@functools.cache
def kubernetes_definitions() -> Resource:
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    text = (folder / f"v{KUBERNETES_VERSION}.0-local-strict" / "_definitions.json").read_text()
    return Resource.from_contents(json.loads(text))


def validate_custom(doc: Doc) -> None:
    schema = json.loads((SCHEMAS / CUSTOM[doc.body["apiVersion"], doc.kind]).read_text())
    registry = kubernetes_definitions() @ Registry()
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc.body)


@pytest.mark.parametrize("doc", documents(), ids=str)
def test_each_document_validates_against_its_schema(doc: Doc) -> None:
    if (doc.body["apiVersion"], doc.kind) in CUSTOM:
        validate_custom(doc)
    else:
        kubernetes_validate.validate(doc.body, KUBERNETES_VERSION, strict=True)


def test_the_custom_schemas_are_closed() -> None:
    """A misspelt field fails, so the custom schemas check what they claim to."""
    (scaled,) = [d for d in documents() if d.kind == "ScaledObject"]
    broken = json.loads(json.dumps(scaled.body))
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 5  # KEDA metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(Doc(scaled.file, broken))
    (monitor, *_) = [d for d in documents() if d.kind == "PodMonitor"]
    broken = json.loads(json.dumps(monitor.body))
    broken["spec"]["podTargetLabel"] = ["pool"]
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(Doc(monitor.file, broken))


def test_a_misspelt_kubernetes_field_fails_validation() -> None:
    (deployment, *_) = [d for d in documents() if d.kind == "Deployment"]
    broken = json.loads(json.dumps(deployment.body))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_but_the_templates() -> None:
    listed = set(kustomization()["resources"])
    assert listed <= file_names()
    assert listed == file_names() - {"kustomization.yaml"} - TEMPLATES
    assert TEMPLATES <= file_names()
