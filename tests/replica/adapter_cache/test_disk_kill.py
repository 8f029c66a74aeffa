"""A replica killed (SIGKILL) while it writes a disk-tier entry leaves no partial file visible: every entry
in the tier is whole (its files hash to its name), and the next start clears the staging folder."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from replica.adapter_cache.disk import ENTRY_RE, PARTIAL, DiskTier, sha256_file
from replica.lora.weights import CONFIG_NAME, WEIGHTS_NAME

REPO = Path(__file__).resolve().parents[3]
WRITER = """
import hashlib, sys
from pathlib import Path
from replica.adapter_cache.disk import DiskTier
tier = DiskTier(Path(sys.argv[1]), 96 << 20)
i = 0
while True:
    weights = bytes([i % 251]) * (24 << 20)
    config = b'{"r": %d}' % i
    digests = hashlib.sha256(weights).hexdigest(), hashlib.sha256(config).hexdigest()
    tier.write(memoryview(weights), config, *digests, None)
    i += 1
"""


def _partial_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / PARTIAL).rglob("*") if p.is_file())


def test_a_writer_killed_mid_write_leaves_only_whole_entries(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        entries: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            entries = [p for p in root.iterdir() if ENTRY_RE.fullmatch(p.name)] if root.exists() else []
            if entries and (root / PARTIAL).exists() and _partial_bytes(root) > 0:
                break  # at least one entry committed, and the next one half-written
            time.sleep(0.002)
        assert proc.poll() is None, "the writer exited on its own"
        assert entries, "no entry was committed and caught mid-write within the deadline"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    visible = [p for p in root.iterdir() if p.name != PARTIAL]
    assert visible and all(ENTRY_RE.fullmatch(p.name) for p in visible), visible
    for entry in visible:
        weights_digest, config_digest = entry.name.split("_")
        assert sorted(f.name for f in entry.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME])
        assert sha256_file(entry / WEIGHTS_NAME) == weights_digest
        assert hashlib.sha256((entry / CONFIG_NAME).read_bytes()).hexdigest() == config_digest
    tier = DiskTier(root, 96 << 20)  # the restarted replica
    assert list((root / PARTIAL).iterdir()) == []
    assert sorted(tier.names()) == sorted(p.name for p in visible)
