"""Replica settings: the one place the replica reads its environment (prefix LORAFLEET_REPLICA_)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lorafleet.config import PlatformSettings
from lorafleet.model.prepare import DEFAULT_MODEL_DIR
from lorafleet.profile import DEV_REGISTRY_READ_TOKEN, DEV_TOKEN, token_digest
from lorafleet.sizing import PRODUCTION
from schemas.response_format import SchemaLimits

SHUTDOWN_GRACE_S = 5.0  # after a drain, how long uvicorn waits for connections to close


class ReplicaSettings(BaseSettings):
    """Everything one replica process needs; built once at the entry point and passed down."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_REPLICA_", extra="ignore")

    replica_id: str = "replica-0"  # its name in replica.state, replica.commands and placements
    host: str = "127.0.0.1"  # the HTTP listener (generate, load/unload, state, drain, /ready, /metrics)
    port: int = 8100
    service_token: str = DEV_TOKEN  # the bearer token callers of its /internal routes present
    # Its sha256 (hex) instead: checked in place of service_token, so that a replica holds no token that
    # another replica's routes accept (infra/k8s gives replicas only this; docs/security.md)
    service_token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")

    model_dir: Path = DEFAULT_MODEL_DIR  # the base: a Llama checkpoint in Hugging Face layout
    # float32 | bfloat16 | float16 | auto: the production profile's (bf16) on CUDA, float32 on the CPU
    dtype: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    base_model_hash: str | None = None  # computed from the checkpoint when not given

    # The sizes default to the production profile (lorafleet/sizing.py); the local stack and the test suite
    # set smaller ones (ops/stack/profile.py, harness/env.py).
    max_num_seqs: int = PRODUCTION.max_num_seqs  # requests running at once (each holds KV blocks)
    max_model_len: int = PRODUCTION.max_model_len  # the longest sequence: a prompt plus its completion
    # Tokens computed per step: every decoding row's one, then chunks of prompts (with chunked prefill a
    # long prompt is split across steps, so decoding rows never wait behind it). At least max_num_seqs.
    max_num_batched_tokens: int = Field(default=PRODUCTION.max_num_batched_tokens, ge=1)
    # The paged KV cache (replica.kv), in blocks of this many tokens (a power of two)
    kv_block_size: int = Field(default=16, ge=1)
    kv_cache_bytes: int = Field(default=2 << 30, gt=0)  # the KV cache's size on the CPU
    # on CUDA the KV cache takes this share of the GPU's memory, less what the weights and slots take
    gpu_memory_utilization: float = Field(default=PRODUCTION.gpu_memory_utilization, gt=0, le=1)
    # decode steps replayed from CUDA graphs, one per padded batch size (CUDA with Triton; else eager)
    cuda_graphs: bool = True
    # full blocks are reused by requests with the same tokens before them, adapter version and cache salt
    enable_prefix_caching: bool = True
    # a prompt longer than the step's token budget is prefilled over several steps
    enable_chunked_prefill: bool = True
    # Which waiting request gets the next row: fair (least tokens served per tenant, see
    # replica.engine.admission_queue) or fifo; under fair, one tenant holds at most max_rows_per_tenant
    # rows (None: three quarters of max_num_seqs, so a burst leaves rows to the others).
    admission: Literal["fair", "fifo"] = "fair"
    max_rows_per_tenant: int | None = Field(default=None, ge=1)

    # rank bucket -> GPU slots in that bucket; an adapter goes to the smallest bucket >= its rank
    lora_slots: dict[int, int] = Field(default_factory=lambda: dict(PRODUCTION.lora_slots))
    max_lora_rank: int = PRODUCTION.max_lora_rank  # the largest rank it serves
    # the linears an adapter may adapt; each gets a LoRA wrapper
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    # The adapter cache: the registry (the gateway's internal API) says where a ready adapter's bytes
    # live; None serves only the local adapter directories below.
    registry_url: str | None = "http://127.0.0.1:18081"
    # the gateway's LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN: reads adapter records, registers nothing
    registry_token: str = DEV_REGISTRY_READ_TOKEN
    cache_dir: Path | None = None  # local-disk tier; default .data/adapter-cache/<replica_id>
    disk_budget_bytes: int = Field(default=PRODUCTION.disk_budget_bytes, gt=0)  # the local-disk tier's size
    # validated adapters, packed for slot copies
    ram_budget_bytes: int = Field(default=PRODUCTION.ram_budget_bytes, gt=0)
    # Requests' cold loads (adapter on no tier here: an object-store fetch) at once, per tenant and in all;
    # past either cap a request is refused (429 too_many_cold_loads / 503 cold_loads_full, Retry-After).
    cold_loads_per_tenant: int = Field(default=4, ge=1)
    cold_loads_total: int = Field(default=16, ge=1)
    # A failed adapter load is answered from memory this long (503 adapter_loading_failed + Retry-After).
    adapter_failure_ttl_s: float = Field(default=2.0, ge=0)
    # The scrubber re-hashes one disk-tier entry this often (silent media corruption; off the request path).
    disk_scrub_interval_s: float = Field(default=60.0, gt=0)

    # Kafka control loop: replica.commands in, replica.state every state_interval_s and replica.events out
    control_enabled: bool = True
    state_interval_s: float = Field(default=1.0, gt=0)
    advertise_url: str | None = None  # the URL published in replica.state; default http://host:port
    # The secret its address is registered under (replica/control/identity.py), made on the first start;
    # default <data dir>/replica-identity/<replica_id>.key. Keep it with the disk tier: lost, so is the id.
    identity_key_file: Path | None = None

    # Lifecycle: a replica warms (loads the adapters placed on it) before it reports ready, for at most
    # warming_timeout_s; a drain ends the requests still running after drain_deadline_s with an error line.
    warming_timeout_s: float = Field(default=120.0, gt=0)
    drain_deadline_s: float = Field(default=30.0, gt=0)
    lifecycle_poll_s: float = Field(default=0.25, gt=0)  # how often warming and draining look again

    # adapter_id -> local PEFT directory (served as file:// records, read only under these folders);
    # requests name adapters by id, never by path
    adapter_dirs: dict[str, Path] = Field(default_factory=dict)
    adapter_root: Path | None = None  # every subdirectory with adapter_config.json is registered by name

    merged_adapter_id: str | None = None  # dedicated replica: fold this adapter into W, serve only it

    # Structured output (response_format): a schema over a limit is refused (400, param response_format)
    # before any GPU work. The largest schema, in bytes of its canonical JSON
    structured_max_schema_bytes: int = Field(default=SchemaLimits.max_bytes, ge=2)
    # how deep a schema's objects and arrays may nest (the outermost counts 1)
    structured_max_schema_depth: int = Field(default=SchemaLimits.max_depth, ge=1)
    # how long compiling a new schema into a grammar may take (a cached one takes no time)
    structured_compile_timeout_s: float = Field(default=SchemaLimits.compile_timeout_s, gt=0)
    # compiled grammars kept, least recently used dropped first; keyed by the schema and the tokenizer
    structured_cache_size: int = Field(default=128, ge=1)

    # Fault injection for tests only: every engine step that runs a prefill sleeps this long first, so a
    # test can act on a replica while a request is in its prefill. 0 (the default) injects nothing.
    fault_prefill_delay_s: float = Field(default=0.0, ge=0)

    # Kafka and the object store (LORAFLEET_ settings shared by every process)
    platform: PlatformSettings = Field(default_factory=PlatformSettings)

    @model_validator(mode="after")
    def _kv_fits(self) -> ReplicaSettings:
        if self.kv_block_size & (self.kv_block_size - 1):
            raise ValueError(f"kv_block_size must be a power of two, got {self.kv_block_size}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs: rows decode every step")
        return self

    def model_dtype(self, device_type: str) -> str:
        """The dtype the base loads in on a device of this type ("cuda", "cpu"): the setting unless auto."""
        if self.dtype != "auto":
            return self.dtype
        return PRODUCTION.dtype if device_type == "cuda" else "float32"

    def identity_key_path(self) -> Path:
        """Where its identity key lives: the setting, else <data dir>/replica-identity/<replica_id>.key."""
        default = self.platform.data_dir / "replica-identity" / f"{self.replica_id}.key"
        return self.identity_key_file or default

    def cache_path(self) -> Path:
        return self.cache_dir or (self.platform.data_dir / "adapter-cache" / self.replica_id)

    def url(self) -> str:
        return self.advertise_url or f"http://{self.host}:{self.port}"

    def schema_limits(self) -> SchemaLimits:
        return SchemaLimits(
            self.structured_max_schema_bytes,
            self.structured_max_schema_depth,
            self.structured_compile_timeout_s,
        )

    def tenant_row_cap(self) -> int:
        """Rows one tenant may hold at once under fair admission."""
        return self.max_rows_per_tenant or max(1, self.max_num_seqs * 3 // 4)

    @field_validator("service_token_sha256", mode="before")
    @classmethod
    def _empty_digest_is_none(cls, value: object) -> object:
        return None if value == "" else value

    def service_token_digest(self) -> str:
        """The sha256 (lower-case hex) of the token its /internal routes accept ("" when it has none)."""
        if self.service_token_sha256:
            return self.service_token_sha256.lower()
        return token_digest(self.service_token) if self.service_token else ""
