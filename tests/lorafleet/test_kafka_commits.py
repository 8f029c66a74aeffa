"""Offsets are committed only after their event's effect: no consumer the fleet builds auto-commits."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from tests.project.project_files import ROOT


async def test_a_consumer_never_auto_commits() -> None:
    consumer = make_consumer(PlatformSettings(), "adapters.registered", group_id="g")
    try:
        assert consumer._enable_auto_commit is False  # aiokafka keeps the option only there
    finally:
        await consumer.stop()
    with pytest.raises(ValueError, match="enable_auto_commit"):
        make_consumer(PlatformSettings(), "adapters.registered", group_id="g", enable_auto_commit=True)


def test_every_consumer_in_the_code_is_built_by_make_consumer() -> None:
    """A consumer built by hand could turn auto-commit on; only lorafleet/kafka.py may call the class."""
    built_by_hand = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in {".venv", ".data", "tests", "node_modules"} or rel == Path("lorafleet/kafka.py"):
            continue
        tree = ast.parse(path.read_text(), str(rel))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name == "AIOKafkaConsumer":
                    built_by_hand.append(f"{rel}:{node.lineno}")
    assert not built_by_hand, built_by_hand
