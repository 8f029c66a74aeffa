"""The fault soak's schedule: which fault, when, and for how long, drawn from one seed.

Pure: the same seed, length and fault kinds always give the same schedule, so a failed run replays with
`lorafleet bench soak --seed S`. Faults run one at a time: a fault's at_s is the earliest it may start
(the driver also waits for the stack to be healthy after the previous one), and down_s is how long the
faulted process stays down before it is started again (0: its supervisor restarts it at once).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

# fault kind -> (shortest, longest) time down, seconds; 0 means the supervisor restarts it at once
DOWN_S: dict[str, tuple[float, float]] = {
    "relay": (0.0, 0.0),
    "registry-validator": (0.0, 0.0),
    "placement-worker": (0.0, 0.0),
    "replica": (2.0, 6.0),
    "kafka": (3.0, 8.0),
    "postgres": (3.0, 8.0),
}
FAULTS = tuple(DOWN_S)


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule."""

    kind: str
    at_s: float  # earliest start, seconds after the traffic began
    down_s: float

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def build_schedule(
    seed: int, duration_s: float, gap_s: tuple[float, float] = (15.0, 40.0), kinds: tuple[str, ...] = FAULTS
) -> list[Fault]:
    """Rounds of every kind once, each round in a seeded order with gaps drawn from gap_s between starts,
    while a whole round still fits in duration_s at the shortest gaps; at least one round, so every kind
    is exercised."""
    unknown = set(kinds) - set(DOWN_S)
    if unknown:
        raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
    rng = random.Random(f"soak:{seed}")
    out: list[Fault] = []
    at = 0.0
    while not out or at + len(kinds) * gap_s[0] <= duration_s:
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            at += rng.uniform(*gap_s)
            low, high = DOWN_S[kind]
            out.append(Fault(kind, round(at, 1), round(rng.uniform(low, high), 1)))
    return out
