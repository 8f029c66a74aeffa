"""Load a Hugging Face Llama directory (config.json + safetensors shards) into LlamaForCausalLM."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from replica.errors import UnsupportedModelError
from replica.model.fused import FusedLinear, fuse_projections
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


def _allocate(model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Give every parameter of the meta-built model uninitialised memory of its own on the device.

    The loader then copies each checkpoint tensor into its place, converting dtype and device in that one
    copy. Nothing keeps the checkpoint's file mapping alive afterwards, and a fused projection is never
    built by concatenating loaded parts (which held the parts' pages and the fused copy at once).
    """
    allocated: dict[int, nn.Parameter] = {}  # a tied weight stays one tensor
    for module in model.modules():
        for leaf, param in module._parameters.items():
            if param is None or not param.is_meta:
                continue
            if id(param) not in allocated:
                memory = torch.empty(param.shape, dtype=dtype, device=device)
                allocated[id(param)] = nn.Parameter(memory, requires_grad=False)
            module._parameters[leaf] = allocated[id(param)]
        if isinstance(module, FusedLinear):
            module.point_parts()  # q/k/v and gate/up become views of the fused memory


def _fill(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Copy one checkpoint tensor into the model's memory for that name (a parameter or a fused view)."""
    module_path, _, leaf = name.rpartition(".")
    try:
        target = getattr(model.get_submodule(module_path), leaf, None)
    except AttributeError:
        target = None
    if not isinstance(target, torch.Tensor):  # no such tensor, or a bias the config turned off
        raise UnsupportedModelError(f"checkpoint tensor {name} has no place in the model")
    if tuple(target.shape) != tuple(tensor.shape):
        shapes = f"checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}"
        raise UnsupportedModelError(f"{name}: {shapes}")
    with torch.no_grad():
        target.copy_(tensor)


def load_model(model_dir: Path, dtype: str = "float32", device: str = "auto") -> LlamaForCausalLM:
    """Build the model on the meta device, then fill it shard by shard (a 7B directory loads the same way)."""
    config = read_config(model_dir)
    torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = [name for name, _ in model.named_parameters()]  # a tied lm_head is the embedding's name
    fuse_projections(model)
    _allocate(model, torch_dtype, torch_device)
    skipped = {"lm_head.weight"} if config.tie_word_embeddings else set()  # the embedding serves as the head
    seen: set[str] = set()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES) or name in skipped:
                    continue
                _fill(model, name, f.get_tensor(name))
                seen.add(name)
    if "lm_head.weight" in expected and "lm_head.weight" not in seen:
        raise UnsupportedModelError("lm_head.weight missing and tie_word_embeddings is false")
    missing = [name for name in expected if name not in seen]
    if missing:
        raise UnsupportedModelError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    model.model.rotary_emb.to(torch_device)
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
