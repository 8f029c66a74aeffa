"""`lorafleet model`: prepare the default base model and print checkpoint hashes."""

from __future__ import annotations

from pathlib import Path

import typer

from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import ensure_default_model

app = typer.Typer(no_args_is_help=True, help="Prepare and inspect base models.")


@app.command()
def prepare(
    out: Path | None = typer.Option(None, "--out", help="target directory (default .data/models/...)"),
) -> None:
    """Convert the bundled SmolLM2 GGUF to a Hugging Face directory once; print its path and hash."""
    model_dir = ensure_default_model(out)
    typer.echo(f"model_dir: {model_dir}")
    typer.echo(f"base_model_hash: {base_model_hash(model_dir)}")


@app.command("hash")
def hash_(model_dir: Path = typer.Argument(..., help="a Hugging Face checkpoint directory")) -> None:
    """Print the base_model_hash of a checkpoint directory."""
    typer.echo(base_model_hash(model_dir))
