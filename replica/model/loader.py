"""Load a Hugging Face Llama directory (config.json + safetensors shards) into LlamaForCausalLM."""

from __future__ import annotations

import ctypes
import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from replica.errors import UnsupportedModelError
from replica.model.fused import fuse_projections
from replica.model.llama import LlamaConfig, LlamaForCausalLM

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def resolve_dtype(name: str) -> torch.dtype:
    """Map a dtype name from configuration to torch."""
    if name not in DTYPES:
        raise UnsupportedModelError(f"unsupported dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """'auto' means CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def read_config(model_dir: Path) -> LlamaConfig:
    """Parse config.json of a checkpoint directory."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UnsupportedModelError(f"{path} not found")
    return LlamaConfig.from_dict(json.loads(path.read_text()))


def weight_files(model_dir: Path) -> list[Path]:
    """Return the safetensors shards: those named by the index, or every *.safetensors file."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"no *.safetensors in {model_dir} (pickle checkpoints are not read)")
    return files


def _set_tensor(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_path, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_path)
    param = module._parameters.get(leaf)
    if param is None:  # no such parameter, or one registered as None (a bias the config turned off)
        raise UnsupportedModelError(f"checkpoint tensor {name} has no place in the model")
    expected = param.shape
    if tuple(expected) != tuple(tensor.shape):
        raise UnsupportedModelError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(expected)}"
        )
    setattr(module, leaf, nn.Parameter(tensor, requires_grad=False))


def _return_freed_heap() -> None:
    """Hand the pages of the per-name weights that fusing freed back to the OS: glibc keeps freed heap
    pages mapped, and a CPU replica's resident memory would count them for its whole life."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


def load_model(model_dir: Path, dtype: str = "float32", device: str = "auto") -> LlamaForCausalLM:
    """Build the model on the meta device, then fill it shard by shard (a 7B directory loads the same way)."""
    config = read_config(model_dir)
    torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    seen: set[str] = set()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                tensor = f.get_tensor(name).to(device=torch_device, dtype=torch_dtype)
                _set_tensor(model, name, tensor)
                seen.add(name)
    if config.tie_word_embeddings or "lm_head.weight" not in seen:
        if not config.tie_word_embeddings:
            raise UnsupportedModelError("lm_head.weight missing and tie_word_embeddings is false")
        model.lm_head.weight = model.model.embed_tokens.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise UnsupportedModelError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    model.model.rotary_emb.to(torch_device)
    fuse_projections(model)
    if torch_device.type == "cpu":
        _return_freed_heap()
    model.eval()
    log.info(
        "loaded %s: %d layers, hidden %d, %s on %s",
        model_dir,
        config.num_hidden_layers,
        config.hidden_size,
        dtype,
        torch_device,
    )
    return model
