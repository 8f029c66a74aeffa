"""The base-model tools load torch, transformers and safetensors only when they convert or load weights."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "safetensors", "tqdm")


def test_importing_the_model_tools_and_the_settings_loads_no_heavy_package() -> None:
    modules = [
        "lorafleet.model.prepare",
        "lorafleet.model.base_hash",
        "gateway.registry.served_base",
        "replica.config",
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(','.join(sorted(h for h in {HEAVY!r} if h in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
