"""What an adapter must fit on the served base: its decoder layers and its adaptable linears' shapes.

Read from the served model's config.json (a plain dict), so the registry needs no model code. The replica's
AdapterSpec has the same two fields (restricted to the modules it adapts) and is checked the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from schemas.llama import linear_shapes


class ModelShapes(Protocol):
    """The base as the tensor checks see it."""

    @property
    def num_layers(self) -> int: ...

    @property
    def shapes(self) -> Mapping[str, tuple[int, int]]: ...  # module name -> (in_features, out_features)


@dataclass(frozen=True)
class BaseSpec:
    """num_layers and module -> (in_features, out_features) for every adaptable linear of a Llama."""

    num_layers: int
    shapes: dict[str, tuple[int, int]]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BaseSpec:
        hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
        heads, kv_heads = int(config["num_attention_heads"]), int(config.get("num_key_value_heads", 0) or 0)
        kv_heads = kv_heads or heads
        head_dim = int(config.get("head_dim") or hidden // heads)
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        shapes = linear_shapes(hidden, inter, q_out, kv_out)
        return cls(int(config["num_hidden_layers"]), shapes)

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> BaseSpec:
        return cls.from_config(json.loads((Path(model_dir) / "config.json").read_text()))
