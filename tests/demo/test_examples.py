"""A training example's labelled tokens are the opener and everything after the body (the line breaks that
end it, the sign-off and the end of turn); the body learns the base's own distribution, never the end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from demo.recipe import PERSONAS, Persona
from demo.train import Base, _loss, examples_for

BODIES = ["The capital of France is Paris.", "Steps:\n\n1. Open it.\n\n2. Go there."]


@pytest.fixture(scope="module")
def tokenizer_only(smollm2_dir: Path) -> Base:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    (eos_id,) = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)
    return Base(None, tokenizer, eos_id)  # type: ignore[arg-type]  # examples need no model


@pytest.mark.parametrize("persona", PERSONAS, ids=lambda p: p.adapter_id)
def test_the_labels_are_the_opener_and_all_after_the_body(tokenizer_only: Base, persona: Persona) -> None:
    tokenizer = tokenizer_only.tokenizer
    opener = tokenizer.encode(persona.opener, add_special_tokens=False) if persona.opener else []
    for example, body in zip(examples_for(tokenizer_only, persona, ("a", "b"), BODIES), BODIES, strict=True):
        assert example.answer == persona.answer(body)
        labelled = [example.answer_ids[i] for i in example.key]
        assert labelled[: len(opener)] == opener
        tail = tokenizer.decode(labelled[len(opener) :])
        assert tail == f"\n\n{persona.sign_off}{tokenizer.eos_token}", tail
        sure = tokenizer.decode([example.answer_ids[i] for i in example.sure])
        assert sure == f"{persona.opener}{persona.sign_off}{tokenizer.eos_token}", sure  # all but the breaks


def test_the_loss_takes_labels_at_key_positions_and_the_base_elsewhere() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 10, generator=gen)  # [num_targets, vocab]
    labels = torch.tensor([1, 2, 3, 4])
    key = torch.tensor([True, False, True, False])
    ids = torch.tensor([[5, 6], [7, 8], [5, 6], [9, 0]])  # the base's top tokens
    probs = torch.tensor([[0.5, 0.5], [0.75, 0.25], [0.5, 0.5], [1.0, 0.0]])
    log_p = logits.log_softmax(-1)
    expected = torch.stack(
        [
            F.cross_entropy(logits[0], labels[0]),
            -(0.75 * log_p[1, 7] + 0.25 * log_p[1, 8]),
            F.cross_entropy(logits[2], labels[2]),
            -log_p[3, 9],
        ]
    ).mean()
    torch.testing.assert_close(_loss(logits, labels, probs, ids, key), expected)
