"""Whether a process id names a running process, for pid files and lock names."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether pid names a running process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
