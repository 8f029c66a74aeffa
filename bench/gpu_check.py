"""One-call GPU check: Triton LoRA kernels against the reference at 7B shapes, then decode and prefill speed.

    python bench/gpu_check.py --out gpu_check.json            # on a GPU (about 3-5 minutes on an H200)
    python bench/gpu_check.py --tiny --out /tmp/tiny.json     # CPU smoke run: tiny model, fp32, torch path

It builds a 7B-shaped Llama (32 layers, hidden 4096, MLP 11008, 32 heads, vocab 32000) with random bf16
weights (nothing is downloaded), wraps the target linears with replica.lora (one rank-16 pool of 32 slots),
and runs the replica's own ModelRunner. Decode is measured at batch 32 with 0, 1, 8 and 32 distinct adapters
two ways: `eager` (ModelRunner.run per step, Python packing included) and `graph` (the same forward captured
once in a CUDA graph and replayed, which removes the per-launch CPU cost). Ratios are against 0 adapters
measured in the same run. `floor` is the ratio the extra bytes alone allow: each distinct adapter's A and B
read once per step against all base weights. Prints one table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replica.engine.model_runner import ModelRunner, StepInput  # noqa: E402
from replica.forward_context import set_context  # noqa: E402
from replica.kernels import ops  # noqa: E402
from replica.kernels.reference import lora_expand_ref, lora_shrink_ref  # noqa: E402
from replica.kernels.segments import build_segments  # noqa: E402
from replica.lora.replace import apply_lora  # noqa: E402
from replica.lora.slots import SlotRef  # noqa: E402
from replica.model.llama import LlamaConfig, LlamaForCausalLM, rope_inv_freq  # noqa: E402

log = logging.getLogger("gpu_check")

SHAPES = {
    "7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=32),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}  # fmt: skip
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, NUM_SLOTS, BATCH = 16, 32, 32
DISTINCT = (0, 1, 8, 32)
TARGETS_RATIO = {1: 0.97, 32: 0.85}
TOLERANCE = {torch.bfloat16: (1e-2, 1.6e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-4, 1e-4)}


def build_model(shape: str, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """A Llama of the named shape with random weights, allocated directly on device in dtype."""
    raw = {
        **SHAPES[shape],
        "model_type": "llama",
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
    }
    config = LlamaConfig.from_dict(raw)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():  # [out, in] matrices get 1/sqrt(in); norm weights get ones
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            else:
                p.fill_(1.0)
    model.model.rotary_emb.inv_freq = rope_inv_freq(config).to(device)  # to_empty left it uninitialised
    return model.eval()


def add_adapters(model: LlamaForCausalLM, targets: list[str]) -> int:
    """Wrap targets with one rank-16 pool of 32 random adapters; return the bytes of one adapter."""
    wrappers = apply_lora(model, targets, {RANK: NUM_SLOTS})
    per_adapter = 0
    with torch.no_grad():
        for w in wrappers.values():
            pool = w.pools[RANK]
            pool.a.normal_(0.0, w.in_features**-0.5)  # [slots, rank, in]
            pool.b.normal_(0.0, 0.02)  # [slots, out, rank]
            pool.scale.fill_(2.0)  # alpha 32 / r 16
            per_adapter += (pool.a[0].numel() + pool.b[0].numel()) * pool.a.element_size()
    return per_adapter


def check_kernels(device: torch.device, tiny: bool) -> list[dict[str, Any]]:
    """Shrink and expand through ops (Triton on CUDA) against the reference; both launch shapes."""
    h, inter = (64, 176) if tiny else (4096, 11008)
    main_dtype = torch.float32 if tiny else torch.bfloat16
    ranks = (8, 16) if tiny else (8, 16, 32, 64)
    cases = [(main_dtype, k, d, r) for k, d in ((h, h), (h, inter), (inter, h)) for r in ranks]
    if not tiny:
        cases += [(torch.float16, h, h, 16), (torch.float32, h, h, 16)]
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for dtype, k, d, r in cases:
        for launch, n in (("gathered", BATCH), ("segmented", 160 if tiny else 1000)):
            row = dict(dtype=str(dtype).removeprefix("torch."), hidden_in=k, hidden_out=d, rank=r,
                       launch=launch, num_tokens=n)  # fmt: skip
            try:
                row.update(check_case(dtype, k, d, r, launch, n, gen))
            except Exception as exc:  # one broken case must not hide the others
                log.exception("kernel check %s failed", row)
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            rows.append(row)
    return rows


def check_case(
    dtype: torch.dtype, k: int, d: int, r: int, launch: str, n: int, gen: torch.Generator
) -> dict[str, Any]:
    """One shrink and one expand launch against the reference on random data; returns ok and the error."""
    device = gen.device
    a = (torch.randn(NUM_SLOTS, r, k, device=device, generator=gen) * k**-0.5).to(dtype)
    b = (torch.randn(NUM_SLOTS, d, r, device=device, generator=gen) * r**-0.5).to(dtype)
    scale = torch.rand(NUM_SLOTS, device=device, generator=gen) + 0.5
    if launch == "gathered":  # decode: every row its own adapter, one row on the base model
        slots = torch.randperm(NUM_SLOTS, device=device, generator=gen)[:n].to(torch.int32)
        slots[0] = -1
    else:  # prefill: runs of rows (whole prompts) on a few adapters, some on the base model
        slots = torch.randint(-1, 8, (20,), device=device, generator=gen).repeat_interleave(n // 20)
        slots = slots.to(torch.int32)
    segments = build_segments(slots) if launch == "segmented" else None
    x = torch.randn(n, k, device=device, generator=gen).to(dtype)  # [num_tokens, hidden_in]
    out = torch.randn(n, d, device=device, generator=gen).to(dtype)  # [num_tokens, hidden_out]
    t = ops.lora_shrink(x, a, slots, segments)
    t_ref = lora_shrink_ref(x, a, slots)
    out_ref = out.clone()
    ops.lora_expand(out, t_ref, b, scale, slots, segments)
    lora_expand_ref(out_ref, t_ref, b, scale, slots)
    atol, rtol = TOLERANCE[dtype]
    pairs = ((t.float(), t_ref.float()), (out.float(), out_ref.float()))
    return dict(
        ok=all(torch.allclose(g, w, atol=atol, rtol=rtol) for g, w in pairs),
        max_abs_err=max((g - w).abs().max().item() for g, w in pairs),
    )


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Any, iters: int, device: torch.device, warmup: int = 3) -> float:
    """Seconds per call of fn, after warm-up (CUDA synchronised)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / iters


def bench_kernels(device: torch.device) -> list[dict[str, Any]]:
    """Decode-shaped shrink+expand per 7B module shape (batch 32, rank 16) against the base F.linear."""
    rows = []
    for k, d in ((4096, 4096), (4096, 11008), (11008, 4096)):
        x = torch.randn(BATCH, k, device=device, dtype=torch.bfloat16)  # [num_tokens, hidden_in]
        w = torch.randn(d, k, device=device, dtype=torch.bfloat16)  # [hidden_out, hidden_in]
        base_s = time_calls(lambda x=x, w=w: torch.nn.functional.linear(x, w), 200, device)
        for distinct in (1, 32):
            lora_s, host_s = time_lora(x, d, distinct, device)
            lora_bytes = distinct * RANK * (k + d) * 2
            rows.append(dict(hidden_in=k, hidden_out=d, distinct=distinct, base_us=base_s * 1e6,
                             lora_us=lora_s * 1e6, host_us=host_s * 1e6,
                             lora_gb_per_s=lora_bytes / lora_s / 1e9))  # fmt: skip
    return rows


def time_lora(x: torch.Tensor, hidden_out: int, distinct: int, device: torch.device) -> tuple[float, float]:
    """(GPU seconds, host seconds) per shrink+expand pair on a random rank-16 pool of 32 slots."""
    a = torch.randn(NUM_SLOTS, RANK, x.shape[1], device=device, dtype=x.dtype)  # [slots, rank, hidden_in]
    b = torch.randn(NUM_SLOTS, hidden_out, RANK, device=device, dtype=x.dtype)  # [slots, hidden_out, rank]
    scale = torch.ones(NUM_SLOTS, device=device)
    out = torch.zeros(x.shape[0], hidden_out, device=device, dtype=x.dtype)
    slots = (torch.arange(x.shape[0], device=device) % distinct).to(torch.int32)

    def lora() -> None:
        ops.lora_expand(out, ops.lora_shrink(x, a, slots), b, scale, slots)

    gpu_s = time_calls(lora, 200, device)
    start = time.perf_counter()  # host cost alone: the GPU is not waited for
    for _ in range(50):
        lora()
    host_s = (time.perf_counter() - start) / 50
    synchronize(device)
    return gpu_s, host_s


def slot_for(row: int, distinct: int) -> SlotRef | None:
    """Row i uses adapter i mod distinct; None (base only) when distinct is 0."""
    return SlotRef(RANK, row % distinct) if distinct else None


def bench_decode(
    runner: ModelRunner, prompt_len: int, iters: int, graph: bool
) -> dict[str, dict[str, float]]:
    """Decode tokens/s at batch 32 for each distinct-adapter count, eager and (on CUDA) graph-replayed."""
    runner.run(
        [StepInput([1] * prompt_len, 0, runner.row_table(i)) for i in range(BATCH)]
    )  # fill the KV cache once
    result: dict[str, dict[str, float]] = {"eager": {}, "graph": {}}
    for distinct in DISTINCT:
        steps = [StepInput([2], prompt_len, runner.row_table(i), slot_for(i, distinct)) for i in range(BATCH)]
        eager = measure(lambda s=steps: time_calls(lambda: runner.run(s), iters, runner.device))
        result["eager"][str(distinct)] = BATCH / eager
        if graph:
            seconds = measure(lambda s=steps: time_calls(capture_step(runner, s), iters * 3, runner.device))
            result["graph"][str(distinct)] = BATCH / seconds
    return result


def measure(fn: Any) -> float:
    """Seconds from fn(), or NaN (logged) when it raises, so one failure leaves the other numbers."""
    try:
        return fn()
    except Exception:
        log.exception("measurement failed")
        return float("nan")


def capture_step(runner: ModelRunner, steps: list[StepInput]) -> Any:
    """Capture one decode forward (model + logits) in a CUDA graph; return its replay function."""
    model, dev = runner.model, runner.device
    ids = torch.tensor([s.token_ids[0] for s in steps], device=dev)  # [num_tokens]
    positions = torch.tensor([s.start_pos for s in steps], device=dev)  # [num_tokens]
    set_context(runner._context(steps))  # the runner's own per-step metadata, built once and reused
    try:
        with torch.inference_mode():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # compiles the Triton kernels before capture
                    model.compute_logits(model(ids, positions))
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model.compute_logits(model(ids, positions))
    finally:
        set_context(None)
    return graph.replay


def bench_prefill(runner: ModelRunner, seqs: int, length: int, iters: int) -> dict[str, float]:
    """Prefill tokens/s: `seqs` prompts of `length` tokens in one packed forward, by distinct adapters."""
    result = {}
    for distinct in (0, 1, 8):
        steps = [StepInput([3] * length, 0, runner.row_table(i), slot_for(i, distinct)) for i in range(seqs)]
        seconds = measure(lambda s=steps: time_calls(lambda: runner.run(s), iters, runner.device, 1))
        result[str(distinct)] = seqs * length / seconds
    return result


def summarize(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Rows (section, case, value) of the printed table, with ratios and targets."""
    rows = []
    bad = [r for r in report["kernel_checks"] if not r["ok"]]
    rows.append(("kernels", f"{len(report['kernel_checks'])} checks ({report['implementation']})",
                 "all ok" if not bad else f"{len(bad)} FAILED"))  # fmt: skip
    for mode, by_distinct in report["decode_tokens_per_s"].items():
        base = by_distinct.get("0", float("nan"))
        for distinct, tps in by_distinct.items():
            ratio = tps / base if base else float("nan")
            target = TARGETS_RATIO.get(int(distinct))
            floor = report["bytes_floor_ratio"][distinct]
            verdict = "" if target is None or math.isnan(ratio) else (" ok" if ratio >= target else " MISS")
            note = f"x{ratio:.3f} (floor {floor:.3f}" + (f", target {target}){verdict}" if target else ")")
            rows.append((f"decode {mode}", f"{distinct} distinct", f"{tps:,.0f} tok/s  {note}"))
    for r in report.get("kernel_timings", []):
        case = f"{r['hidden_in']}->{r['hidden_out']} x{r['distinct']}"
        value = (f"lora {r['lora_us']:.1f} us (host {r['host_us']:.1f} us, {r['lora_gb_per_s']:.0f} GB/s)"
                 f" vs base {r['base_us']:.1f} us")  # fmt: skip
        rows.append(("kernel time", case, value))
    for distinct, tps in report["prefill_tokens_per_s"].items():
        rows.append(("prefill", f"{distinct} distinct", f"{tps:,.0f} tok/s"))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="tiny fp32 model on CPU (smoke test)")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--targets", default=",".join(ALL_TARGETS), help="comma-separated target modules")
    parser.add_argument("--decode-iters", type=int, default=None)
    parser.add_argument("--prompt-len", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    torch.manual_seed(0)
    tiny = args.tiny
    device = torch.device("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if tiny else torch.bfloat16
    targets = args.targets.split(",")
    prompt_len = args.prompt_len or (8 if tiny else 128)
    decode_iters = args.decode_iters or (3 if tiny else 20)
    prefill_seqs, prefill_len = (2, 16) if tiny else (8, 512)

    report: dict[str, Any] = dict(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        shape="tiny" if tiny else "7b",
        dtype=str(dtype),
        targets=targets,
        rank=RANK,
        batch=BATCH,
        implementation=ops.implementation_for(device),
    )
    log.info("kernel checks on %s (%s)", device, report["implementation"])
    report["kernel_checks"] = check_kernels(device, tiny)
    if device.type == "cuda":
        log.info("kernel timings")
        report["kernel_timings"] = bench_kernels(device)
    log.info("building model")
    model = build_model("tiny" if tiny else "7b", dtype, device)
    base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    adapter_bytes = add_adapters(model, targets)
    report["bytes"] = dict(base=base_bytes, per_adapter=adapter_bytes)
    report["bytes_floor_ratio"] = {str(n): base_bytes / (base_bytes + n * adapter_bytes) for n in DISTINCT}
    max_len = max(prompt_len + 8, prefill_len) + 8
    runner = ModelRunner(model, max_num_seqs=BATCH, max_model_len=max_len)
    log.info("decode")
    report["decode_tokens_per_s"] = bench_decode(
        runner, prompt_len, decode_iters, graph=device.type == "cuda"
    )
    if device.type != "cuda":
        del report["decode_tokens_per_s"]["graph"]
    log.info("prefill")
    report["prefill_tokens_per_s"] = bench_prefill(runner, prefill_seqs, prefill_len, 2 if tiny else 5)
    report["prefill_shape"] = dict(seqs=prefill_seqs, tokens_per_seq=prefill_len)
    table = summarize(report)
    width = max(len(c) for _, c, _ in table)
    for section, case, value in table:
        print(f"{section:<14} {case:<{width}}  {value}")  # the bench program's output
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
