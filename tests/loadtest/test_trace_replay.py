"""The load test's replay of a trace file: its schedule (count, lengths, arrival times, aliases and their
tenants) and its prompts (real text, tokenized to the requested lengths, repeatable from the seed)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from loadtest.cli import loadtest
from loadtest.client import prompt_text
from loadtest.prompts import PromptSource
from loadtest.runner import LoadTestConfig, model_for, prompts_for, replay_trace
from sim import trace as traces
from sim.workload import WorkloadConfig

MODELS = ("acme/support:prod", "acme/support:next", "globex/sales:prod")
LENGTHS = [(374, 44), (1, 109), (4083, 451), (1020, 129), (12, 7), (2500, 3)]
CSV = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{10 + 2 * i:02d}.{i}805900,{p},{o}\n" for i, (p, o) in enumerate(LENGTHS)
)


@pytest.fixture(scope="module")
def prompts(smollm2_dir: Path) -> PromptSource:
    return PromptSource(seed=1, tokenizer=smollm2_dir / "tokenizer.json")


def test_the_schedule_has_the_traces_requests_lengths_and_rescaled_arrivals(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(CSV)
    source = traces.read(path)
    trace, info = replay_trace(path, traces.ReplayConfig(rate=1.0, zipf_s=1.0, seed=5), MODELS)
    assert len(trace) == len(LENGTHS) and info["requests"] == len(LENGTHS)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace] == LENGTHS
    factor = traces.mean_rate(source) / 1.0  # 6 arrivals ~2.1 s apart, replayed at 1 req/s
    assert [r.arrival_s for r in trace] == pytest.approx([r.arrival_s * factor for r in source])
    assert trace[-1].arrival_s == pytest.approx(len(LENGTHS) - 1)
    for r in trace:
        assert model_for(r, MODELS) in MODELS and r.tenant == model_for(r, MODELS).split("/")[0]
    again, _ = replay_trace(path, traces.ReplayConfig(rate=1.0, zipf_s=1.0, seed=5), MODELS)
    assert again == trace


def test_a_window_of_the_schedule_keeps_only_its_arrivals(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(CSV)
    trace, _ = replay_trace(path, traces.ReplayConfig(duration_s=5.0, offset_s=3.0), MODELS)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace] == LENGTHS[2:4]
    assert trace[0].arrival_s == pytest.approx(1.2)


def test_prompts_are_real_text_tokenized_to_the_requested_length(prompts: PromptSource) -> None:
    for i, (tokens, _) in enumerate(LENGTHS):
        text = prompts.prompt(i, tokens)
        assert abs(prompts.count(text) - tokens) <= max(2, tokens // 100), (tokens, prompts.count(text))
        if tokens >= 1000:
            words = text.split()
            assert len(set(words)) > len(words) / 5  # prose, not a few words over and over
            assert text != prompt_text(tokens)


def test_prompts_are_repeatable_from_the_seed_and_differ_between_requests(
    prompts: PromptSource, smollm2_dir: Path
) -> None:
    same = PromptSource(seed=1, tokenizer=smollm2_dir / "tokenizer.json")
    other = PromptSource(seed=2, tokenizer=smollm2_dir / "tokenizer.json")
    assert prompts.prompt(7, 500) == same.prompt(7, 500)
    assert prompts.prompt(7, 500) != other.prompt(7, 500)
    assert prompts.prompt(7, 500) != prompts.prompt(8, 500)


def test_without_a_tokenizer_prompts_are_whole_words_of_about_the_length() -> None:
    rough = PromptSource(seed=0)
    text = rough.prompt(3, 1000)
    assert abs(rough.count(text) - 1000) <= 2
    assert max(Counter(text.split()).values()) < 100


def test_the_runner_sends_each_request_its_own_prompt(tmp_path: Path, prompts: PromptSource) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(CSV)
    trace, _ = replay_trace(path, traces.ReplayConfig(), MODELS)
    cfg = LoadTestConfig("http://unused", MODELS, {}, WorkloadConfig(), prompts=prompts)
    assert [x for x in prompts_for(cfg, trace)] == [
        prompts.prompt(r.request_id, r.prompt_tokens) for r in trace
    ]
    assert prompts_for(LoadTestConfig("http://unused", MODELS, {}, WorkloadConfig()), trace) == [None] * 6


def test_loadtest_rejects_a_bad_trace_with_its_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:10,5\n")
    app = typer.Typer()
    app.command("loadtest")(loadtest)
    app.command("noop")(lambda: None)
    args = ["loadtest", "--trace", str(path), "--report", str(tmp_path / "r")]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert "trace.csv:1: missing column GeneratedTokens" in result.output
    assert "Traceback" not in result.output
