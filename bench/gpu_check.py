"""One-call GPU check on a bare machine (torch and triton only, random 7B-shaped weights, nothing downloaded).

    python bench/gpu_check.py --out gpu_check.json               # full: meant for under 8 minutes on an H200
    python bench/gpu_check.py --quick --out gpu_check.json       # reduced grid: meant for under 3 minutes
    python bench/gpu_check.py --cpu-smoke --out /tmp/smoke.json  # the same code at tiny sizes, fp32, on a CPU

Sections, in order, each with its status ("ok", "failed: ...", "skipped: ...") and wall seconds:
    kernels     LoRA shrink/expand and paged decode attention against replica.kernels.reference
    model       a Llama (32 layers, hidden 4096, MLP 11008, 32 heads, vocab 32000) with random weights on
                the device, all seven target modules wrapped with the production profile's slot pools
    kv_blocks   KV blocks, tokens and bytes the replica's budget code gives at gpu_memory_utilization 0.9
    slot_load   RAM -> GPU slot through GpuTier.load at ranks 8, 16 and 64, beside a plain copy's floor
    sampling    bench/sampling.py's sampling_cost at batch 32 and 64, when that file exists
    step_loop   32 rows decoding back to back in the engine's order (step, draw, staging, read), with and
                without the next step staged ahead, and any host sync the launches cause
    prefill     prompt tokens/s at 128, 512 and 2048 tokens, 8 prompts with 0 and 8 adapters, one mixed step
    decode      step time over batch {1,8,16,32,64} x context {128,1024,2048} x distinct {0,1,8,32}, eager
                and captured (ModelRunner(cuda_graphs=True), when it has that keyword), against the step's
                bandwidth floor
The report is rewritten (atomically) after every section and measurement, so a timeout leaves what was
measured; past --deadline-s the rest is skipped and marked. The calibration file (--calibration-out) holds
the decode steps at context 1024, the prefill and the RAM -> slot load in the format
`lorafleet simulate --calibration FILE` reads. Prints one table at the end.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_sections import (  # noqa: E402
    decode,
    kernels,
    kv_blocks,
    model,
    prefill,
    sampling,
    slot_load,
    step_loop,
)
from bench.gpu_sections.calibration import calibration  # noqa: E402
from bench.gpu_sections.common import Bench, Skipped, free_memory, write_json  # noqa: E402
from bench.gpu_sections.modes import MODES  # noqa: E402
from bench.gpu_sections.summary import table  # noqa: E402
from replica.kernels import ops  # noqa: E402

log = logging.getLogger("gpu_check")

Section = Callable[[Bench, dict[str, Any]], None]
# run in this order: the cheap ones first, decode last, so a deadline cuts only decode's grid
SECTIONS: dict[str, Section] = {
    "kernels": kernels.check,
    "model": model.build,
    "kv_blocks": kv_blocks.measure,
    "slot_load": slot_load.measure,
    "sampling": sampling.measure,
    "step_loop": step_loop.measure,
    "prefill": prefill.measure,
    "decode": decode.measure,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="reduced grid and iterations (under 3 minutes)")
    size.add_argument("--cpu-smoke", action="store_true", help="tiny fp32 model on the CPU, a few iterations")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON report")
    parser.add_argument(
        "--calibration-out",
        type=Path,
        default=None,
        help="simulator calibration (default: <out stem>.calibration.json)",
    )
    parser.add_argument(
        "--deadline-s", type=float, default=None, help="skip what is left after this many seconds"
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset, in run order")
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {list(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    mode_name = "cpu-smoke" if args.cpu_smoke else "quick" if args.quick else "full"
    mode = MODES[mode_name]
    if mode.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-smoke for the CPU smoke run")
    device = torch.device(mode.device)
    torch.manual_seed(0)
    deadline_s = args.deadline_s if args.deadline_s is not None else mode.deadline_s
    calibration_out = args.calibration_out or args.out.with_name(f"{args.out.stem}.calibration.json")
    report: dict[str, Any] = dict(
        mode=mode_name,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        triton=triton_version(),
        implementation=ops.implementation_for(device),
        dtype=str(mode.dtype).removeprefix("torch."),
        deadline_s=deadline_s,
        calibration_context=mode.calibration_context,
        calibration_out=str(calibration_out),
        sections={},
    )
    bench = Bench(mode, device, report, lambda: write_json(args.out, report), time.monotonic() + deadline_s)
    chosen = args.sections.split(",")
    for name, section in SECTIONS.items():
        if name in chosen:
            run_section(bench, name, section)
            save_calibration(report, calibration_out)
    print(table(report))  # the bench program's output
    return report


def run_section(bench: Bench, name: str, section: Section) -> None:
    """Run one section into report["sections"][name]: a failure is logged and recorded, never raised."""
    out: dict[str, Any] = {"status": "running"}
    bench.report["sections"][name] = out
    bench.save()  # a kill during the section leaves it marked running
    start = time.perf_counter()
    log.info("section %s", name)
    try:
        if bench.past_deadline():
            raise Skipped("deadline")
        section(bench, out)
        out["status"] = "ok"
    except Skipped as skip:
        out["status"] = f"skipped: {skip}"
    except Exception as exc:  # the next section still runs
        log.exception("section %s failed", name)
        out["status"] = f"failed: {type(exc).__name__}: {exc}"
    finally:
        if out["status"] == "running":  # interrupted: KeyboardInterrupt or SystemExit passes through
            out["status"] = "failed: interrupted"
        out["wall_s"] = round(time.perf_counter() - start, 3)
        bench.save()
    gc.collect()
    free_memory(bench.device)


def save_calibration(report: dict[str, Any], path: Path) -> None:
    """Write the calibration file once the report holds decode steps at the calibration context."""
    data = calibration(report)
    if data is not None:
        write_json(path, data)


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


if __name__ == "__main__":
    main()
