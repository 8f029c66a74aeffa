"""The adapter contract on a Llama base, shared by the registry and the replica: which linears an adapter
may target, where each sits in a decoder layer (PEFT keys carry both), and each one's shape."""

from __future__ import annotations

# module name -> the block it sits in inside a Llama decoder layer
LLAMA_MODULES: dict[str, str] = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def linear_shapes(hidden: int, intermediate: int, q_out: int, kv_out: int) -> dict[str, tuple[int, int]]:
    """module name -> (in_features, out_features) for every adaptable linear of a Llama layer."""
    return {
        "q_proj": (hidden, q_out),
        "k_proj": (hidden, kv_out),
        "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }
