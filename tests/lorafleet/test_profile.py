"""The dev profile rule, pure: which tokens count as the dev token, and when they stop a process."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from lorafleet.config import PlatformSettings
from lorafleet.profile import DEV_TOKEN, DevTokenRefused, dev_tokens, refuse_dev_tokens


def test_the_dev_token_and_an_empty_one_are_found_by_setting_name() -> None:
    tokens = {"B": SecretStr(DEV_TOKEN), "A": "", "C": "a-real-secret"}
    assert dev_tokens(tokens) == ["A", "B"]


def test_outside_the_dev_profile_a_dev_token_stops_the_process() -> None:
    with pytest.raises(DevTokenRefused, match="X_TOKEN"):
        refuse_dev_tokens(PlatformSettings(profile="production"), "gateway", {"X_TOKEN": DEV_TOKEN})
    refuse_dev_tokens(PlatformSettings(profile="production"), "gateway", {"X_TOKEN": "s3cret"})
    refuse_dev_tokens(PlatformSettings(profile="dev"), "gateway", {"X_TOKEN": DEV_TOKEN})
