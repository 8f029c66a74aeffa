"""The bench tests that start stacks of their own: the session's real services, in the environment the
bench commands read their addresses from."""

from __future__ import annotations

import pytest

from tests.integration.conftest import services  # noqa: F401 - the session's real services
from tests.integration.services import ServiceAddresses


@pytest.fixture
def service_env(services: ServiceAddresses, monkeypatch: pytest.MonkeyPatch) -> ServiceAddresses:  # noqa: F811
    """The services' addresses and logins set in os.environ for this test."""
    for name, value in services.env().items():
        monkeypatch.setenv(name, value)
    return services
