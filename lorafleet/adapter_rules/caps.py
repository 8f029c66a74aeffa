"""The byte caps on an adapter's two files, one pair for both doors.

The registry refuses a file over its cap (its operator settings may only lower a cap, never raise it), and
the replica accepts every file within it, so whatever the registry accepts the replica serves. Callers read
the caps as attributes of this module when they check, so a test that lowers one lowers it at both doors.
"""

from __future__ import annotations

from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode

MAX_CONFIG_BYTES = 1 << 20  # adapter_config.json; room for MAX_PATTERNS entries in each pattern field
MAX_WEIGHTS_BYTES = 512 << 20  # adapter_model.safetensors; the registry validator holds it in memory


def check_size(name: str, size: int, cap: int) -> None:
    """AdapterRejected(adapter_too_large) when the file `name` of `size` bytes is over `cap`."""
    if size > cap:
        raise AdapterRejected(
            RejectCode.ADAPTER_TOO_LARGE, f"{name} is {size} bytes, over the cap of {cap}", name
        )
