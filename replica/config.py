"""Replica settings: the one place the replica reads its environment (prefix LORAFLEET_REPLICA_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_DIR = Path(".data/models/smollm2-135m-instruct")


class ReplicaSettings(BaseSettings):
    """Everything one replica process needs; built once at the entry point and passed down."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_REPLICA_", extra="ignore")

    replica_id: str = "replica-0"
    host: str = "127.0.0.1"
    port: int = 8100
    service_token: str = "dev-service-token"

    model_dir: Path = DEFAULT_MODEL_DIR
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    base_model_hash: str | None = None  # computed from the checkpoint when not given

    max_num_seqs: int = 32
    max_model_len: int = 2048
    max_num_batched_tokens: int = 8192  # prompt tokens admitted per step (at least one prompt)

    # rank bucket -> GPU slots in that bucket; an adapter goes to the smallest bucket >= its rank
    lora_slots: dict[int, int] = Field(default_factory=lambda: {8: 16, 16: 16, 32: 8, 64: 4})
    max_lora_rank: int = 64
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    host_cache_adapters: int = 256  # adapters kept in host RAM (validated, ready to copy into a slot)

    # adapter_id -> local PEFT directory; requests name adapters by id, never by path
    adapter_dirs: dict[str, Path] = Field(default_factory=dict)
    adapter_root: Path | None = None  # every subdirectory with adapter_config.json is registered by name

    merged_adapter_id: str | None = None  # dedicated replica: fold this adapter into W, serve only it
