"""Log-probabilities of a sampled step, gathered on the device: the chosen token's and the top-k.

They are the log-softmax of the processed logits the sampler drew from: after logit_bias and the
presence/frequency penalties, before temperature, top_k and top_p. So they do not depend on the
temperature (a greedy request gets finite values for every alternative), and a token top_p cut away still
has its logprob. Only [rows, 2 + 2k] values reach the host, never a vocabulary row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class TokenLogprobs:
    """One sampled token's logprob and the k most likely tokens' (id, logprob), most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...]


def gather(processed: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
    """Packed [rows, 2 + 2k] float64 for processed logits [rows, vocab] and chosen ids [rows] int64: the
    chosen id, its logprob, the top-k ids, then their logprobs (float64 holds every id exactly)."""
    logprobs = torch.log_softmax(processed.float(), dim=-1)  # [rows, vocab]
    picked = logprobs.gather(1, chosen[:, None])  # [rows, 1]
    values, ids = logprobs.topk(k, dim=-1) if k > 0 else (picked[:, :0], chosen[:, None][:, :0])  # [rows, k]
    return torch.cat([chosen[:, None].double(), picked.double(), ids.double(), values.double()], dim=1)


def unpack(
    packed: list[list[float]], wants: list[int | None]
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """The chosen ids and each row's logprobs (None where the row asked for none; its first wants[i] tops
    otherwise) from gather's rows, read back as lists."""
    ids: list[int] = []
    result: list[TokenLogprobs | None] = []
    for row, k in zip(packed, wants, strict=True):
        ids.append(int(row[0]))
        if k is None:
            result.append(None)
            continue
        width = (len(row) - 2) // 2
        tops = tuple((int(row[2 + j]), row[2 + width + j]) for j in range(k))
        result.append(TokenLogprobs(row[1], tops))
    return ids, result
