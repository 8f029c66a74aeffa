"""The served base model as the registry sees it: its hash and its adaptable shapes.

The hash's definition and the default model's preparation are the platform's (lorafleet/model), shared
with the replica, so the registry and the replica compute the same base_model_hash.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gateway.config import GatewaySettings
from lorafleet.adapter_rules.base_spec import BaseSpec
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import DEFAULT_MODEL_DIR, ensure_default_model

log = logging.getLogger(__name__)


def served_model_dir(settings: GatewaySettings) -> Path:
    """The served model directory; the default model is prepared (once) when it is missing."""
    model_dir = settings.served_model_dir
    if model_dir == DEFAULT_MODEL_DIR and not (model_dir / "config.json").is_file():
        model_dir = ensure_default_model(model_dir)
    return model_dir


def served_base_hash(settings: GatewaySettings) -> str:
    """The configured hash, or the base_model_hash of the served model directory."""
    if settings.served_base_model_hash:
        return settings.served_base_model_hash
    model_dir = served_model_dir(settings)
    digest = base_model_hash(model_dir)
    log.info("served base %s has base_model_hash %s", model_dir, digest)
    return digest


def served_base_spec(settings: GatewaySettings) -> BaseSpec:
    return BaseSpec.from_model_dir(served_model_dir(settings))
