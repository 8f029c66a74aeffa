"""What the fault soak recorded, as plain values: the input of the invariant checker (invariants.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Registration:
    """One registration the client sent, and what the registry holds for it at the end."""

    adapter_id: str
    acked: bool  # the internal API answered 200/202 (after retries of 503s)
    final_status: str | None  # adapters.status at the end; None when it has no row
    validated_rows: int  # adapters.validated outbox rows for it


@dataclass(frozen=True)
class AliasMove:
    """One acknowledged alias move (PUT answered 200), in acknowledgement order."""

    alias: str
    adapter_id: str
    acked_at: float


@dataclass(frozen=True)
class Chat:
    """One streaming chat as the client saw it."""

    alias: str
    status: int  # HTTP status; 0 when the client got no answer at all
    request_id: str | None  # the gateway's x-request-id; None when the client got no answer
    adapter_id: str | None  # x-adapter-id
    text: str
    error: str  # a refusal's body or the stream's error event; "" when complete
    final: bool = False  # one of the end-of-run checks of each alias
    sent_at: float = 0.0  # time.monotonic() when it was sent

    @property
    def complete(self) -> bool:
        return self.status == 200 and not self.error


@dataclass(frozen=True)
class UsageEvent:
    """One requests.completed record read from the broker (duplicates included)."""

    event_id: str
    request_id: str


@dataclass(frozen=True)
class Release:
    """What is still held at the end, as the replicas, the gateway and Redis say."""

    replica_holds: dict[str, dict[str, float]]  # replica -> {holds, KV, running/waiting metric: value}
    gateway_inflight: dict[str, float]  # in-flight tokens and requests
    ledger: dict[str, tuple[int, int]]  # tenant -> (Redis reserves, refunds) during the run
    missing: list[str] = field(default_factory=list)  # metrics the check needs that were not served


@dataclass
class Facts:
    registrations: list[Registration] = field(default_factory=list)
    initial_aliases: dict[str, str] = field(default_factory=dict)  # alias -> adapter before any move
    versions: dict[str, tuple[str, ...]] = field(default_factory=dict)  # alias -> its canary versions
    moves: list[AliasMove] = field(default_factory=list)
    chats: list[Chat] = field(default_factory=list)
    usage: list[UsageEvent] = field(default_factory=list)
    release: Release | None = None

    def expected_aliases(self) -> dict[str, str]:
        """alias -> the adapter its last acknowledged move named (its initial one if never moved)."""
        expected = dict(self.initial_aliases)
        for move in sorted(self.moves, key=lambda m: m.acked_at):
            expected[move.alias] = move.adapter_id
        return expected
