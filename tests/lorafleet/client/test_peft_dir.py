"""A local PEFT folder is described from its tensors: rank, alpha, adapted modules and the weights checksum."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from lorafleet.client.errors import PeftDirError
from lorafleet.client.peft_dir import describe_peft_dir, weights_checksum
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from tests.gateway.adapter_files import TARGETS, make_peft_adapter


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_adapter(tmp_path_factory.mktemp("peft") / "good", r=4, alpha=8.0)


def test_rank_alpha_and_modules_come_from_the_folder(peft_dir: Path) -> None:
    facts = describe_peft_dir(peft_dir)
    assert (facts.rank, facts.alpha, facts.target_modules) == (4, 8.0, sorted(TARGETS))


def test_modules_are_those_with_tensors_and_rank_is_read_from_the_shapes(tmp_path: Path) -> None:
    peft = make_peft_adapter(tmp_path / "qv", r=8, alpha=4.0, targets=["q_proj", "v_proj"])
    cfg = json.loads((peft / ADAPTER_CONFIG_NAME).read_text())
    (peft / ADAPTER_CONFIG_NAME).write_text(json.dumps({**cfg, "r": 2}))  # the tensors say 8
    facts = describe_peft_dir(peft)
    assert (facts.rank, facts.alpha, facts.target_modules) == (8, 4.0, ["q_proj", "v_proj"])


def test_checksum_is_the_sha256_of_the_weights_file(peft_dir: Path) -> None:
    expected = hashlib.sha256((peft_dir / ADAPTER_WEIGHTS_NAME).read_bytes()).hexdigest()
    assert weights_checksum(peft_dir) == f"sha256:{expected}"


def test_a_folder_without_safetensors_weights_is_refused(peft_dir: Path, tmp_path: Path) -> None:
    shutil.copy(peft_dir / ADAPTER_CONFIG_NAME, tmp_path / ADAPTER_CONFIG_NAME)
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(PeftDirError, match=ADAPTER_WEIGHTS_NAME):
        describe_peft_dir(tmp_path)


def test_a_weights_file_that_is_not_safetensors_is_refused(peft_dir: Path, tmp_path: Path) -> None:
    shutil.copy(peft_dir / ADAPTER_CONFIG_NAME, tmp_path / ADAPTER_CONFIG_NAME)
    (tmp_path / ADAPTER_WEIGHTS_NAME).write_bytes(b"\xff" * 64)
    with pytest.raises(PeftDirError, match="not valid safetensors.*invalid_safetensors"):
        describe_peft_dir(tmp_path)
