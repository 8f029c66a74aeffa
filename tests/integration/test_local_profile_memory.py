"""A replica started the way the local stack starts one (its command line and the local profile's env)
stays within a laptop's share of memory, and still serves."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from harness.ports import free_port
from lorafleet.model.prepare import ensure_default_model
from ops.autoscale.local import replica_argv
from ops.stack.env import process_env
from ops.stack.memory import rss_bytes
from ops.stack.paths import REPO_ROOT
from ops.stack.profile import LOCAL_REPLICA_ENV

GIB = 1 << 30
# After its first answer a local-profile replica holds the weights (0.5 GiB, file pages of the mmapped
# checkpoint that every replica shares), torch, a 0.35 GiB KV cache and 0.25 GiB of LoRA slots: about
# 1.9 GiB. The production defaults (32 x 2,048 KV rows, 44 slots) hold over 5 GiB.
BOUND = int(2.2 * GIB)
TOKEN = "profile-token"


def test_a_local_profile_replica_stays_under_its_memory_bound_and_answers(tmp_path: Path) -> None:
    # the stack's env without the caller's overrides of the profile
    base = {k: v for k, v in os.environ.items() if k not in LOCAL_REPLICA_ENV}
    env = {**base, **process_env(), **LOCAL_REPLICA_ENV}
    port = free_port()
    env |= {
        "LORAFLEET_DATA_DIR": str(tmp_path),
        "LORAFLEET_REPLICA_CONTROL_ENABLED": "false",  # no Kafka, no registry: only memory is under test
        "LORAFLEET_REPLICA_REGISTRY_URL": "",
        "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_MODEL_DIR": str(ensure_default_model()),
    }
    log = (tmp_path / "replica.log").open("wb")
    argv = replica_argv("profile-0", port)
    proc = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert httpx.get(f"{url}/ready", timeout=5).status_code == 200, (tmp_path / "replica.log").read_text()
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8}
        body |= {"temperature": 0.0}
        answer = httpx.post(
            f"{url}/internal/replicas/profile-0/generate",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        assert answer.status_code == 200 and '"token"' in answer.text, answer.text
        rss = rss_bytes(proc.pid)
        assert rss is not None and rss < BOUND, f"idle replica holds {rss / GIB:.2f} GiB"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
