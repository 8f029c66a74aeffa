"""Resident memory of a process and its children, read from /proc (Linux; no extra dependency)."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def rss_bytes(pid: int) -> int | None:
    """VmRSS of one process, from /proc/PID/status; None if it is gone, a zombie or not readable."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, ValueError, IndexError):
        return None
    return None  # a zombie (or a kernel thread) has no VmRSS line


def children(pid: int) -> list[int]:
    """Direct children of pid, found by the parent field of every /proc/N/stat."""
    out = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name (field 2) may hold spaces and parentheses: the fields after its last ')' are fixed
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(entry.name))
    return out


def tree_rss_bytes(pid: int) -> int | None:
    """RSS of pid and its descendants (a postmaster's workers count as PostgreSQL's); None if pid is gone."""
    own = rss_bytes(pid)
    if own is None:
        return None
    return own + sum(tree_rss_bytes(child) or 0 for child in children(pid))


def format_bytes(n: int | None) -> str:
    """1.2 GiB, 340 MiB, or '-' when unknown."""
    if n is None:
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"
