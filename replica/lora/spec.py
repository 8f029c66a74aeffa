"""What an adapter must fit: the base model's adaptable linears, the rank cap and the served base hash."""

from __future__ import annotations

from dataclasses import dataclass

from replica.model.llama import LlamaConfig
from schemas.llama import LLAMA_MODULES, linear_shapes

# module name -> its parent block in a Llama decoder layer (the shared contract in schemas.llama)
MODULE_PARENTS = LLAMA_MODULES


@dataclass(frozen=True)
class AdapterSpec:
    """The contract an adapter is validated against before it may take a slot."""

    num_layers: int
    shapes: dict[str, tuple[int, int]]  # module name -> (in_features, out_features), adapted modules only
    max_rank: int
    base_model_hash: str

    @classmethod
    def for_model(
        cls, config: LlamaConfig, target_modules: list[str], max_rank: int, base_model_hash: str
    ) -> AdapterSpec:
        """Derive the adaptable shapes from a Llama config."""
        hidden, inter = config.hidden_size, config.intermediate_size
        q_out, kv_out = (
            config.num_attention_heads * config.head_dim,
            config.num_key_value_heads * config.head_dim,
        )
        all_shapes = linear_shapes(hidden, inter, q_out, kv_out)
        unknown = sorted(set(target_modules) - set(all_shapes))
        if unknown:
            raise ValueError(f"cannot adapt modules {unknown}; Llama has {sorted(all_shapes)}")
        shapes = {name: all_shapes[name] for name in target_modules}
        return cls(config.num_hidden_layers, shapes, max_rank, base_model_hash)
