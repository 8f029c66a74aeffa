"""Apply the ACL table to a broker in one CreateAcls request, as the admin principal.

aiokafka's admin client has the CreateAcls wire format but no method for it; the request goes through
its connection like any other admin request. Creating a binding that exists is a no-op on the broker,
so applying the table again (every `services up`, every init job run) changes nothing. The broker's
authorizer learns a new binding from the metadata log a moment after CreateAcls answers, so apply_acls
returns once DescribeAcls lists every binding: a service started right after it is authorized.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest_v1, DescribeAclsRequest
from aiokafka.protocol.api import Request

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_admin
from lorafleet.kafka_acls import GRANTS, Grant

# Kafka's wire codes (org.apache.kafka.common.resource / acl enums).
ANY = 1  # the wildcard of each enum, in a DescribeAcls filter
RESOURCE_TOPIC, RESOURCE_GROUP = 2, 3
PATTERN_LITERAL, PATTERN_PREFIXED = 3, 4
PERMISSION_ALLOW = 3
OPERATIONS: dict[str, int] = {
    "All": 2,
    "Read": 3,
    "Write": 4,
    "Create": 5,
    "Delete": 6,
    "Alter": 7,
    "Describe": 8,
    "DescribeConfigs": 10,
    "AlterConfigs": 11,
}

Binding = tuple[int, str, int, str, str, int, int]


class AclError(RuntimeError):
    """The broker refused to create some ACL bindings."""


class _CreateAcls(Request[CreateAclsRequest_v1]):
    API_KEY = 30

    def __init__(self, creations: list[Binding]) -> None:
        self._creations = creations

    def build(self, request_struct_class: type[CreateAclsRequest_v1]) -> CreateAclsRequest_v1:
        return request_struct_class(self._creations)


def bindings(grants: tuple[Grant, ...] = GRANTS) -> list[Binding]:
    """Each grant as (resource type, name, pattern type, principal, host, operation, permission) rows."""
    out: list[Binding] = []
    pattern = {False: PATTERN_LITERAL, True: PATTERN_PREFIXED}
    for g in grants:
        resources = [(RESOURCE_TOPIC, n) for n in g.topics] + [(RESOURCE_GROUP, n) for n in g.groups]
        for kind, name in resources:
            for op in g.operations:
                out.append(
                    (
                        kind,
                        name,
                        pattern[g.prefixed],
                        f"User:{g.principal}",
                        "*",
                        OPERATIONS[op],
                        PERMISSION_ALLOW,
                    )
                )
    return out


async def listed(admin: AIOKafkaAdminClient) -> set[Binding]:
    """Every binding the broker's authorizer holds now."""
    request = DescribeAclsRequest(ANY, None, ANY, None, None, ANY, ANY)
    response = await admin._send_request(request)  # noqa: SLF001 - no public DescribeAcls
    if response.error_code != 0:
        raise AclError(f"DescribeAcls failed: {response.error_message}")
    return {
        (kind, name, pattern, principal, host, op, permission)
        for kind, name, pattern, acls in response.resources
        for principal, host, op, permission in acls
    }


async def apply_acls(
    admin_settings: PlatformSettings, grants: tuple[Grant, ...] = GRANTS, timeout_s: float = 30.0
) -> int:
    """Create every binding of the table on the broker (a super user's settings), wait until the broker
    lists them all, and return how many there are."""
    rows = bindings(grants)
    admin = make_admin(admin_settings)
    await admin.start()
    try:
        response = await admin._send_request(_CreateAcls(rows))  # noqa: SLF001 - no public CreateAcls
        errors = [(rows[i], msg) for i, (code, msg) in enumerate(response.creation_responses) if code != 0]
        if errors:
            raise AclError(f"{len(errors)} of {len(rows)} ACL bindings refused, e.g. {errors[0]}")
        deadline = time.monotonic() + timeout_s
        while missing := set(rows) - await listed(admin):
            if time.monotonic() > deadline:
                raise AclError(f"{len(missing)} ACL bindings not in force after {timeout_s}s")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    return len(rows)
