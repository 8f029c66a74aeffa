"""Train the sets a test session will need in one background process, at the lowest CPU priority, while
earlier tests run: the sets fill CPU time those tests leave idle, and a test that needs a set still being
trained waits on the set's lock rather than training it twice (demo.cache, harness.canary_training).

The background trains exactly what the test's own call would, in the same code, so it changes no result:
it only moves the training earlier. If it fails, the test's own call trains the set and reports why. While a
test that needs a set is set up (and so may wait for it), the background runs at normal priority, where the
system allows it: on a CPU busy with other jobs, a waited-for training at the lowest priority would starve.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ops.stack.paths import REPO_ROOT

log = logging.getLogger(__name__)

GRACE_S = 10.0
BACKGROUND_NICE = 19


def _demo() -> None:
    from demo.cli import prepare_adapters
    from gateway.config import GatewayConfig

    prepare_adapters(GatewayConfig.from_env())


def _e2e_canaries() -> None:
    from harness.canary_training import E2E_CANARIES, trained_canaries

    trained_canaries(E2E_CANARIES)


# the name a test gives in pytest.mark.trains(...) -> what trains (or finds) that set
TRAINERS: dict[str, Callable[[], None]] = {"demo": _demo, "e2e-canaries": _e2e_canaries}


def start(names: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """A background process, in its own process group within the caller's session, that trains the named
    sets in order."""
    unknown = set(names) - set(TRAINERS)
    if unknown:
        raise ValueError(f"no trainer for {sorted(unknown)}; known: {sorted(TRAINERS)}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "harness.pretraining", *names],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # its own process group, so stop() ends the trainers it starts too, but the tests' session: with
            # the kernel's autogroup scheduling a new session gets a CPU share of its own, whatever its nice
            process_group=0,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the process and its children if they still run (a killed training leaves no set behind)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(GRACE_S)


def hurry(proc: subprocess.Popen[bytes]) -> None:
    """Run the background at normal priority (a test may be waiting for it), if the system allows that."""
    _renice(proc, 0)


def ease(proc: subprocess.Popen[bytes]) -> None:
    """Back to the lowest priority: only what the tests leave idle."""
    _renice(proc, BACKGROUND_NICE)


def _renice(proc: subprocess.Popen[bytes], nice: int) -> None:
    if proc.poll() is not None:
        return
    try:  # the whole group: the trainers it started too
        os.setpriority(os.PRIO_PGRP, proc.pid, nice)
    except PermissionError:
        log.debug("may not set the background's priority to %d", nice)  # lowering nice needs CAP_SYS_NICE
    except ProcessLookupError:
        pass  # it has just finished


def main(names: list[str]) -> int:
    """Train each named set in turn; a failure is logged and the next set still trains."""
    os.nice(BACKGROUND_NICE)
    failed = 0
    for name in names:
        try:
            TRAINERS[name]()
            log.info("%s: ready", name)
        except Exception:
            log.exception("%s: training failed; the test that needs it trains it again", name)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main(sys.argv[1:]))
