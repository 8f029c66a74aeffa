"""Fixtures for the model-preparation tests: the prepared SmolLM2 directory and its tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replica.model.tokenizer import Tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def smol_tokenizer(smollm2_dir: Path) -> Tokenizer:
    """Our tokenizer over the prepared default model."""
    return Tokenizer.from_dir(smollm2_dir)
