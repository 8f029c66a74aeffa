"""Replica: one base model, its adapters and its engine, assembled from ReplicaSettings."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from replica.config import ReplicaSettings
from replica.engine.async_engine import AsyncEngine
from replica.engine.engine import LLMEngine
from replica.engine.model_runner import ModelRunner
from replica.errors import AdapterNotFoundError, AdapterNotServedError, InvalidRequestError
from replica.lora.manager import LoraManager
from replica.lora.merge import merge_adapter
from replica.lora.registry import AdapterRegistry
from replica.lora.replace import apply_lora
from replica.lora.spec import AdapterSpec
from replica.model.base_hash import base_model_hash
from replica.model.llama import LlamaForCausalLM
from replica.model.loader import load_model
from replica.model.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterUse:
    """How a request will run: the engine's adapter id (None for base or merged) and the header values."""

    engine_adapter_id: str | None
    header_adapter_id: str | None
    tier: str | None


class Replica:
    """Everything one replica process serves; the HTTP layer calls only these methods."""

    def __init__(
        self, settings: ReplicaSettings, model: LlamaForCausalLM, tokenizer: Tokenizer | None
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.base_model_hash = settings.base_model_hash or base_model_hash(settings.model_dir)
        self.spec = AdapterSpec.for_model(
            model.config, settings.lora_target_modules, settings.max_lora_rank, self.base_model_hash
        )
        self.registry = AdapterRegistry(self.spec, settings.adapter_dirs, settings.adapter_root)
        self.merged_adapter_id = settings.merged_adapter_id
        self.lora: LoraManager | None = None
        if self.merged_adapter_id is not None:
            merge_adapter(model, self.registry.read(self.merged_adapter_id))
            log.info("merged adapter %s into the base weights", self.merged_adapter_id)
        else:
            layers = apply_lora(model, settings.lora_target_modules, settings.lora_slots)
            self.lora = LoraManager(layers, settings.lora_slots, settings.host_cache_adapters)
        runner = ModelRunner(model, settings.max_num_seqs, settings.max_model_len)
        eos = tokenizer.stop_token_ids if tokenizer is not None else set()
        factory = (lambda: IncrementalDetokenizer(tokenizer)) if tokenizer is not None else None
        self.engine = AsyncEngine(LLMEngine(runner, self.lora, eos, settings.max_num_batched_tokens, factory))

    @property
    def gpu_slots(self) -> int:
        return sum(self.settings.lora_slots.values()) if self.lora is not None else 0

    def load_adapter(self, adapter_id: str, trained_on_hash: str | None = None) -> tuple[int, float]:
        """Read, validate and put an adapter in a GPU slot; return (rank bucket, milliseconds). Blocking."""
        if self.lora is None:
            raise AdapterNotServedError(f"merged replica serves only {self.merged_adapter_id!r}")
        start = time.perf_counter()
        weights = self.registry.read(adapter_id, trained_on_hash)
        ref = self.lora.load(weights)
        return ref.bucket, (time.perf_counter() - start) * 1000

    def unload_adapter(self, adapter_id: str) -> None:
        if self.lora is None:
            raise AdapterNotServedError(f"merged replica serves only {self.merged_adapter_id!r}")
        self.lora.unload(adapter_id)

    def prepare_adapter(self, adapter_id: str | None) -> AdapterUse:
        """Make sure the request's adapter is at least in host RAM (read from disk if needed). Blocking."""
        if self.merged_adapter_id is not None:
            if adapter_id != self.merged_adapter_id:
                raise AdapterNotServedError(
                    f"this replica serves only adapter {self.merged_adapter_id!r} (merged)",
                    param="adapter_id",
                )
            return AdapterUse(None, adapter_id, "gpu")
        if adapter_id is None:
            return AdapterUse(None, None, None)
        assert self.lora is not None
        tier = self.lora.tier(adapter_id)
        if tier is None:
            if adapter_id not in self.registry:
                raise AdapterNotFoundError(
                    f"adapter {adapter_id!r} is not available on this replica", "adapter_id"
                )
            self.lora.add_to_host(self.registry.read(adapter_id))
            tier = "disk"
        return AdapterUse(adapter_id, adapter_id, tier)

    def prompt_ids(self, messages: list[dict[str, str]] | None, token_ids: list[int] | None) -> list[int]:
        """Exactly one of chat messages or token ids."""
        if (messages is None) == (token_ids is None):
            raise InvalidRequestError("send exactly one of messages or prompt_token_ids", param="messages")
        if token_ids is not None:
            return token_ids
        if self.tokenizer is None:
            raise InvalidRequestError(
                "this replica has no tokenizer; send prompt_token_ids", param="messages"
            )
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def state(self) -> dict[str, object]:
        core = self.engine.engine
        return {
            "replica_id": self.settings.replica_id,
            "base_model_hash": self.base_model_hash,
            "merged_adapter_id": self.merged_adapter_id,
            "gpu_adapters": self.lora.gpu_adapters() if self.lora else [self.merged_adapter_id],
            "ram_adapters": self.lora.ram_adapters() if self.lora else [],
            "gpu_slots": self.gpu_slots,
            "queue_depth": core.queue_depth(),
            "tokens_in_flight": core.tokens_in_flight(),
            "evictions_per_min": self.lora.evictions_per_min() if self.lora else 0.0,
        }


def build_replica(settings: ReplicaSettings) -> Replica:
    """Load the model (and tokenizer when the directory has one) and assemble the replica."""
    model = load_model(settings.model_dir, settings.dtype, settings.device)
    has_tokenizer = (Path(settings.model_dir) / "tokenizer.json").is_file()
    tokenizer = Tokenizer.from_dir(settings.model_dir) if has_tokenizer else None
    return Replica(settings, model, tokenizer)
