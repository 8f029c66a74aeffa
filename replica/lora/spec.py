"""What an adapter must fit: the base model's adaptable linears, the rank cap and the served base hash."""

from __future__ import annotations

from dataclasses import dataclass

from replica.model.llama import LlamaConfig

# module name -> its parent block in a Llama decoder layer (PEFT keys carry both)
MODULE_PARENTS: dict[str, str] = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


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
        all_shapes = {
            "q_proj": (hidden, q_out),
            "k_proj": (hidden, kv_out),
            "v_proj": (hidden, kv_out),
            "o_proj": (q_out, hidden),
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        unknown = sorted(set(target_modules) - set(all_shapes))
        if unknown:
            raise ValueError(f"cannot adapt modules {unknown}; Llama has {sorted(all_shapes)}")
        shapes = {name: all_shapes[name] for name in target_modules}
        return cls(config.num_hidden_layers, shapes, max_rank, base_model_hash)
