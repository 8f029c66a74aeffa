"""The replica timing model: the brief's defaults and calibration overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.timing import TimingModel, apply_calibration, fit_admission, load_timing, pool_quantiles


def test_brief_defaults_give_640_tokens_per_s_at_batch_32() -> None:
    model = TimingModel()
    assert model.decode_tokens_per_s() == pytest.approx(640.0)
    assert model.step_s(32, 32) == pytest.approx(0.050)
    assert model.step_s(32, 1) < model.step_s(32, 8) < model.step_s(32, 32)
    assert model.prefill_s(8000) == pytest.approx(1.0)
    assert model.load_s == {"gpu": 0.0, "ram": 0.008, "disk": 0.040, "remote": 0.4}


def test_engine_calibration_fits_step_time_per_distinct_adapter() -> None:
    engine = {
        "batch": 16,
        "decode_step_s": {"1": {"median": 0.021}, "8": {"median": 0.028}, "16": {"median": 0.036}},
        "prefill": {"1": {"tokens_per_s": 3000.0}, "16": {"tokens_per_s": 2800.0}},
    }
    model = apply_calibration(TimingModel(), engine)
    assert model.max_batch == 16
    assert model.per_adapter_s == pytest.approx(0.001, rel=0.05)
    assert model.step_s(16, 1) == pytest.approx(0.021, abs=5e-4)
    assert model.prefill_tokens_per_s in (2800.0, 3000.0)


def test_load_calibration_overrides_tier_times(tmp_path: Path) -> None:
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"load_s": {"ram": 0.002, "disk": 0.01, "remote": 0.05}}))
    model = load_timing([path])
    assert model.load_s == {"gpu": 0.0, "ram": 0.002, "disk": 0.01, "remote": 0.05}
    assert model.step_base_s == TimingModel().step_base_s


def test_engine_runs_at_two_batch_sizes_separate_the_per_row_cost(tmp_path: Path) -> None:
    def step(batch: int, d: int) -> float:
        return 0.02 + 0.003 * batch + 0.001 * d

    def run(batch: int, distinct: list[int]) -> dict:  # prefill: one forward, its step plus 40 tokens a row
        steps = {str(d): {"median": step(batch, d)} for d in distinct}
        prefill = {
            str(d): {"tokens": 40 * batch, "median_s": (t := step(batch, d) + 40 * batch / 500.0)}
            | {"tokens_per_s": 40 * batch / t}
            for d in distinct
        }
        return {"batch": batch, "decode_step_s": steps, "prefill": prefill}

    paths = []
    for i, data in enumerate((run(2, [1, 2]), run(8, [1, 8]))):
        paths.append(tmp_path / f"engine{i}.json")
        paths[-1].write_text(json.dumps(data))
    model = load_timing(paths)
    assert model.step_base_s == pytest.approx(0.02)
    assert model.per_row_s == pytest.approx(0.003)
    assert model.per_adapter_s == pytest.approx(0.001)
    assert model.max_batch == 8
    assert model.prefill_tokens_per_s == pytest.approx(500.0)  # net of the step the forward pass also pays
    assert model.step_s(4, 3) == pytest.approx(step(4, 3))  # interpolated between the measured batches
    assert model.step_s(16, 1) == pytest.approx(step(16, 1))  # past the last: its segment's slope


def test_measured_batch_steps_are_interpolated_not_fitted_by_a_line() -> None:
    model = TimingModel(per_adapter_s=0.01, batch_steps=((1, 0.15), (4, 0.30), (8, 0.36)))
    assert model.step_s(1, 1) == 0.15 and model.step_s(8, 1) == 0.36
    assert model.step_s(2, 1) == pytest.approx(0.20)
    assert model.step_s(6, 3) == pytest.approx(0.33 + 0.02)
    assert model.step_s(12, 1) == pytest.approx(0.42)


def test_single_request_times_separate_admission_from_prefill(tmp_path: Path) -> None:
    model = TimingModel(step_base_s=0.1, per_row_s=0.0, per_adapter_s=0.0)
    points = [{"prompt_tokens": n, "ttft_s": 0.05 + 0.1 + n / 400.0} for n in (20, 60, 180)]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"prefill_by_length": points, "step_jitter": [0.9, 1.0, 2.5], "runs": []}))
    fitted = fit_admission(model, points)
    assert fitted.admit_s == pytest.approx(0.05) and fitted.prefill_tokens_per_s == pytest.approx(400.0)
    assert load_timing([path]).prefill_tokens_per_s == pytest.approx(400.0)  # whatever the step model
    assert load_timing([path]).step_jitter == (0.9, 1.0, 2.5)


def test_calibrations_before_and_after_a_run_are_pooled(tmp_path: Path) -> None:
    def steps(scale: float, jitter: list[float]) -> dict:  # a replica_steps file; the host `scale` x slower
        return {
            "runs": [
                {"batch": b, "decode_step_s": {"1": {"median": scale * s}}} for b, s in ((1, 0.2), (8, 0.4))
            ],
            "prefill_by_length": [
                {"prompt_tokens": n, "ttft_s": scale * (0.1 + 0.2 + n / 400.0)} for n in (20, 180)
            ],
            "step_jitter": jitter,
        }

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(steps(1.0, [0.9, 1.0, 1.2])))
    after.write_text(json.dumps(steps(1.5, [1.1, 1.3, 3.0])))
    pooled = load_timing([before, after])
    assert pooled.batch_steps == (
        (1, pytest.approx(0.25)),
        (8, pytest.approx(0.5)),
    )  # each batch's step the mean of the two
    alone = [load_timing([p]) for p in (before, after)]
    assert alone[0].admit_s < pooled.admit_s < alone[1].admit_s  # fitted over both files' requests
    assert alone[1].prefill_tokens_per_s < pooled.prefill_tokens_per_s < alone[0].prefill_tokens_per_s
    assert pooled.step_jitter == (0.9, 1.1, 1.3)  # the mixture's quantiles, every second of the six
    assert load_timing([before]).step_jitter == (0.9, 1.0, 1.2)
    assert pool_quantiles([[1.0, 3.0, 5.0, 7.0], [2.0, 4.0, 6.0, 8.0]]) == (1.0, 3.0, 5.0, 7.0)
