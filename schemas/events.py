"""Every Kafka event, as pydantic models over one common envelope, and how they are (de)serialised.

Each event carries event_id (uuid), type, occurred_at and schema_version; consumers dedupe on event_id.
Values are JSON; the message key is the field named by the topic (schemas.topics).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    TypeAdapter,
    ValidationError,
)

from schemas import topics
from schemas.ids import AdapterId, Alias, ReplicaId, Sha256, TenantId

SCHEMA_VERSION = 1

Tier = Literal["gpu", "ram", "disk", "remote"]
ResidentTier = Literal["gpu", "ram", "disk"]  # where a replica holds an adapter (remote: it holds none)
# A replica's life: starting (base loading) -> warming (loading the adapters it owns; never routed to) ->
# ready (routed to) -> draining (finishing its running requests; never routed to) -> gone.
ReplicaStatus = Literal["starting", "warming", "ready", "draining"]
ValidationStatus = Literal["ready", "rejected"]  # a validated version's outcome
RequestStatus = Literal["ok", "error", "cancelled"]  # how a request ended


class EventValidationError(ValueError):
    """An event that does not match its schema; it is never published and never applied."""


def _now() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """The common envelope."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: ClassVar[topics.Topic]

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    occurred_at: datetime = Field(default_factory=_now)
    # a version this code does not know is refused, never read as if it were ours
    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSION)] = SCHEMA_VERSION
    type: str  # each event narrows it to its own Literal name, the discriminator parse_event reads

    def key(self) -> str:
        return str(getattr(self, self.topic.key_field))

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()


class AdapterRegistered(Event):
    topic: ClassVar[topics.Topic] = topics.ADAPTERS_REGISTERED
    type: Literal["adapter.registered"] = "adapter.registered"
    adapter_id: AdapterId
    tenant_id: TenantId
    version: Annotated[int, Field(ge=1)]
    base_model_hash: Sha256
    rank: Annotated[int, Field(ge=1)]
    alpha: Annotated[float, Field(gt=0)]
    target_modules: Annotated[list[str], Field(min_length=1)]
    weights_uri: Annotated[str, Field(min_length=1, max_length=1024)]
    checksum: Sha256


class AdapterValidated(Event):
    topic: ClassVar[topics.Topic] = topics.ADAPTERS_VALIDATED
    type: Literal["adapter.validated"] = "adapter.validated"
    adapter_id: AdapterId
    tenant_id: TenantId
    version: Annotated[int, Field(ge=1)]
    status: ValidationStatus
    reason_code: str | None = None
    reason: str | None = None
    size_bytes: NonNegativeInt | None = None


class AliasChanged(Event):
    topic: ClassVar[topics.Topic] = topics.ALIASES_CHANGED
    type: Literal["alias.changed"] = "alias.changed"
    alias: Alias
    tenant_id: TenantId
    adapter_id: AdapterId
    previous_adapter_id: AdapterId | None = None
    canary_adapter_id: AdapterId | None = None  # takes canary_weight of the alias's requests
    canary_weight: Annotated[float, Field(gt=0, lt=1)] | None = None
    revision: Annotated[int, Field(ge=1)]


class ReplicaCommand(Event):
    topic: ClassVar[topics.Topic] = topics.REPLICA_COMMANDS
    type: Literal["replica.command"] = "replica.command"
    replica_id: ReplicaId
    command: Literal["load", "unload", "prewarm"]
    adapter_id: AdapterId
    target_tier: ResidentTier = "ram"


class ReplicaStateBody(BaseModel):
    """One replica's membership, tiers and load: the payload of replica.state, and the core of the
    replica's GET state body (schemas.replica_api.StateResponse), so the two cannot drift apart."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replica_id: ReplicaId
    url: str
    status: ReplicaStatus = "ready"
    gpu_adapters: list[AdapterId] = Field(default_factory=list)
    ram_adapters: list[AdapterId] = Field(default_factory=list)
    disk_adapters: list[AdapterId] = Field(default_factory=list)
    gpu_slots: NonNegativeInt = 0
    queue_depth: NonNegativeInt = 0  # requests not in the batch yet: waiting for a row or for their adapter
    tokens_in_flight: NonNegativeInt = 0
    # the batch: rows in use, its size (0: not reported) and the prompt tokens of waiting and running
    # requests not yet prefilled; the router tells an owner with room from these (docs/routing.md)
    running: NonNegativeInt = 0
    max_running: NonNegativeInt = 0
    prefill_tokens: NonNegativeInt = 0
    evictions_per_min: NonNegativeFloat = 0.0
    loads_per_min: NonNegativeFloat = 0.0
    # how far warming has got: adapters placed on this replica, and how many of them it holds in a tier
    owned_adapters: NonNegativeInt = 0
    warm_adapters: NonNegativeInt = 0
    # a merged replica: this one adapter is folded into its base weights, and it serves nothing else
    merged_adapter_id: AdapterId | None = None
    # the paged KV cache: the share of its blocks held by requests, and the prompt tokens its prefix cache
    # was asked for and held, since the replica started
    kv_usage: NonNegativeFloat = Field(default=0.0, le=1.0)
    prefix_cache_queries: NonNegativeInt = 0
    prefix_cache_hits: NonNegativeInt = 0


class ReplicaState(Event, ReplicaStateBody):
    topic: ClassVar[topics.Topic] = topics.REPLICA_STATE
    type: Literal["replica.state"] = "replica.state"


class ReplicaEvent(Event):
    topic: ClassVar[topics.Topic] = topics.REPLICA_EVENTS
    type: Literal["replica.event"] = "replica.event"
    replica_id: ReplicaId
    kind: Literal["load", "evict"]
    adapter_id: AdapterId
    from_tier: Tier | None = None
    to_tier: Tier | None = None
    duration_s: NonNegativeFloat = 0.0
    bytes: NonNegativeInt = 0


_REQUEST_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "lorafleet/requests.completed")


def request_completed_id(tenant_id: str, request_id: str) -> uuid.UUID:
    """The event_id of a request's requests.completed: one per request, however often it is sent, so that
    consumers deduping on event_id count a resent or re-built event once. The tenant is part of it so that
    ids stay apart even if a request id were ever chosen by a client ("|" is in no tenant id)."""
    return uuid.uuid5(_REQUEST_NAMESPACE, f"{tenant_id}|{request_id}")


class RequestCompleted(Event):
    """One finished request. The public gateway sets event_id to request_completed_id(tenant_id,
    request_id) and delivers it at least once (a local spool; gateway/public/usage_events.py)."""

    topic: ClassVar[topics.Topic] = topics.REQUESTS_COMPLETED
    type: Literal["request.completed"] = "request.completed"
    request_id: str
    tenant_id: TenantId
    alias: Alias
    adapter_id: AdapterId
    replica_id: ReplicaId | None = None
    tier: Tier | None = None
    status: RequestStatus
    error_code: str | None = None
    prompt_tokens: NonNegativeInt = 0
    completion_tokens: NonNegativeInt = 0
    ttft_s: NonNegativeFloat | None = None
    total_s: NonNegativeFloat = 0.0


class AdapterStats(Event):
    topic: ClassVar[topics.Topic] = topics.ADAPTER_STATS
    type: Literal["adapter.stats"] = "adapter.stats"
    adapter_id: AdapterId
    window_start: datetime
    window_seconds: Annotated[float, Field(gt=0)]
    requests: NonNegativeInt
    tokens_per_s: NonNegativeFloat
    gpu_hit_rate: Annotated[float, Field(ge=0, le=1)]
    errors: NonNegativeInt = 0  # of its requests, those that ended in an error
    p50_ttft_s: NonNegativeFloat | None = None  # over its successful requests; None when it had none
    p95_ttft_s: NonNegativeFloat | None = None


class HotAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    adapter_id: AdapterId
    tokens_per_s: NonNegativeFloat
    owners: Annotated[int, Field(ge=1)]


class AutoscaleSignal(Event):
    topic: ClassVar[topics.Topic] = topics.AUTOSCALE_SIGNALS
    type: Literal["autoscale.signal"] = "autoscale.signal"
    fleet: str = "default"
    current_replicas: NonNegativeInt
    desired_replicas: NonNegativeInt
    reason: str
    hot_adapters: list[HotAdapter] = Field(default_factory=list)
    # Replicas over the eviction line in the window, and what its active adapters need: a GPU slot each,
    # in replicas of the fleet's slot count (0 when no replica reported its slots). The autoscaler keeps a
    # replica it added for thrashing while slot_demand says the fleet without it would thrash again.
    thrashing_replicas: NonNegativeInt = 0
    active_adapters: NonNegativeInt = 0
    slot_demand: NonNegativeInt = 0


class Alert(Event):
    topic: ClassVar[topics.Topic] = topics.ALERTS
    type: Literal["alert"] = "alert"
    subject: str  # tenant_id or replica_id
    kind: Literal["slo_ttft", "thrashing"]
    severity: Literal["warning", "critical"] = "warning"
    message: str
    value: float
    threshold: float


MergeReason = Literal["promote", "demote", "alias_moved", "retired"]


class MergedTarget(Event):
    """How many merged replicas one adapter version should have (0: none): a desired state, not a command.

    The placement worker writes it with its merged_targets row (outbox); the actuator keeps the latest per
    adapter and starts or drains dedicated merged replicas until the fleet matches, so a replay or a restart
    converges to the same fleet. tokens_per_s is the window traffic the decision was made on. fleet is the
    placement worker's replica id prefix: an actuator acts only on the targets of its own fleet, since
    several stacks may share one Kafka."""

    topic: ClassVar[topics.Topic] = topics.MERGED_TARGETS
    type: Literal["merged.target"] = "merged.target"
    adapter_id: AdapterId
    desired_replicas: NonNegativeInt
    tokens_per_s: NonNegativeFloat = 0.0
    reason: MergeReason
    fleet: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        AdapterRegistered,
        AdapterValidated,
        AliasChanged,
        ReplicaCommand,
        ReplicaState,
        ReplicaEvent,
        RequestCompleted,
        AdapterStats,
        AutoscaleSignal,
        Alert,
        MergedTarget,
    )
}

AnyEvent = Annotated[
    AdapterRegistered
    | AdapterValidated
    | AliasChanged
    | ReplicaCommand
    | ReplicaState
    | ReplicaEvent
    | RequestCompleted
    | AdapterStats
    | AutoscaleSignal
    | Alert
    | MergedTarget,
    Field(discriminator="type"),
]
_ANY = TypeAdapter(AnyEvent)


def parse_event(raw: bytes | str | dict[str, Any], topic: str | None = None) -> Event:
    """Validate raw JSON (or a dict) into its event model; EventValidationError when it does not fit."""
    try:
        event = _ANY.validate_python(raw) if isinstance(raw, dict) else _ANY.validate_json(raw)
    except ValidationError as exc:
        raise EventValidationError(f"invalid event: {exc.errors(include_url=False)}") from exc
    if topic is not None and event.topic.name != topic:
        raise EventValidationError(f"event type {event.type!r} does not belong on topic {topic!r}")
    return event


def validate_payload(event_type: str, payload: dict[str, Any]) -> Event:
    """Build an event of a named type from a payload dict, or raise EventValidationError."""
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise EventValidationError(f"unknown event type {event_type!r}")
    try:
        return cls.model_validate({**payload, "type": event_type})
    except ValidationError as exc:
        raise EventValidationError(f"invalid {event_type}: {exc.errors(include_url=False)}") from exc
