"""engine-ab measures each side in its own tree: a process for a worktree imports that tree's engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.engine_ab import OWN_TREE, REPO, side_label, worktree


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


def test_a_worktree_writes_nothing_to_stdout(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """stdout is the bench's JSON: `lorafleet bench engine-ab ... | jq` must parse."""
    tree = worktree("HEAD", tmp_path)
    try:
        assert capfd.readouterr().out == ""
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


def test_an_unknown_revision_is_refused_with_gits_reason(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no-such-rev"):
        worktree("no-such-rev", tmp_path)


def test_an_after_side_is_labelled_with_its_commit() -> None:
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert side_label("abc1234") == "abc1234"
    assert side_label(None).startswith(f"working tree at {head}")
