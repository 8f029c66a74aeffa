"""Train canary LoRA adapters: each one answers any prompt with its own marker, then stops.

All canaries of a chunk train together in one batch on the frozen base (torch autograd on the CPU),
each on fresh random prompts every step. Training stops when every canary's marker wins by a logit
margin on the batch and then on held-out prompts it never saw; a teacher-forced argmax equal to the
marker at every position is exactly what a greedy decode will produce. Everything is derived from the
seed and the canary's index, so a canary's weights do not depend on which other canaries trained with it.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from tqdm import tqdm

from canary.errors import CanaryTrainingError
from canary.manifest import CanaryEntry, CanaryManifest
from canary.markers import Marker, make_markers
from canary.prompts import PromptSampler
from demo.lora import adapter_tensors, trainable, unwrap, wrap
from lorafleet.model.base_hash import base_model_hash
from lorafleet.peft_format import ModuleTensors, adapter_config, save_peft_adapter
from replica.model.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported where it runs: transformers is slow to import
    from transformers import LlamaForCausalLM

log = logging.getLogger(__name__)

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TrainConfig:
    """How canaries are trained; the defaults suit both the tiny test base and SmolLM2."""

    count: int
    seed: int = 0
    ranks: tuple[int, ...] = (8, 16, 32)  # canary i gets ranks[i % len(ranks)]
    target_modules: tuple[str, ...] = ALL_TARGETS
    alpha_over_rank: float = 2.0  # lora_alpha = 2 r, so every rank starts with the same scale
    rows_per_adapter: int = 4
    adapters_per_batch: int = 64
    max_steps: int = 400
    lr: float = 3e-3
    decay_steps: int = 150  # lr falls linearly to a tenth over these steps: large early, steady late
    check_every: int = 10
    margin: float = 2.5  # held-out goal: marker token logit minus the best other token, at every position
    check_prompts: int = 64  # held-out prompts per canary for the final check
    quick_check_prompts: int = 8  # tried first: the full check runs only once these pass


@dataclass
class TrainResult:
    manifest: CanaryManifest
    wall_s: float
    steps: list[int] = field(default_factory=list)  # steps each chunk took


@dataclass
class Batch:
    """Padded prompts+targets for a chunk, rows grouped by adapter, and where the targets sit."""

    input_ids: torch.Tensor  # [num_rows, seq] long
    attention_mask: torch.Tensor  # [num_rows, seq] long
    row: torch.Tensor  # [num_targets] long
    pos: torch.Tensor  # [num_targets] long: position whose next-token logits must be the label
    label: torch.Tensor  # [num_targets] long
    owner: torch.Tensor  # [num_targets] long: adapter index within the chunk


@dataclass
class TrainingBase:
    """The frozen base as a transformers model, plus what marker building needs."""

    model: LlamaForCausalLM  # transformers'
    tokenizer: Tokenizer | None
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    pad_id: int
    base_hash: str


def load_training_base(model_dir: Path) -> TrainingBase:
    """Load the base checkpoint as a frozen fp32 transformers Llama (autograd-ready, batched)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    has_tokenizer = (Path(model_dir) / "tokenizer.json").is_file()
    tokenizer = Tokenizer.from_dir(model_dir) if has_tokenizer else None
    cfg = model.config
    eos_id: int | None = None
    if tokenizer is not None and tokenizer.eos_token:
        eos_id = tokenizer.encode(tokenizer.eos_token)[0]  # the chat turn's end (<|im_end|> for SmolLM2)
    elif isinstance(cfg.eos_token_id, int):
        eos_id = cfg.eos_token_id
    bos_id = cfg.bos_token_id if isinstance(cfg.bos_token_id, int) else None
    pad_id = cfg.pad_token_id if isinstance(cfg.pad_token_id, int) else (eos_id or 0)
    return TrainingBase(model, tokenizer, cfg.vocab_size, eos_id, bos_id, pad_id, base_model_hash(model_dir))


def _build_batch(
    prompts: list[list[list[int]]], targets: list[list[int]], pad_id: int, device: torch.device
) -> Batch:
    """prompts[n][j]: prompt j of adapter n; targets[n]: the tokens adapter n must answer with."""
    seqs: list[list[int]] = []
    row, pos, label, owner = [], [], [], []
    for n, (rows, target) in enumerate(zip(prompts, targets, strict=True)):
        for p in rows:
            r = len(seqs)
            seqs.append(p + target[:-1])  # the last target token is predicted, never fed
            for k, t in enumerate(target):
                row.append(r)
                pos.append(len(p) - 1 + k)
                label.append(t)
                owner.append(n)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1  # right padding: positions of real tokens are unchanged

    def as_long(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long, device=device)

    return Batch(ids.to(device), mask.to(device), as_long(row), as_long(pos), as_long(label), as_long(owner))


def _target_logits(model: LlamaForCausalLM, batch: Batch) -> torch.Tensor:
    """Logits [num_targets, vocab] at the target positions only (the LM head never sees the prompts)."""
    hidden = model.model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).last_hidden_state  # [num_rows, seq, hidden]
    return model.lm_head(hidden[batch.row, batch.pos]).float()  # [num_targets, vocab]


def _per_adapter_margin(logits: torch.Tensor, batch: Batch, num_adapters: int) -> torch.Tensor:
    """Smallest (label logit - best other logit) over each adapter's targets: [num_adapters]."""
    gold = logits.gather(1, batch.label[:, None]).squeeze(1)  # [num_targets]
    other = logits.scatter(1, batch.label[:, None], float("-inf")).amax(1)  # [num_targets]
    out = torch.full((num_adapters,), float("inf"))
    return out.scatter_reduce(0, batch.owner.cpu(), (gold - other).detach().cpu(), reduce="amin")


def _per_adapter_loss(logits: torch.Tensor, batch: Batch, num_adapters: int) -> torch.Tensor:
    """Sum over adapters of each adapter's mean cross-entropy (adapters do not share gradients)."""
    ce = F.cross_entropy(logits, batch.label, reduction="none")  # [num_targets]
    sums = torch.zeros(num_adapters, device=ce.device).index_add(0, batch.owner, ce)
    counts = torch.zeros(num_adapters, device=ce.device).index_add(0, batch.owner, torch.ones_like(ce))
    return (sums / counts).sum()


class _Chunk:
    """One group of canaries training together: their wrappers, prompt streams and targets."""

    def __init__(
        self, base: TrainingBase, cfg: TrainConfig, indices: list[int], markers: list[Marker]
    ) -> None:
        self.base, self.cfg, self.indices = base, cfg, indices
        self.ranks = [cfg.ranks[i % len(cfg.ranks)] for i in indices]
        self.alphas = [cfg.alpha_over_rank * r for r in self.ranks]
        eos = [base.eos_id] if base.eos_id is not None else []
        self.targets = [list(markers[i].token_ids) + eos for i in indices]
        self.train_rngs = [random.Random(f"canary-train:{cfg.seed}:{i}") for i in indices]
        self.check_rngs = [random.Random(f"canary-check:{cfg.seed}:{i}") for i in indices]
        self.sampler = PromptSampler(base.vocab_size, base.tokenizer, base.bos_id)
        gens = [torch.Generator().manual_seed(cfg.seed * 1_000_003 + i) for i in indices]
        layers = base.model.model.layers
        self.wrappers = wrap(
            layers, list(range(len(layers))), list(cfg.target_modules), self.ranks, self.alphas, gens
        )
        self.device = next(base.model.parameters()).device

    def batch(self, rngs: list[random.Random], rows: int) -> Batch:
        prompts = [[self.sampler.sample(rng) for _ in range(rows)] for rng in rngs]
        return _build_batch(prompts, self.targets, self.base.pad_id, self.device)

    def unwrap(self) -> None:
        """Put the plain base linears back."""
        unwrap(self.base.model.model.layers, self.wrappers)

    def tensors(self, n: int) -> ModuleTensors:
        return adapter_tensors(self.wrappers, n)


def _train_chunk(chunk: _Chunk, cfg: TrainConfig, progress: bool) -> tuple[int, torch.Tensor]:
    """Optimize until the batch margin and then the held-out margin pass; return (steps, held-out margin)."""
    opt = torch.optim.Adam(trainable(chunk.wrappers), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.1, 1.0 - s / cfg.decay_steps))
    n = len(chunk.indices)
    held_out = torch.full((n,), float("-inf"))
    desc = f"canaries {chunk.indices[0]}-{chunk.indices[-1]}"
    with tqdm(total=cfg.max_steps, desc=desc, disable=not progress, unit="step") as bar:
        for step in range(1, cfg.max_steps + 1):
            batch = chunk.batch(chunk.train_rngs, cfg.rows_per_adapter)
            logits = _target_logits(chunk.base.model, batch)
            loss = _per_adapter_loss(logits, batch, n)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            if step % cfg.check_every:
                continue
            margin = _per_adapter_margin(logits, batch, n)
            bar.set_postfix(loss=f"{loss.item() / n:.3f}", min_margin=f"{margin.min().item():.2f}")
            if margin.min().item() < 2 * cfg.margin:
                continue
            if held_out_margin(chunk, cfg.quick_check_prompts).min().item() < cfg.margin:
                continue  # a few unseen prompts already fail: skip the full check's cost
            held_out = held_out_margin(chunk, cfg.check_prompts)
            if held_out.min().item() >= cfg.margin:
                return step, held_out
    return cfg.max_steps, held_out


@torch.no_grad()
def held_out_margin(chunk: _Chunk, prompts: int, rows_per_pass: int = 16) -> torch.Tensor:
    """Per-canary smallest margin on `prompts` fresh prompts it never trained on: [num_adapters].

    Each canary's prompts are sorted by length and run in passes of rows_per_pass, so a pass pads only
    to its own longest prompt rather than to the longest of all.
    """
    drawn = [sorted((chunk.sampler.sample(rng) for _ in range(prompts)), key=len) for rng in chunk.check_rngs]
    n = len(chunk.indices)
    worst = torch.full((n,), float("inf"))
    for lo in range(0, prompts, rows_per_pass):
        part = [p[lo : lo + rows_per_pass] for p in drawn]
        batch = _build_batch(part, chunk.targets, chunk.base.pad_id, chunk.device)
        worst = torch.minimum(worst, _per_adapter_margin(_target_logits(chunk.base.model, batch), batch, n))
    return worst


def train_canaries(model_dir: Path, out_dir: Path, cfg: TrainConfig, progress: bool = True) -> TrainResult:
    """Train cfg.count canaries on the base in model_dir, save them in PEFT format with a manifest."""
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    base = load_training_base(Path(model_dir))
    markers = make_markers(cfg.count, cfg.seed, base.tokenizer, base.vocab_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = CanaryManifest(
        base_model_hash=base.base_hash,
        base_model_dir=str(Path(model_dir).resolve()),
        seed=cfg.seed,
        target_modules=sorted(cfg.target_modules),
        marker_kind="text" if base.tokenizer is not None else "tokens",
    )
    steps: list[int] = []
    weak: dict[str, float] = {}
    for first in range(0, cfg.count, cfg.adapters_per_batch):
        indices = list(range(first, min(cfg.count, first + cfg.adapters_per_batch)))
        chunk = _Chunk(base, cfg, indices, markers)
        try:
            took, margin = _train_chunk(chunk, cfg, progress)
            steps.append(took)
            for n, i in enumerate(indices):
                m = markers[i]
                if margin[n].item() < cfg.margin:
                    weak[m.adapter_id] = round(margin[n].item(), 3)
                config = adapter_config(
                    chunk.ranks[n],
                    chunk.alphas[n],
                    list(cfg.target_modules),
                    str(Path(model_dir).resolve()),
                    base.base_hash,
                )
                save_peft_adapter(out_dir / m.adapter_id, chunk.tensors(n), config)
                entry = CanaryEntry(
                    m.adapter_id, m.text, list(m.token_ids), chunk.ranks[n], chunk.alphas[n], m.adapter_id
                )
                manifest.adapters.append(entry)
        finally:
            chunk.unwrap()
    wall = time.perf_counter() - start
    manifest.training = {"wall_s": round(wall, 2), "steps": steps, "config": _config_dict(cfg)}
    manifest.write(out_dir)
    log.info("trained %d canaries in %.1f s (steps per chunk %s)", cfg.count, wall, steps)
    if weak:
        raise CanaryTrainingError(f"{len(weak)} canaries are below the held-out margin", weak)
    return TrainResult(manifest, wall, steps)


def _config_dict(cfg: TrainConfig) -> dict[str, object]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.__dict__.items()}
