"""Replica timing model: prefill throughput, decode step time by batch size and distinct adapters, and the
time to bring an adapter into a GPU slot from each tier. Defaults are the brief's; a calibration file
(`lorafleet bench engine --calibration-out`, `lorafleet bench load --calibration-out`, or
bench/replica_steps.py for a serving replica) overrides them."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schemas.tiers import LOAD_S


def _brief_load_s() -> dict[str, float]:
    return dict(LOAD_S)


@dataclass(frozen=True)
class TimingModel:
    """step_s(b, d) = step_base_s + per_row_s * b + per_adapter_s * d, plus prompt tokens / prefill rate.

    Brief defaults: 32 rows of one adapter (merged speed) take 40 ms a step, 32 rows of 32 distinct
    adapters 50 ms, so 640 output tokens/s per replica at batch 32; prefill 8,000 tokens/s.
    With batch_steps (measured (batch, seconds) with one adapter, from calibration runs at several batch
    sizes) the batch term is interpolated between the measurements instead: a CPU replica's step grows
    far from linearly with its rows.
    """

    step_base_s: float = 0.035
    per_row_s: float = 0.005 / 32
    per_adapter_s: float = 0.010 / 32
    prefill_tokens_per_s: float = 8000.0
    max_batch: int = 32
    load_s: dict[str, float] = field(default_factory=_brief_load_s)
    batch_steps: tuple[tuple[int, float], ...] = ()  # ascending batch sizes
    # from a request reaching the replica to its place in the queue for the next step: HTTP, chat template,
    # tokenizer, the hand-over to the engine thread (milliseconds on a GPU host; measured on CPU)
    admit_s: float = 0.0
    # each step takes its modelled time times one of these, drawn at random (measured step / median step
    # on the host); empty: every step takes exactly its modelled time
    step_jitter: tuple[float, ...] = ()

    def step_s(self, batch: int, distinct: int) -> float:
        if self.batch_steps:
            return _interpolate(self.batch_steps, batch) + self.per_adapter_s * max(distinct - 1, 0)
        return self.step_base_s + self.per_row_s * batch + self.per_adapter_s * distinct

    def prefill_s(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s

    def decode_tokens_per_s(self) -> float:
        """Output tokens/s of one replica at a full batch of distinct adapters (the brief's 640)."""
        return self.max_batch / self.step_s(self.max_batch, self.max_batch)


def _interpolate(points: tuple[tuple[int, float], ...], x: int) -> float:
    """Piecewise linear through the points; flat below the first, the last segment's slope past the last."""
    if x <= points[0][0] or len(points) == 1:
        return points[0][1] if x <= points[0][0] else points[-1][1]
    i = min(bisect.bisect_left([p[0] for p in points], x), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope); slope 0 with one point."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - slope * mx, slope


def apply_calibration(model: TimingModel, data: dict[str, Any]) -> TimingModel:
    """Override what a file measured: load_s (bench load), decode_step_s and prefill (bench engine)."""
    out = model
    if "load_s" in data:
        out = replace(out, load_s={**out.load_s, **{k: float(v) for k, v in data["load_s"].items()}})
    if "decode_step_s" in data:
        points = sorted((int(d), float(v["median"])) for d, v in data["decode_step_s"].items())
        intercept, slope = _fit_line([d for d, _ in points], [s for _, s in points])
        batch = int(data.get("batch", out.max_batch))
        # The bench measures one batch size, so the per-row share is not separable: fold it into the base.
        out = replace(out, step_base_s=max(intercept, 0.0), per_row_s=0.0, per_adapter_s=max(slope, 0.0))
        out = replace(out, max_batch=batch)
    if data.get("step_jitter"):
        out = replace(out, step_jitter=tuple(float(x) for x in data["step_jitter"]))
    if "prefill" in data:
        rates = sorted(
            float(v["tokens_per_s"]) if "tokens_per_s" in v else v["tokens"] / v["median_s"]
            for v in data["prefill"].values()
        )
        out = replace(out, prefill_tokens_per_s=rates[len(rates) // 2])
    return out


def fit_steps(model: TimingModel, engine_runs: list[dict[str, Any]]) -> TimingModel:
    """per_adapter_s (and the linear base and per-row terms) by least squares over every run's points, and
    the measured step at each batch size for interpolation (needs runs at two or more batch sizes);
    max_batch is the largest batch measured."""
    import numpy as np

    rows, times = [], []
    for data in engine_runs:
        batch = int(data["batch"])
        for d, v in data["decode_step_s"].items():
            rows.append([1.0, batch, int(d)])
            times.append(float(v["median"]))
    (base, per_row, per_adapter), *_ = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)
    per_adapter = max(float(per_adapter), 0.0)
    at_batch: dict[int, list[float]] = {}  # each point brought back to one adapter
    for data in engine_runs:
        for d, v in data["decode_step_s"].items():
            at_batch.setdefault(int(data["batch"]), []).append(
                float(v["median"]) - per_adapter * (int(d) - 1)
            )
    return replace(
        model,
        step_base_s=max(float(base), 0.0),
        per_row_s=max(float(per_row), 0.0),
        per_adapter_s=per_adapter,
        max_batch=max(at_batch),
        batch_steps=tuple((b, sum(v) / len(v)) for b, v in sorted(at_batch.items())),
    )


def marginal_prefill(model: TimingModel, engine_runs: list[dict[str, Any]]) -> float | None:
    """Prefill tokens/s beyond the step's own cost: the bench times its prefill as one whole forward pass,
    which pays step_s(batch, distinct) as well, and the model adds prompt tokens / rate on top of that."""
    rates = []
    for data in engine_runs:
        batch = int(data.get("batch", model.max_batch))
        for d, v in data.get("prefill", {}).items():
            if "median_s" in v and "tokens" in v:
                extra = float(v["median_s"]) - model.step_s(batch, int(d))
                if extra > 0:
                    rates.append(float(v["tokens"]) / extra)
    return sorted(rates)[len(rates) // 2] if rates else None


def fit_admission(model: TimingModel, by_length: list[dict[str, float]]) -> TimingModel:
    """ttft = admit_s + step_s(1, 1) + prompt tokens / rate, least squares over single requests' times to
    first token at several prompt lengths (bench/replica_steps.py)."""
    import numpy as np

    rows = [[1.0, p["prompt_tokens"]] for p in by_length]
    extra = [p["ttft_s"] - model.step_s(1, 1) for p in by_length]
    (admit, per_token), *_ = np.linalg.lstsq(np.array(rows), np.array(extra), rcond=None)
    rate = 1.0 / float(per_token) if per_token > 0 else model.prefill_tokens_per_s
    return replace(model, admit_s=max(float(admit), 0.0), prefill_tokens_per_s=rate)


def pool_quantiles(spreads: list[list[float]]) -> tuple[float, ...]:
    """Several measurements' quantiles of one spread (equal counts each) as the quantiles of their mixture:
    all values sorted, every len(spreads)-th kept from the first. One measurement comes back as it is."""
    merged = sorted(x for s in spreads for x in s)
    return tuple(merged[:: len(spreads)])


def load_timing(paths: list[Path]) -> TimingModel:
    """The brief's model with each calibration file applied in order; engine runs at two or more batch
    sizes are fitted together, which separates the per-row cost from the fixed one; the prefill rate is
    taken net of the step cost, and with single-request times at several prompt lengths the fixed cost of
    admitting a request is separated from it too. Several replica_steps files (the host measured before and
    after a run) are pooled: each batch size's step is the mean of theirs, admission and prefill are fitted
    over all their single requests, and the step spread is their mixture's."""
    model = TimingModel()
    engine_runs = []
    by_length: list[dict[str, float]] = []
    spreads: list[list[float]] = []
    for path in paths:
        data = json.loads(path.read_text())
        by_length += data.get("prefill_by_length", [])
        if "runs" in data and data.get("step_jitter"):  # the spread is the host's, beside the runs
            spreads.append([float(x) for x in data["step_jitter"]])
        for part in data.get("runs", [data]):  # bench/replica_steps.py writes one run per batch size
            model = apply_calibration(model, part)
            if "decode_step_s" in part:
                engine_runs.append(part)
    if spreads:
        model = replace(model, step_jitter=pool_quantiles(spreads))
    if len({int(d.get("batch", 0)) for d in engine_runs}) > 1:
        model = fit_steps(model, engine_runs)
    if len({p["prompt_tokens"] for p in by_length}) > 1:
        return fit_admission(model, by_length)
    rate = marginal_prefill(model, engine_runs)
    return model if rate is None else replace(model, prefill_tokens_per_s=rate)
