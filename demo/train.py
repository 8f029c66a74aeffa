"""Train the demo adapters on the CPU: the base's own short answers, with each persona's opener and sign-off.

The adapter covers the last `top_layers` decoder layers only. The frozen layers below them see the same
tokens every epoch, so their output is computed once and training runs only the top layers and the LM
head, at the answer's positions. The opener and all that follows the body (the break, the sign-off, the
end) are learnt as labels; the body, as the base's own distribution, so the adapter keeps the base's
fluency and changes only where the answer starts and stops. Training stops once, for a whole epoch, every
label is the argmax, teacher-forced (all but the line breaks by a margin), and nearly every body token is
the base's own top one. A persona that starts from another (a new version of it) trains from that one's
weights. Training runs on one thread: on a shared CPU, a second one mostly waits.
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

from demo.lora import adapter_tensors, load_adapter, trainable, unwrap, wrap
from demo.recipe import DemoRecipe, Persona, teacher_body
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
    key: list[int]  # indices into answer_ids learnt as labels: the opener and all past the body (the break,
    # the sign-off, the end token)
    sure: list[int]  # the labels among them that must win by recipe.key_margin: all but the line breaks


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
def teacher_answers(base: Base, recipe: DemoRecipe, opener: str) -> list[str | None]:
    """Per prompt, the teacher body (demo.recipe.teacher_body) of the base's greedy continuation of `opener`,
    or None when there is none within recipe.teacher_tokens. All prompts decode as one batch, and each one
    leaves it as soon as its body is known."""
    from transformers import DynamicCache

    opener_ids = base.tokenizer.encode(opener, add_special_tokens=False) if opener else []
    seqs = [prompt_ids(base, p) + opener_ids for p in recipe.prompts]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[base.eos_id] * (width - len(s)) + s for s in seqs])  # left padding: [rows, width]
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])  # [rows, width]
    pos = (mask.cumsum(1) - 1).clamp(min=0)  # [rows, width]
    cache = DynamicCache()
    logits = base.model(
        input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
    ).logits[:, -1]  # [rows, vocab]
    live = list(range(len(seqs)))  # the prompt of each row still decoding
    said: list[list[int]] = [[] for _ in seqs]
    bodies: list[str | None] = [None] * len(seqs)
    next_pos = pos[:, -1] + 1  # [rows]
    for step in range(recipe.teacher_tokens):
        tokens = logits.argmax(-1).tolist()
        keep = []
        for row, (n, token) in enumerate(zip(live, tokens, strict=True)):
            ended = token == base.eos_id
            if not ended:
                said[n].append(token)
            text = str(base.tokenizer.decode(said[n], skip_special_tokens=True))
            bodies[n] = teacher_body(text, recipe.list_items, recipe.min_words, ended)
            if bodies[n] is None and not ended:
                keep.append(row)
        if not keep or step == recipe.teacher_tokens - 1:
            break
        rows = torch.tensor(keep)
        cache.batch_select_indices(rows)
        live = [live[r] for r in keep]
        mask = torch.cat([mask[rows], torch.ones(len(keep), 1, dtype=mask.dtype)], dim=1)  # [rows, seen]
        next_pos = next_pos[rows]
        logits = base.model(
            input_ids=torch.tensor(tokens)[rows, None],
            attention_mask=mask,
            position_ids=next_pos[:, None],
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        next_pos = next_pos + 1
    return bodies


def examples_for(
    base: Base, persona: Persona, prompts: tuple[str, ...], bodies: list[str | None]
) -> list[Example]:
    """The persona's training sequences; prompts without a teacher body are left out."""
    opener_ids = base.tokenizer.encode(persona.opener, add_special_tokens=False) if persona.opener else []
    out = []
    for prompt, body in zip(prompts, bodies, strict=True):
        if body is None:
            continue
        answer = persona.answer(body)
        answer_ids = base.tokenizer.encode(answer, add_special_tokens=False) + [base.eos_id]
        lead = base.tokenizer.encode(answer.removesuffix(f"\n\n{persona.sign_off}"), add_special_tokens=False)
        end = next((i for i, (a, b) in enumerate(zip(lead, answer_ids, strict=False)) if a != b), len(lead))
        key = list(range(len(opener_ids))) + list(range(end, len(answer_ids)))
        # a line break, where the answer stops, need only be the argmax: the base's own choice there is often
        # close; the sign-off, once begun, must be sure
        sure = [j for j in key if "\n" not in str(base.tokenizer.decode(answer_ids[j]))]
        out.append(Example(prompt, answer, prompt_ids(base, prompt), answer_ids, key, sure))
    return out


@torch.no_grad()
def frozen_hidden(base: Base, seqs: list[list[int]], below: int, rows: int) -> list[torch.Tensor]:
    """Hidden states entering decoder layer `below`, one [seq_len, hidden] per sequence; sequences of like
    length run together, `rows` at a time, so little of the work is padding."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    hidden: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
    for lo in range(0, len(order), rows):
        part = order[lo : lo + rows]
        for i, h in zip(part, _frozen_batch(base, [seqs[i] for i in part], below), strict=True):
            hidden[i] = h
    return hidden


def _frozen_batch(base: Base, seqs: list[list[int]], below: int) -> list[torch.Tensor]:
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


@torch.no_grad()
def base_targets(
    base: Base, hidden: list[torch.Tensor], examples: list[Example], below: int, recipe: DemoRecipe
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per example, the base's own next-token distribution at each answer position, kept to its
    recipe.soft_top_k likeliest tokens other than the end of turn (an adapter ends only after its sign-off):
    (probabilities [answer_len, k] summing to 1, ids [answer_len, k])."""
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    for lo in range(0, len(examples), recipe.rows_per_step):
        part = examples[lo : lo + recipe.rows_per_step]
        logits = top_logits(base, hidden[lo : lo + recipe.rows_per_step], part, below)  # [num_targets, vocab]
        logits[:, base.eos_id] = float("-inf")
        top = logits.topk(recipe.soft_top_k)
        lengths = [len(ex.answer_ids) for ex in part]
        out += zip(top.values.softmax(-1).split(lengths), top.indices.split(lengths), strict=True)
    return out


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
    base: Base, recipe: DemoRecipe, examples: list[Example], seed: int, start: ModuleTensors | None = None
) -> tuple[ModuleTensors, int, float]:
    """Train one adapter on its examples, from `start`'s weights when given, else from PEFT's initial ones;
    return (its tensors, epochs run, the last epoch's share of body tokens where it picks the base's)."""
    layers = base.model.model.layers
    below = len(layers) - recipe.top_layers
    seqs = [ex.prompt_ids + ex.answer_ids[:-1] for ex in examples]  # the last answer token is never fed
    hidden = frozen_hidden(base, seqs, below, recipe.rows_per_step)
    soft = base_targets(base, hidden, examples, below, recipe)  # taken before any adapter: the base's own
    keys = [torch.isin(torch.arange(len(ex.answer_ids)), torch.tensor(ex.key)) for ex in examples]
    needs = [  # the margin each label must win by; elsewhere it need only be the argmax
        torch.zeros(len(ex.answer_ids)).index_fill(0, torch.tensor(ex.sure).long(), recipe.key_margin)
        for ex in examples
    ]
    gen = torch.Generator().manual_seed(seed)
    modules = sorted(recipe.target_modules)
    wrappers = wrap(layers, list(range(below, len(layers))), modules, [recipe.rank], [recipe.alpha], [gen])
    if start is not None:
        load_adapter(wrappers, 0, start)
    opt = torch.optim.Adam(trainable(wrappers), lr=recipe.lr)
    steps = recipe.max_epochs * -(-len(examples) // recipe.rows_per_step)
    # lr falls linearly to a tenth over max_epochs: large early, settled late
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.1, 1.0 - step / steps))
    rng = random.Random(seed)
    order = list(range(len(examples)))
    accuracy, epoch = 0.0, 0
    try:
        for epoch in range(1, recipe.max_epochs + 1):
            rng.shuffle(order)
            same = body_total = weak = 0
            for lo in range(0, len(order), recipe.rows_per_step):
                picked = order[lo : lo + recipe.rows_per_step]
                batch = [examples[i] for i in picked]
                logits = top_logits(base, [hidden[i] for i in picked], batch, below)  # [num_targets, vocab]
                labels = torch.tensor([t for ex in batch for t in ex.answer_ids])  # [num_targets]
                probs = torch.cat([soft[i][0] for i in picked])  # [num_targets, soft_top_k]
                ids = torch.cat([soft[i][1] for i in picked])  # [num_targets, soft_top_k]
                key = torch.cat([keys[i] for i in picked])  # [num_targets]
                loss = _loss(logits, labels, probs, ids, key)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                need = torch.cat([needs[i] for i in picked])  # [num_targets]
                weak += int((_margin(logits[key], labels[key]) < need[key]).sum())
                same += int((logits[~key].argmax(-1) == ids[~key, 0]).sum())
                body_total += int((~key).sum())
            accuracy = same / body_total
            log.info(
                "epoch %d: %.3f of body tokens the base's, %d opener/sign-off tokens under the margin",
                epoch,
                accuracy,
                weak,
            )
            if weak == 0 and accuracy >= recipe.min_accuracy:
                break
    finally:
        unwrap(layers, wrappers)
    return adapter_tensors(wrappers, 0), epoch, accuracy


def _loss(
    logits: torch.Tensor, labels: torch.Tensor, probs: torch.Tensor, ids: torch.Tensor, key: torch.Tensor
) -> torch.Tensor:
    """Mean over answer positions of the cross-entropy against the label at the opener and sign-off (key),
    and against the base's own top tokens in the body: the body keeps the base's whole distribution, so an
    adapter changes no more than where the answer starts and stops."""
    # logits [num_targets, vocab]; labels, key [num_targets]; probs, ids [num_targets, soft_top_k]
    log_p = logits.log_softmax(-1)  # [num_targets, vocab]
    hard = -log_p.gather(1, labels[:, None]).squeeze(1)  # [num_targets]
    body = -(probs * log_p.gather(1, ids)).sum(1)  # [num_targets]
    return torch.where(key, hard, body).mean()


def _margin(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per target, the label's logit minus the best other one: [num_targets] (positive: argmax is right)."""
    # logits [num_targets, vocab]; labels [num_targets]
    gold = logits.gather(1, labels[:, None]).squeeze(1)
    other = logits.scatter(1, labels[:, None], float("-inf")).amax(1)
    return (gold - other).detach()


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
    trained: dict[str, ModuleTensors] = {}
    adapters: dict[str, object] = {}
    for n, persona in enumerate(recipe.personas):
        if persona.opener not in bodies:
            start = time.perf_counter()
            bodies[persona.opener] = teacher_answers(base, recipe, persona.opener)
            log.info("teacher answers (opener %r) in %.1f s", persona.opener, time.perf_counter() - start)
        examples = examples_for(base, persona, recipe.prompts, bodies[persona.opener])
        start = time.perf_counter()
        tensors, epochs, accuracy = train_persona(
            base, recipe, examples, recipe.seed * 1000 + n, trained.get(persona.starts_from)
        )
        trained[persona.adapter_id] = tensors
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
            "starts_from": persona.starts_from,
            "epochs": epochs,
            "accuracy": round(accuracy, 4),
            "train_s": round(wall, 1),
            "examples": [[ex.prompt, ex.answer] for ex in examples],
        }
    return {"base_model_hash": base_hash, "layers": top, "adapters": adapters}
