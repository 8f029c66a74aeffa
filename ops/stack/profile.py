"""The local profile: replica sizing for one laptop, given to every replica the local stack starts.

The replica's own defaults (replica/config.py) are the production sizing for a GPU deployment; the
local stack runs two to four CPU replicas beside Kafka, PostgreSQL and the object store, so each gets
a KV cache of 384 MiB (about 8,500 tokens), at most 8 rows, and a few LoRA slots per rank bucket. A
variable already set in the environment wins over the profile.
"""

from __future__ import annotations

import json

LOCAL_LORA_SLOTS: dict[int, int] = {8: 4, 16: 4, 32: 2, 64: 1}

LOCAL_REPLICA_ENV: dict[str, str] = {
    "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
    "LORAFLEET_REPLICA_MAX_MODEL_LEN": "1024",
    "LORAFLEET_REPLICA_MAX_NUM_BATCHED_TOKENS": "512",  # docs/benchmarks.md#the-paged-kv-cache
    "LORAFLEET_REPLICA_KV_CACHE_BYTES": str(384 << 20),  # about 8,500 tokens of SmolLM2's K and V in fp32
    "LORAFLEET_REPLICA_LORA_SLOTS": json.dumps(LOCAL_LORA_SLOTS),
    "LORAFLEET_REPLICA_RAM_BUDGET_BYTES": str(512 << 20),
    "LORAFLEET_REPLICA_DISK_BUDGET_BYTES": str(2 << 30),
}
