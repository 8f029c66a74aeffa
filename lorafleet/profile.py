"""The deployment profile, and the rule that a dev token never guards anything outside the dev profile.

Every default token in the settings classes is DEV_TOKEN, which anyone who has read this repository
knows. A process that holds a credential (the token it checks or the one it sends) refuses to start with
DEV_TOKEN, or with no token, unless LORAFLEET_PROFILE=dev says this is a dev box. The local stack
(`lorafleet services up`) and the test suite set the dev profile explicitly; production manifests set
real secrets and leave the profile at its default.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import SecretStr

from lorafleet.config import PlatformSettings

DEV_TOKEN = "dev-service-token"
DEV_PROFILE_ENV = {"LORAFLEET_PROFILE": "dev"}


class DevTokenRefused(SystemExit):
    """A process would run with a well-known token outside the dev profile (exits with its message)."""


def dev_tokens(tokens: Mapping[str, str | SecretStr]) -> list[str]:
    """The setting names (of tokens) that hold the dev token or nothing."""
    out = []
    for name, value in tokens.items():
        secret = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not secret or secret == DEV_TOKEN:
            out.append(name)
    return sorted(out)


def refuse_dev_tokens(
    platform: PlatformSettings, process: str, tokens: Mapping[str, str | SecretStr]
) -> None:
    """Raise DevTokenRefused unless the profile is dev or every token is a real secret."""
    if platform.profile == "dev":
        return
    found = dev_tokens(tokens)
    if found:
        raise DevTokenRefused(
            f"{process}: {', '.join(found)} still hold the default dev token. Set a secret of its own for"
            " each, or set LORAFLEET_PROFILE=dev on a single-machine dev stack."
        )
