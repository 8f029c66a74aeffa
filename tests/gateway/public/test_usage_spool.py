"""The requests.completed spool: a sqlite file in a temp folder, and a real process killed with SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.public.usage_spool import Record, SpoolInUse, UsageSpool


def _records(*names: str) -> list[Record]:
    return [Record("requests.completed", f"k-{n}".encode(), f"v-{n}".encode()) for n in names]


def _values(spool: UsageSpool) -> list[bytes]:
    return [s.record.value for s in spool.oldest(100)]


def test_records_come_back_oldest_first_across_appends(tmp_path: Path) -> None:
    spool = UsageSpool.open(tmp_path / "s.sqlite", max_events=10)
    spool.append(_records("a", "b"))
    spool.append(_records("c"))
    assert _values(spool) == [b"v-a", b"v-b", b"v-c"]
    assert [s.record for s in spool.oldest(2)] == _records("a", "b")
    assert spool.count() == 3
    spool.close()


def test_delete_forgets_only_the_acknowledged(tmp_path: Path) -> None:
    spool = UsageSpool.open(tmp_path / "s.sqlite", max_events=10)
    spool.append(_records("a", "b", "c", "d"))
    a, _b, c, _d = spool.oldest(4)
    spool.delete([a.seq, c.seq, 10_000])  # an unknown seq is ignored
    assert _values(spool) == [b"v-b", b"v-d"] and spool.count() == 2
    spool.close()
    assert (tmp_path / "s.sqlite").exists()  # what waits stays for the next start


def test_a_spool_closed_empty_leaves_no_file(tmp_path: Path) -> None:
    spool = UsageSpool.open(tmp_path / "s.sqlite", max_events=10)
    spool.append(_records("a"))
    spool.delete([s.seq for s in spool.oldest(1)])
    spool.close()
    assert list(tmp_path.iterdir()) == []


def test_past_the_bound_the_newest_are_dropped_and_counted(tmp_path: Path) -> None:
    spool = UsageSpool.open(tmp_path / "s.sqlite", max_events=3)
    assert spool.append(_records("a", "b")).dropped == 0
    done = spool.append(_records("c", "d", "e"))
    assert (done.kept, done.dropped) == (1, 2)
    assert _values(spool) == [b"v-a", b"v-b", b"v-c"]
    assert spool.append(_records("f")).dropped == 1
    spool.delete([spool.oldest(1)[0].seq])  # room again once one is acknowledged
    assert spool.append(_records("g")).kept == 1
    assert _values(spool) == [b"v-b", b"v-c", b"v-g"]
    spool.close()


def test_a_killed_process_leaves_its_unacknowledged_records_and_releases_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    crash = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from gateway.public.usage_spool import Record, UsageSpool
        spool = UsageSpool.open(Path({str(path)!r}), max_events=10)
        spool.append([Record("t", b"k", b"v-%d" % i) for i in range(4)])
        spool.delete([spool.oldest(1)[0].seq])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", crash], cwd=Path(__file__).resolve().parents[3], timeout=60)
    assert proc.returncode == -9
    spool = UsageSpool.open(path, max_events=10)  # the dead process's lock is gone with it
    assert _values(spool) == [b"v-1", b"v-2", b"v-3"] and spool.count() == 3
    spool.close()


def test_a_second_process_on_the_same_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    first = UsageSpool.open(path, max_events=10)
    with pytest.raises(SpoolInUse):
        UsageSpool.open(path, max_events=10)
    first.close()
    UsageSpool.open(path, max_events=10).close()
