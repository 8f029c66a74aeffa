"""ops dispatch: the CPU path equals the per-row loop, also when a long prefill is split into chunks."""

from __future__ import annotations

import pytest
import torch

from replica.kernels import ops
from replica.kernels.reference import lora_loop_ref


@pytest.mark.parametrize(
    ("n", "chunk_bytes"), [(37, ops.CHUNK_BYTES), (37, 4096), (300, ops.CHUNK_BYTES), (6, 4096)]
)  # 300 rows over 6 slot values takes the dense path, the others the chunked gather
def test_torch_path_equals_loop(n: int, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "CHUNK_BYTES", chunk_bytes)
    gen = torch.Generator().manual_seed(0)
    k, d, r, s = 48, 40, 16, 5
    x = torch.randn(n, k, generator=gen)
    a, b = torch.randn(s, r, k, generator=gen), torch.randn(s, d, r, generator=gen)
    scale = torch.rand(s, generator=gen)
    slots = torch.randint(-1, s, (n,), generator=gen, dtype=torch.int32)
    out = torch.randn(n, d, generator=gen)
    expected = out + lora_loop_ref(x, a, b, scale, slots)
    ops.lora_expand(out, ops.lora_shrink(x, a, slots), b, scale, slots)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    assert ops.implementation_for(torch.device("cpu")) == "torch"
