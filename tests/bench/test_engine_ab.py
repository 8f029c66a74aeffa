"""engine-ab measures each side in its own tree: a process for a worktree imports that tree's engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.engine_ab import OWN_TREE, REPO, worktree


def test_a_side_imports_its_own_trees_engine_not_the_installed_one(tmp_path: Path) -> None:
    tree = worktree("HEAD", tmp_path)
    try:
        probe = OWN_TREE + "\nimport replica.engine.engine as e\nprint(be.__file__)\nprint(e.__file__)\n"
        done = subprocess.run(
            [sys.executable, "-c", probe, str(tree)], capture_output=True, text=True, check=True
        )
        files = done.stdout.split()
        assert len(files) == 2 and all(f.startswith(str(tree)) for f in files), done.stdout
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
