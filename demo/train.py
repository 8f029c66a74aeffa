"""Train the demo adapters on the CPU: the base's own short answers, with each persona's opener and sign-off.

The adapter covers the last `top_layers` decoder layers only. The frozen layers below them see the same
tokens every epoch, so their output is computed once and training runs only the top layers and the LM
head, at the answer's positions. Training stops once, for a whole epoch, the teacher-forced argmax is the
target at every opener and sign-off position and at nearly every other answer position (the rest are the
base's own near-ties). Training runs on one thread: on a shared CPU, a second one mostly waits.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from demo.lora import adapter_tensors, trainable, unwrap, wrap
from demo.recipe import DemoRecipe, Persona, first_sentence
from lorafleet.peft_format import ModuleTensors, adapter_config, save_peft_adapter

if TYPE_CHECKING:  # imported where it runs: transformers is slow to import
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One training sequence: the rendered prompt, then the answer the adapter must give."""

    prompt: str
    answer: str
    prompt_ids: list[int]
    answer_ids: list[int]  # ends with the end-of-turn token
    key: list[int]  # indices into answer_ids of the opener, the sign-off and the end token


@dataclass
class Base:
    """The frozen base and its tokenizer."""

    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerBase
    eos_id: int  # the end-of-turn token (<|im_end|> for SmolLM2)


def load_base(model_dir: Path) -> Base:
    """The base checkpoint as a frozen fp32 transformers Llama, with its tokenizer."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    (eos_id,) = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)
    return Base(model, tokenizer, eos_id)


def prompt_ids(base: Base, prompt: str) -> list[int]:
    """The chat template's tokens for one user turn, up to the assistant's first token."""
    text = base.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return list(base.tokenizer.encode(str(text), add_special_tokens=False))


@torch.no_grad()
def teacher_answers(base: Base, prompts: tuple[str, ...], opener: str, max_tokens: int) -> list[str | None]:
    """The first sentence of the base's greedy continuation of `opener` per prompt (None: no full one)."""
    opener_ids = base.tokenizer.encode(opener, add_special_tokens=False) if opener else []
    seqs = [prompt_ids(base, p) + opener_ids for p in prompts]
    width = max(len(s) for s in seqs)
    pad = base.eos_id
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])  # left padding: [num_prompts, width]
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    out = base.model.generate(  # type: ignore[misc]  # transformers' mixin self-type
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=base.eos_id,
        pad_token_id=pad,
    )  # [num_prompts, width + new]
    texts = base.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return [first_sentence(t.strip()) for t in texts]


def examples_for(
    base: Base, persona: Persona, prompts: tuple[str, ...], bodies: list[str | None]
) -> list[Example]:
    """The persona's training sequences; prompts whose answer has no full sentence are left out."""
    opener_ids = base.tokenizer.encode(persona.opener, add_special_tokens=False) if persona.opener else []
    out = []
    for prompt, body in zip(prompts, bodies, strict=True):
        if body is None:
            continue
        answer = persona.answer(body)
        answer_ids = base.tokenizer.encode(answer, add_special_tokens=False) + [base.eos_id]
        # the sign-off's own tokens, plus one for the line break the answer's last token may absorb
        tail = len(base.tokenizer.encode(persona.sign_off, add_special_tokens=False)) + 2
        key = list(range(len(opener_ids))) + list(range(len(answer_ids) - tail, len(answer_ids)))
        out.append(Example(prompt, answer, prompt_ids(base, prompt), answer_ids, key))
    return out


@torch.no_grad()
def frozen_hidden(base: Base, seqs: list[list[int]], below: int) -> list[torch.Tensor]:
    """Hidden states entering decoder layer `below`, one [seq_len, hidden] per sequence."""
    inner = base.model.model
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [base.eos_id] * (width - len(s)) for s in seqs])  # right padding: [rows, width]
    h = inner.embed_tokens(ids)  # [rows, width, hidden]
    pos = torch.arange(width)[None]
    rope = inner.rotary_emb(h, position_ids=pos)
    for layer in inner.layers[:below]:
        h = layer(
            h, attention_mask=None, position_ids=pos, position_embeddings=rope
        )  # causal: padding is unseen
    return [h[r, : len(s)].clone() for r, s in enumerate(seqs)]


def top_logits(base: Base, hidden: list[torch.Tensor], examples: list[Example], below: int) -> torch.Tensor:
    """Logits [num_targets, vocab] at every answer position of a batch, run from layer `below` up."""
    inner = base.model.model
    width = max(h.shape[0] for h in hidden)
    h = torch.stack(
        [F.pad(x, (0, 0, 0, width - x.shape[0])) for x in hidden]
    )  # right padding: [rows, width, hidden]
    pos = torch.arange(width)[None]
    rope = inner.rotary_emb(h, position_ids=pos)
    for layer in inner.layers[below:]:
        h = layer(
            h, attention_mask=None, position_ids=pos, position_embeddings=rope
        )  # causal: padding is unseen
    rows, cols = _target_positions(examples)
    return base.model.lm_head(inner.norm(h[rows, cols]))  # [num_targets, vocab]


def _target_positions(examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, position) of each answer token's prediction: the position just before the token."""
    rows: list[int] = []
    cols: list[int] = []
    for r, ex in enumerate(examples):
        start = len(ex.prompt_ids) - 1
        rows += [r] * len(ex.answer_ids)
        cols += range(start, start + len(ex.answer_ids))
    return torch.tensor(rows), torch.tensor(cols)


def train_persona(
    base: Base, recipe: DemoRecipe, examples: list[Example], seed: int
) -> tuple[ModuleTensors, int, float]:
    """Train one adapter on its examples; return (its tensors, epochs run, last epoch's accuracy)."""
    layers = base.model.model.layers
    below = len(layers) - recipe.top_layers
    seqs = [ex.prompt_ids + ex.answer_ids[:-1] for ex in examples]  # the last answer token is never fed
    hidden = frozen_hidden(base, seqs, below)
    gen = torch.Generator().manual_seed(seed)
    modules = sorted(recipe.target_modules)
    wrappers = wrap(layers, list(range(below, len(layers))), modules, [recipe.rank], [recipe.alpha], [gen])
    opt = torch.optim.Adam(trainable(wrappers), lr=recipe.lr)
    rng = random.Random(seed)
    order = list(range(len(examples)))
    accuracy, epoch = 0.0, 0
    try:
        for epoch in range(1, recipe.max_epochs + 1):
            rng.shuffle(order)
            right = total = key_wrong = 0
            for lo in range(0, len(order), recipe.rows_per_step):
                picked = order[lo : lo + recipe.rows_per_step]
                batch = [examples[i] for i in picked]
                logits = top_logits(base, [hidden[i] for i in picked], batch, below)
                labels = torch.tensor([t for ex in batch for t in ex.answer_ids])
                loss = F.cross_entropy(logits, labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                hit = logits.argmax(-1) == labels  # [num_targets]
                offsets = torch.tensor([0] + [len(ex.answer_ids) for ex in batch]).cumsum(0)
                key_wrong += sum(
                    int((~hit[offsets[r] + torch.tensor(ex.key)]).sum()) for r, ex in enumerate(batch)
                )
                right += int(hit.sum())
                total += len(labels)
            accuracy = right / total
            log.info(
                "epoch %d: answer-token accuracy %.3f, %d opener/sign-off misses", epoch, accuracy, key_wrong
            )
            if key_wrong == 0 and accuracy >= recipe.min_accuracy:
                break
    finally:
        unwrap(layers, wrappers)
    return adapter_tensors(wrappers, 0), epoch, accuracy


def train_demo_adapters(
    model_dir: Path, out_dir: Path, recipe: DemoRecipe, base_hash: str
) -> dict[str, object]:
    """Train every persona of the recipe on the base in model_dir, each as a PEFT folder out_dir/<adapter_id>;
    return the set's manifest: per adapter its sign-off, epochs, accuracy and training examples."""
    torch.manual_seed(recipe.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_all(model_dir, out_dir, recipe, base_hash)
    finally:
        torch.set_num_threads(threads)


def _train_all(model_dir: Path, out_dir: Path, recipe: DemoRecipe, base_hash: str) -> dict[str, object]:
    base = load_base(model_dir)
    num_layers = len(base.model.model.layers)
    top = list(range(num_layers - recipe.top_layers, num_layers))
    bodies: dict[str, list[str | None]] = {}
    adapters: dict[str, object] = {}
    for n, persona in enumerate(recipe.personas):
        if persona.opener not in bodies:
            start = time.perf_counter()
            bodies[persona.opener] = teacher_answers(
                base, recipe.prompts, persona.opener, recipe.teacher_tokens
            )
            log.info("teacher answers (opener %r) in %.1f s", persona.opener, time.perf_counter() - start)
        examples = examples_for(base, persona, recipe.prompts, bodies[persona.opener])
        start = time.perf_counter()
        tensors, epochs, accuracy = train_persona(base, recipe, examples, recipe.seed * 1000 + n)
        wall = time.perf_counter() - start
        log.info("%s: %d epochs, accuracy %.3f, %.1f s", persona.adapter_id, epochs, accuracy, wall)
        config = adapter_config(
            recipe.rank,
            recipe.alpha,
            list(recipe.target_modules),
            str(Path(model_dir).resolve()),
            base_hash,
            top,
        )
        save_peft_adapter(out_dir / persona.adapter_id, tensors, config)
        adapters[persona.adapter_id] = {
            "sign_off": persona.sign_off,
            "opener": persona.opener,
            "epochs": epochs,
            "accuracy": round(accuracy, 4),
            "train_s": round(wall, 1),
            "examples": [[ex.prompt, ex.answer] for ex in examples],
        }
    return {"base_model_hash": base_hash, "layers": top, "adapters": adapters}
