"""The production profile: the brief's sizes for one replica on an 80 GB GPU, in one place.

The replica's defaults (replica/config.py), the cluster files (infra/k8s, docker-compose.gpu.yml) and the
simulator's cache sizes (sim/replica.py) all read PRODUCTION; tests/project/test_production_profile.py
checks that they agree and `lorafleet profile show production` prints each of them side by side. The local
profile (ops/stack/profile.py) is what a laptop runs instead.

The arithmetic is the brief's (docs/architecture.md#sizing-from-the-brief), kept as code so that a change
to a size is checked against it: a 7B Llama-class base (32 layers, hidden 4,096, MLP 11,008) in bf16,
5,000 adapters of rank 16 on all seven projections, 26 replicas, 2 owners per adapter, 32 requests of up
to 2,000 tokens per replica.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

GIB = 1 << 30
GB = 10**9


@dataclass(frozen=True)
class BriefFleet:
    """The brief's model, GPU and fleet: the figures every size below is derived from."""

    layers: int = 32
    hidden: int = 4096
    mlp_width: int = 11008
    value_bytes: int = 2  # bf16
    gpu_bytes: int = 80 * GB
    base_bytes: int = 14 * GB  # 7B parameters in 16-bit
    working_bytes: int = 4 * GB  # activations and buffers
    rows: int = 32  # requests one replica runs at once
    tokens_per_row: int = 2000  # the longest request: prompt plus answer
    adapters: int = 5000
    replicas: int = 26
    owners: int = 2

    def adapter_bytes(self, rank: int) -> int:
        """One adapter on q, k, v, o (hidden x hidden) and gate, up, down (hidden x mlp), every layer."""
        attention = rank * (self.hidden + self.hidden)
        mlp = rank * (self.hidden + self.mlp_width)
        return (4 * attention + 3 * mlp) * self.layers * self.value_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over every layer (no grouped-query sharing in the brief's 7B)."""
        return 2 * self.layers * self.hidden * self.value_bytes

    @property
    def kv_bytes_needed(self) -> int:
        """A full batch: rows x tokens_per_row tokens of K and V."""
        return self.rows * self.tokens_per_row * self.kv_bytes_per_token

    @property
    def owned_per_replica(self) -> int:
        """Owner placements one replica holds: adapters x owners over the fleet, rounded up."""
        return math.ceil(self.adapters * self.owners / self.replicas)

    @property
    def registry_bytes(self) -> int:
        """Every adapter at rank 16."""
        return self.adapters * self.adapter_bytes(16)


BRIEF = BriefFleet()


@dataclass(frozen=True)
class ReplicaProfile:
    """The sizes a replica runs with: its GPU slots per rank pool, cache tiers, batch shape and dtype."""

    name: str
    lora_slots: dict[int, int] = field(default_factory=dict)  # rank bucket -> GPU slots
    max_lora_rank: int = 64
    ram_budget_bytes: int = 0
    disk_budget_bytes: int = 0
    dtype: str = "bfloat16"
    device: str = "cuda"
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 32
    max_model_len: int = 2048
    max_num_batched_tokens: int = 8192  # tokens one engine step computes: decode rows, then prompt chunks

    def replica_env(self) -> dict[str, str]:
        """The LORAFLEET_REPLICA_* variables that set this profile (as the cluster files write them)."""
        return {
            "LORAFLEET_REPLICA_DEVICE": self.device,
            "LORAFLEET_REPLICA_DTYPE": self.dtype,
            "LORAFLEET_REPLICA_GPU_MEMORY_UTILIZATION": str(self.gpu_memory_utilization),
            "LORAFLEET_REPLICA_MAX_NUM_SEQS": str(self.max_num_seqs),
            "LORAFLEET_REPLICA_MAX_MODEL_LEN": str(self.max_model_len),
            "LORAFLEET_REPLICA_MAX_NUM_BATCHED_TOKENS": str(self.max_num_batched_tokens),
            "LORAFLEET_REPLICA_LORA_SLOTS": json.dumps({str(k): v for k, v in self.lora_slots.items()}),
            "LORAFLEET_REPLICA_MAX_LORA_RANK": str(self.max_lora_rank),
            "LORAFLEET_REPLICA_RAM_BUDGET_BYTES": str(self.ram_budget_bytes),
            "LORAFLEET_REPLICA_DISK_BUDGET_BYTES": str(self.disk_budget_bytes),
        }


# 250 rank-16 slots are the brief's GPU cache (20 GB); a few larger slots keep every rank up to the fleet's
# cap of 64 servable, and rank-8 adapters take rank-16 slots (an adapter goes to the smallest bucket that
# holds its rank). The RAM tier holds every adapter a replica owns with room for spill copies (385 x 80 MB =
# 30.8 GB in 32 GiB); the disk tier holds its owned share four times over (spill copies and versions kept
# until their requests drain), a third of the 400 GB registry.
PRODUCTION = ReplicaProfile(
    name="production",
    lora_slots={16: 250, 32: 8, 64: 4},
    max_lora_rank=64,
    ram_budget_bytes=32 * GIB,
    disk_budget_bytes=128 * GIB,
    dtype="bfloat16",
    device="cuda",
    gpu_memory_utilization=0.9,
    max_num_seqs=BRIEF.rows,
    max_model_len=2048,
    max_num_batched_tokens=8192,
)


@dataclass(frozen=True)
class GpuBudget:
    """Where an 80 GB GPU's memory goes under a profile (bytes)."""

    total: int
    usable: int  # gpu_memory_utilization x total: weights, slots and the KV cache share it
    base: int
    slots: int
    kv: int  # what is left of usable for the KV cache
    kv_needed: int  # a full batch of the brief's requests
    outside: int  # total - usable: activations and buffers live here

    @property
    def kv_tokens(self) -> int:
        return self.kv // BRIEF.kv_bytes_per_token


def slot_bytes(profile: ReplicaProfile, brief: BriefFleet = BRIEF) -> int:
    """The GPU memory every slot pool of the profile takes (each slot sized for its bucket's rank)."""
    return sum(count * brief.adapter_bytes(rank) for rank, count in profile.lora_slots.items())


def gpu_budget(profile: ReplicaProfile, brief: BriefFleet = BRIEF) -> GpuBudget:
    """The brief's GPU under the profile: weights, slots, and what the KV cache gets of the rest."""
    usable = int(profile.gpu_memory_utilization * brief.gpu_bytes)
    slots = slot_bytes(profile, brief)
    return GpuBudget(
        total=brief.gpu_bytes,
        usable=usable,
        base=brief.base_bytes,
        slots=slots,
        kv=usable - brief.base_bytes - slots,
        kv_needed=brief.kv_bytes_needed,
        outside=brief.gpu_bytes - usable,
    )


def problems(profile: ReplicaProfile, brief: BriefFleet = BRIEF) -> list[str]:
    """Why the profile does not meet the brief on its GPU; empty when it does."""
    out = []
    rank16 = sum(count for rank, count in profile.lora_slots.items() if rank >= 16)
    if profile.lora_slots.get(16, 0) < 250:
        out.append(f"{profile.lora_slots.get(16, 0)} rank-16 slots, the brief caches 250 adapters on the GPU")
    if rank16 < brief.rows:
        out.append(f"{rank16} slots hold rank 16: {brief.rows} distinct adapters cannot be resident at once")
    if max(profile.lora_slots, default=0) < profile.max_lora_rank:
        out.append(f"no slot pool holds rank {profile.max_lora_rank}, the largest the replica serves")
    budget = gpu_budget(profile, brief)
    if budget.kv < budget.kv_needed:
        out.append(f"KV cache {budget.kv / GB:.1f} GB < {budget.kv_needed / GB:.1f} GB for a full batch")
    if budget.outside < brief.working_bytes:
        out.append(
            f"{budget.outside / GB:.1f} GB left for activations, {brief.working_bytes / GB:.0f} GB needed"
        )
    owned = brief.owned_per_replica * brief.adapter_bytes(16)
    if profile.ram_budget_bytes < owned:
        out.append(f"RAM tier {profile.ram_budget_bytes / GB:.1f} GB < {owned / GB:.1f} GB of owned adapters")
    if profile.disk_budget_bytes < profile.ram_budget_bytes:
        out.append("the disk tier is smaller than the RAM tier it backs")
    if profile.max_model_len < brief.tokens_per_row:
        out.append(f"max_model_len {profile.max_model_len} < the brief's {brief.tokens_per_row} tokens")
    return out
