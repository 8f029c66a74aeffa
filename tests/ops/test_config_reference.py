"""docs/configuration.md's reference is what the settings classes say now, and the generator reads them right."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ops.config_reference import (
    BEGIN,
    DOC,
    END,
    SETTINGS,
    ReferenceError,
    config_reference,
    find_settings_classes,
    regenerate,
    render_reference,
    rows,
    unlisted,
)

FIXTURE = '''
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ExtraSettings(BaseSettings):
    """Settings of a process the reference has not seen yet."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_EXTRA_")

    # How many widgets at once, and how long each may take.
    widgets: int = 4
    widget_timeout_s: float = 2.0
    mode: str = "fast"  # fast or careful
    budget_bytes: int = Field(default=2 << 20, description="bytes held at most")

    token: SecretStr = SecretStr("dev-service-token")  # the callers' token
    password: SecretStr = SecretStr("hunter2")  # the database's password
    cache: Path = Field(default_factory=lambda: Path.home() / "cache")  # where the cache lives
    renamed: int = Field(default=3, validation_alias="OTHER_NAME", description="read under its own name")


class MoreSettings(ExtraSettings):
    """A subclass of a settings class is a settings class too."""

    more: bool = True  # one more
'''


@pytest.fixture
def fixture_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A repository root holding one package with settings classes; imported fresh by each test."""
    package = tmp_path / "cfgref_fixture"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(FIXTURE)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0] == "cfgref_fixture"]:
        del sys.modules[name]


def _fixture_class(name: str) -> Any:
    return getattr(importlib.import_module("cfgref_fixture.config"), name)


def _rows(root: Path, name: str) -> dict[str, tuple[str, str]]:
    return {row.variable: (row.default, row.meaning) for row in rows(_fixture_class(name), root)}


def test_the_committed_reference_is_what_the_settings_classes_generate() -> None:
    committed = DOC.read_text()
    generated = regenerate(committed, render_reference())
    assert committed == generated, "docs/configuration.md is out of date: run `lorafleet config-reference`"


def test_the_table_lists_every_settings_class_in_the_source() -> None:
    assert unlisted() == []
    assert len(find_settings_classes()) == len(SETTINGS)


def test_a_settings_class_missing_from_the_table_is_found(fixture_root: Path) -> None:
    missing = unlisted(SETTINGS, fixture_root)
    assert [(c.module, c.name) for c in missing] == [
        ("cfgref_fixture.config", "ExtraSettings"),
        ("cfgref_fixture.config", "MoreSettings"),
    ]


def test_a_new_settings_class_gets_its_variables_defaults_and_meanings(fixture_root: Path) -> None:
    table = _rows(fixture_root, "ExtraSettings")
    assert table["`LORAFLEET_EXTRA_WIDGETS`"] == (
        "`4`",
        "How many widgets at once, and how long each may take.",
    )
    assert table["`LORAFLEET_EXTRA_WIDGET_TIMEOUT_S`"] == ("`2.0`", "see `LORAFLEET_EXTRA_WIDGETS`")
    assert table["`LORAFLEET_EXTRA_MODE`"] == ("`fast`", "fast or careful")
    assert table["`LORAFLEET_EXTRA_BUDGET_BYTES`"] == ("`2097152` (2 MiB)", "bytes held at most")
    assert table["`OTHER_NAME`"] == ("`3`", "read under its own name")
    sub = _rows(fixture_root, "MoreSettings")
    assert sub["`LORAFLEET_EXTRA_MORE`"] == ("`true`", "one more")


def test_a_secret_shows_only_a_dev_default_and_a_path_never_this_machines(fixture_root: Path) -> None:
    table = _rows(fixture_root, "ExtraSettings")
    assert table["`LORAFLEET_EXTRA_TOKEN`"][0] == "`dev-service-token` (dev only)"
    assert table["`LORAFLEET_EXTRA_PASSWORD`"][0] == "*(secret)*"
    assert table["`LORAFLEET_EXTRA_CACHE`"][0] == "`~/cache`"
    reference = render_reference(
        [_fixture_class("ExtraSettings"), _fixture_class("MoreSettings")], fixture_root
    )
    assert (
        str(Path.home()) not in reference
        and "`cfgref_fixture/config.py`, prefix `LORAFLEET_EXTRA_`." in reference
    )


def test_a_field_with_neither_description_nor_comment_is_refused(fixture_root: Path) -> None:
    config = fixture_root / "cfgref_fixture" / "config.py"
    config.write_text(FIXTURE.replace("    more: bool = True  # one more", "\n    more: bool = True"))
    with pytest.raises(ReferenceError, match="MoreSettings.more has no description and no comment"):
        rows(_fixture_class("MoreSettings"), fixture_root)


def test_check_fails_on_a_stale_document_and_passes_once_regenerated(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(config_reference)
    doc = tmp_path / "configuration.md"
    doc.write_text(DOC.read_text().replace("| `LORAFLEET_REPLICA_DTYPE` |", "| `LORAFLEET_REPLICA_DTYPO` |"))
    stale = CliRunner().invoke(app, ["--check", "--doc", str(doc)])
    assert stale.exit_code == 1 and "LORAFLEET_REPLICA_DTYPO" in stale.output
    assert CliRunner().invoke(app, ["--doc", str(doc)]).exit_code == 0
    assert doc.read_text() == DOC.read_text()
    assert CliRunner().invoke(app, ["--check", "--doc", str(doc)]).exit_code == 0


def test_the_hand_written_parts_survive_a_regeneration() -> None:
    text = f"# Title\n\nprose above\n{BEGIN}\nold\n{END}\n\nprose below\n"
    out = regenerate(text, f"{BEGIN}\nnew\n{END}\n")
    assert out == f"# Title\n\nprose above\n{BEGIN}\nnew\n{END}\n\nprose below\n"
