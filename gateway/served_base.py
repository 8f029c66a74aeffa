"""The served base model as the registry sees it: its hash and its adaptable shapes."""

from __future__ import annotations

import logging

from gateway.base_spec import BaseSpec
from gateway.config import GatewaySettings

log = logging.getLogger(__name__)


def served_base_hash(settings: GatewaySettings) -> str:
    """The configured hash, or the hash of the served model directory (defined in replica/model)."""
    if settings.served_base_model_hash:
        return settings.served_base_model_hash
    # The hash's definition lives with the model code; the lead may move it to a shared module.
    from replica.model.base_hash import base_model_hash

    digest = base_model_hash(settings.served_model_dir)
    log.info("served base %s has base_model_hash %s", settings.served_model_dir, digest)
    return digest


def served_base_spec(settings: GatewaySettings) -> BaseSpec:
    return BaseSpec.from_model_dir(settings.served_model_dir)
