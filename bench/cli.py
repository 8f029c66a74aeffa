"""`lorafleet bench`: benchmark programs that print JSON (never timed tests)."""

from __future__ import annotations

from pathlib import Path

import typer

from bench._util import default_dtype, emit, pick_device

app = typer.Typer(no_args_is_help=True, help="Benchmarks that print JSON.")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    pairs = [s.lower().split("x") for s in text.split(",") if s.strip()]
    return tuple((int(d), int(k)) for d, k in pairs)


@app.command()
def lora(
    shapes: str = typer.Option("4096x4096,4096x11008", help="W shapes d x k (out x in), comma-separated"),
    rows: int = typer.Option(32, help="batch rows (decode tokens)"),
    rank: int = typer.Option(16),
    distinct: str = typer.Option("1,8,32", help="distinct adapters among the rows"),
    repeats: int = typer.Option(30, help="interleaved timed repeats per variant (medians reported)"),
    inner: int = typer.Option(10, help="calls averaged per timed sample"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    dtype: str | None = typer.Option(
        None, help="float32 | bfloat16 | float16 (default bf16 on GPU, fp32 on CPU)"
    ),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """Time (base + LoRA) over base alone for one adapted linear, next to the byte bound."""
    from bench.lora import LoraBenchConfig, run_lora_bench

    dev = pick_device(device)
    cfg = LoraBenchConfig(
        shapes=_shapes(shapes),
        rows=rows,
        rank=rank,
        distinct=_ints(distinct),
        repeats=repeats,
        inner=inner,
        dtype=dtype or default_dtype(dev),
        device=str(dev),
    )
    emit(run_lora_bench(cfg), out)


@app.command()
def engine(
    new_tokens: int = typer.Option(32, help="tokens generated per request (decode steps + 1)"),
    batch: int = typer.Option(32, help="concurrent requests"),
    rounds: int = typer.Option(2, help="interleaved rounds over all variants (medians reported)"),
    distinct: str = typer.Option("0,1,8,32", help="distinct adapters among the requests (0 = base)"),
    rank: int = typer.Option(16),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    dtype: str | None = typer.Option(
        None, help="float32 | bfloat16 | float16 (default bf16 on GPU, fp32 on CPU)"
    ),
    model_dir: Path | None = typer.Option(None, help="checkpoint dir (default: the prepared SmolLM2)"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
    calibration_out: Path | None = typer.Option(
        None, help="write decode step times and prefill tokens/s here"
    ),
) -> None:
    """Decode tokens/s of our engine vs transformers generate and PEFT mixed-adapter generate."""
    import json

    from bench.engine import EngineBenchConfig, run_engine_bench

    dev = pick_device(device)
    cfg = EngineBenchConfig(
        new_tokens=new_tokens,
        batch=batch,
        rounds=rounds,
        rank=rank,
        distinct=_ints(distinct),
        dtype=dtype or default_dtype(dev),
        device=str(dev),
        model_dir=model_dir,
    )
    result, calibration = run_engine_bench(cfg)
    if calibration_out is not None:
        calibration_out.write_text(json.dumps(calibration, indent=2) + "\n")
    emit(result, out)


@app.command("engine-ab")
def engine_ab_cmd(
    before: str = typer.Option(..., help="the commit to compare against (a worktree is made of it)"),
    after: str | None = typer.Option(None, help="the other commit (default: this working tree)"),
    rounds: int = typer.Option(3, help="rounds of one process per side, the sides alternating"),
    reps: int = typer.Option(2, help="timed runs per adapter count in each process"),
    new_tokens: int = typer.Option(16, help="tokens generated per request"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """Our engine's decode tokens/s at 0/1/8/32 adapters, at two commits side by side (CPU, fp32)."""
    from bench.engine_ab import engine_ab

    emit(engine_ab(before, after, rounds, reps, new_tokens), out)


@app.command("step-overhead")
def step_overhead_cmd(
    before: str = typer.Option(..., help="the commit to compare against (a worktree is made of it)"),
    after: str | None = typer.Option(None, help="the other commit (default: this working tree)"),
    rounds: int = typer.Option(3, help="rounds of one process per side, the sides alternating"),
    batch: int = typer.Option(32, help="decoding rows per step (and distinct adapters)"),
    iters: int = typer.Option(200, help="timed steps per process and adapter count"),
    context: int = typer.Option(8, help="tokens each row has cached before the timed steps"),
    max_model_len: int = typer.Option(
        64, help="the runner's longest sequence (sets the block table's width)"
    ),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """The host's cost of a decode step on a tiny base, at two commits side by side (CPU, fp32)."""
    from bench.step_overhead import step_overhead

    emit(step_overhead(before, after, rounds, batch, iters, context, max_model_len), out)


@app.command("load")
def load_cmd(
    model: str = typer.Option("smollm2-135m", help="adapter shapes: smollm2-135m | llama-7b"),
    rank: int = typer.Option(16),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    dtype: str | None = typer.Option(None, help="float32 | bfloat16 | float16"),
    repeats: int = typer.Option(7, help="timed repeats per tier (medians reported)"),
    s3: bool = typer.Option(True, help="include the object-store tier (needs the local S3)"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
    calibration_out: Path | None = typer.Option(None, help="write per-tier load times for the simulator"),
) -> None:
    """Time bringing one adapter to a GPU slot from RAM, disk and the object store, beside each floor."""
    from bench.load import load

    load(model, rank, device, dtype, repeats, s3, out, calibration_out)


@app.command()
def admission(
    quick: bool = typer.Option(False, help="one short prompt, 3 repeats, 2 background streams"),
    prompt_tokens: str = typer.Option("31,231", help="templated prompt lengths, comma-separated"),
    repeats: int = typer.Option(15, help="probes per prompt length and phase (medians reported)"),
    streams: int = typer.Option(4, help="background streams decoding during the loaded phase"),
    stream_tokens: int = typer.Option(128, help="tokens per background request"),
    model_dir: Path | None = typer.Option(None, help="checkpoint dir (default: the prepared SmolLM2)"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """Time each stage from a generate request's arrival to its first token on a real replica process."""
    import asyncio

    from bench.admission import AdmissionBenchConfig, run

    cfg = AdmissionBenchConfig(_ints(prompt_tokens), repeats, streams, stream_tokens, model_dir)
    if quick:
        cfg = AdmissionBenchConfig(cfg.prompt_tokens[:1], 3, 2, 32, model_dir)
    emit(asyncio.run(run(cfg)), out)


def _gateway_commands() -> None:
    from bench.gateway import gateway
    from bench.standin import standin
    from bench.standin_host import standin_host

    app.command("gateway")(gateway)
    app.command("standin")(standin)
    app.command("standin-host")(standin_host)


_gateway_commands()


def _edge_command() -> None:
    from bench.edge import edge

    app.command("edge")(edge)


_edge_command()


def _spool_command() -> None:
    from bench.spool_size import spool_size

    app.command("spool-size")(spool_size)


_spool_command()


def _soak_command() -> None:
    from bench.soak.driver import soak

    app.command("soak")(soak)


_soak_command()


def _scaleup_command() -> None:
    from bench.scaleup import scaleup

    app.command("scaleup")(scaleup)


_scaleup_command()


def _simgrid_command() -> None:
    from bench.simgrid import simgrid

    app.command("simgrid")(simgrid)


_simgrid_command()


def _fleet_command() -> None:
    from bench.fleet import fleet

    app.command("fleet")(fleet)


_fleet_command()


def _dominant_command() -> None:
    from bench.dominant import dominant

    app.command("dominant")(dominant)


_dominant_command()


@app.command("kv-prefix")
def kv_prefix(
    system_tokens: int = typer.Option(1000, help="tokens of each adapter's system prompt"),
    rounds: int = typer.Option(5, help="rounds over 4 adapters, cache off then on (medians reported)"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """TTFT with a seen system prompt, prefix cache on vs off, on the replica's engine (SmolLM2, CPU)."""
    from bench.kv import prefix_ttft

    emit(prefix_ttft(system_tokens, rounds), out)


@app.command("kv-capacity")
def kv_capacity(
    trace: Path = typer.Option(..., help="CSV with ContextTokens and GeneratedTokens (e.g. the Azure trace)"),
    budget_tokens: str = typer.Option(
        "64000", help="KV budgets in tokens (the brief's 7B: 64,000 = 33.6 GB)"
    ),
    max_model_len: str = typer.Option("2048,4096,8192", help="contiguous rows' length, comma-separated"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """Sequences of a trace's lengths that fit one KV budget: paged blocks vs contiguous rows."""
    from bench.kv import capacity

    runs = [capacity(trace, b, m) for b in _ints(budget_tokens) for m in _ints(max_model_len)]
    emit({"benchmark": "kv-capacity", "trace": trace.name, "runs": runs}, out)


@app.command("kv-stall")
def kv_stall(
    chunks: str = typer.Option("128,256,512,1024", help="per-step token budgets to try"),
    long_prompt: int = typer.Option(2000, help="tokens of the prompt that arrives"),
    repeats: int = typer.Option(3, help="interleaved rounds over the budgets (medians reported)"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """Longest token gap of decoding streams while a long prompt arrives, chunked vs unchunked."""
    from bench.kv import stall

    emit(stall(_ints(chunks), long_prompt, repeats), out)


@app.command()
def constrained(
    batch: int = typer.Option(32, help="concurrent requests"),
    json_rows: int = typer.Option(8, help="rows under a JSON schema in the constrained variant"),
    new_tokens: int = typer.Option(16, help="tokens generated per request"),
    rounds: int = typer.Option(3, help="interleaved rounds over both variants (medians reported)"),
    ttft_repeats: int = typer.Option(5, help="first-token timings per case (medians reported)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    dtype: str | None = typer.Option(
        None, help="float32 | bfloat16 | float16 (default bf16 on GPU, fp32 on CPU)"
    ),
    model_dir: Path | None = typer.Option(None, help="checkpoint dir (default: the prepared SmolLM2)"),
    out: Path | None = typer.Option(None, help="also write the JSON here"),
) -> None:
    """Decode tokens/s with rows under a JSON schema vs none; first-token time, new schema vs cached."""
    from bench.constrained import ConstrainedBenchConfig, run_constrained_bench

    dev = pick_device(device)
    cfg = ConstrainedBenchConfig(
        batch=batch,
        constrained=json_rows,
        new_tokens=new_tokens,
        rounds=rounds,
        ttft_repeats=ttft_repeats,
        dtype=dtype or default_dtype(dev),
        device=str(dev),
        model_dir=model_dir,
    )
    emit(run_constrained_bench(cfg), out)
