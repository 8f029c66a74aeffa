"""The registry's byte caps: unset they are the shared adapter caps, and a setting may only lower them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config import GatewaySettings
from lorafleet.adapter_rules import caps


def test_the_registry_caps_default_to_the_shared_ones() -> None:
    default = GatewaySettings()
    assert (default.config_cap(), default.weights_cap()) == (caps.MAX_CONFIG_BYTES, caps.MAX_WEIGHTS_BYTES)


def test_a_setting_may_lower_a_cap_or_equal_it() -> None:
    lower = GatewaySettings(max_config_bytes=1024, max_adapter_bytes=caps.MAX_WEIGHTS_BYTES)
    assert (lower.config_cap(), lower.weights_cap()) == (1024, caps.MAX_WEIGHTS_BYTES)


@pytest.mark.parametrize(
    ("field", "cap"),
    [("max_config_bytes", caps.MAX_CONFIG_BYTES), ("max_adapter_bytes", caps.MAX_WEIGHTS_BYTES)],
)
def test_a_setting_over_the_shared_cap_is_refused(field: str, cap: int) -> None:
    with pytest.raises(ValidationError, match="may only lower"):
        GatewaySettings(**{field: cap + 1})
