"""The noisy-neighbour scenario on a stack of its own, once per admission policy, printing one JSON object.

Starts the gateway stack (harness/stacks/gateway.py: a migrated database, tenants acme and globex, the
public gateway) with a single replica, runs loadtest.noisy against it with acme bursting and globex quiet,
and does it again after restarting the stack with the other policy. Uses the local services (PostgreSQL,
Kafka) at their default addresses.

    .venv/bin/python scripts/noisy_neighbour.py --policies fifo,fair
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

from harness.adapters import make_peft_adapters
from harness.stacks.gateway import ADAPTERS, gateway_stack
from loadtest.noisy import NoisyConfig, run_noisy, summarise
from lorafleet.config import PlatformSettings
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import ensure_default_model


async def one_policy(policy: str, args: argparse.Namespace, root: Path, base_hash: str) -> dict[str, Any]:
    prefix = f"nn{uuid.uuid4().hex[:6]}-"
    settings = {
        "LORAFLEET_REPLICA_ADMISSION": policy,
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": str(args.rows),
        # measure each wait to its first token rather than cut it at the gateway's deadline
        "LORAFLEET_GATEWAY_FIRST_TOKEN_TIMEOUT_S": "600",
    }
    with tempfile.TemporaryDirectory() as work:
        async with gateway_stack(
            PlatformSettings(), root, base_hash, Path(work), (f"{prefix}a",), settings
        ) as stack:
            cfg = NoisyConfig(
                stack.url,
                "globex/sales:prod",
                "acme/support:prod",
                stack.keys,
                rate=args.rate,
                duration_s=args.duration,
                burst_start_s=args.burst_start,
                burst_s=args.burst_s,
                output_tokens=args.output_tokens,
            )
            await asyncio.sleep(3)  # the gateway's first replica.state
            return summarise(cfg, await run_noisy(cfg))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policies", default="fifo,fair")
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--burst-start", type=float, default=10.0)
    parser.add_argument("--burst-s", type=float, default=30.0)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--rows", type=int, default=8)
    args = parser.parse_args()
    model_dir = ensure_default_model()
    base_hash = base_model_hash(model_dir)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as adapters:
        root = Path(adapters)
        make_peft_adapters(model_dir, root, list(ADAPTERS), base_hash)
        for policy in args.policies.split(","):
            out[policy] = await one_policy(policy, args, root, base_hash)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
