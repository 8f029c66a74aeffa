"""`lorafleet profile show`: a profile's replica sizes, and for production the same sizes as each place that
should hold them reads them: the replica's defaults, infra/k8s, docker-compose.gpu.yml and the simulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml  # type: ignore[import-untyped]

from lorafleet.sizing import BRIEF, GB, GIB, PRODUCTION, gpu_budget, problems
from ops.stack.paths import REPO_ROOT
from ops.stack.profile import LOCAL_REPLICA_ENV
from sim import replica

app = typer.Typer(no_args_is_help=True)

SIZES = tuple(PRODUCTION.replica_env())  # the variables a profile sets, in the profile's order


@app.callback()
def _group() -> None:
    """Replica sizing profiles."""


def normalized(variable: str, value: object) -> object:
    """A variable's value as a comparable Python value (slots as {rank: count}, numbers as numbers)."""
    if variable == "LORAFLEET_REPLICA_LORA_SLOTS":
        raw = json.loads(value) if isinstance(value, str) else value
        assert isinstance(raw, dict)
        return {int(k): int(v) for k, v in raw.items()}
    if variable in ("LORAFLEET_REPLICA_DTYPE", "LORAFLEET_REPLICA_DEVICE"):
        return str(value)
    return float(str(value)) if "." in str(value) else int(str(value))


def replica_defaults() -> dict[str, object]:
    """ReplicaSettings' own defaults (not the environment's) for each size; dtype at its CUDA resolution."""
    from replica.config import ReplicaSettings

    fields = ReplicaSettings.model_fields
    out: dict[str, object] = {}
    for variable in SIZES:
        name = variable.removeprefix("LORAFLEET_REPLICA_").lower()
        out[variable] = fields[name].get_default(call_default_factory=True)
    dtype = ReplicaSettings.model_construct(dtype=out["LORAFLEET_REPLICA_DTYPE"])
    out["LORAFLEET_REPLICA_DTYPE"] = dtype.model_dtype("cuda")
    out["LORAFLEET_REPLICA_DEVICE"] = "cuda" if out["LORAFLEET_REPLICA_DEVICE"] == "auto" else "cpu"
    return {k: normalized(k, v) for k, v in out.items()}


def k8s_replica_env(root: Path = REPO_ROOT) -> dict[str, object] | None:
    """The literal env of the default pool's replica container in infra/k8s (None: no such folder)."""
    folder = root / "infra" / "k8s"
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("StatefulSet", "Deployment"):
                continue
            if doc["spec"]["template"]["metadata"].get("labels", {}).get("pool") != "default":
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c.get("args", [])[:2] == ["replica", "serve"]:
                    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
                    return {k: normalized(k, env[k]) for k in SIZES if k in env}
    return {}


def compose_gpu_env(root: Path = REPO_ROOT) -> dict[str, object] | None:
    """The replica environment docker-compose.gpu.yml gives every GPU replica (None: no such file)."""
    path = root / "docker-compose.gpu.yml"
    if not path.is_file():
        return None
    env = yaml.safe_load(path.read_text())["services"]["replica-0"]["environment"]
    return {k: normalized(k, env[k]) for k in SIZES if k in env}


def simulator_sizes() -> dict[str, object]:
    """The simulator's default cache: rank-16 slots and the two tiers (it models no other pool)."""
    sizes = replica.CacheSizes()
    return {
        "LORAFLEET_REPLICA_LORA_SLOTS": {sizes.rank: sizes.gpu_slots},
        "LORAFLEET_REPLICA_RAM_BUDGET_BYTES": sizes.ram_bytes,
        "LORAFLEET_REPLICA_DISK_BUDGET_BYTES": sizes.disk_bytes,
    }


def production_sources(root: Path = REPO_ROOT) -> dict[str, dict[str, object] | None]:
    """Each place that should hold the production sizes -> the sizes it holds (None: not installed here)."""
    profile = {k: normalized(k, v) for k, v in PRODUCTION.replica_env().items()}
    return {
        "profile": profile,
        "replica defaults": replica_defaults(),
        "infra/k8s": k8s_replica_env(root),
        "docker-compose.gpu.yml": compose_gpu_env(root),
        "simulator": simulator_sizes(),
    }


def disagreements(sources: dict[str, dict[str, object] | None]) -> list[str]:
    """Each (source, variable) whose value differs from the profile's; a source lacking a size disagrees,
    except the simulator, which models the rank-16 pool and the two tiers only."""
    profile = sources["profile"]
    assert profile is not None
    out = []
    for name, sizes in sources.items():
        if sizes is None or name == "profile":
            continue
        for variable, want in profile.items():
            if name == "simulator":
                if variable == "LORAFLEET_REPLICA_LORA_SLOTS" and isinstance(want, dict):
                    want = {16: want[16]}
                elif variable not in sizes:
                    continue
            got = sizes.get(variable, "(unset)")
            if got != want:
                out.append(f"{name}: {variable} is {got}, the profile's is {want}")
    return out


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return json.dumps({str(k): v for k, v in value.items()}, separators=(",", ":"))
    if isinstance(value, int) and value >= GIB:
        return f"{value} ({value / GIB:g} GiB)"
    return str(value)


def budget_lines() -> list[str]:
    """The brief's 80 GB GPU under the production profile, and what the RAM and disk tiers hold."""
    b = gpu_budget(PRODUCTION)
    owned = BRIEF.owned_per_replica
    per = BRIEF.adapter_bytes(16)
    return [
        f"GPU {b.total / GB:.0f} GB x {PRODUCTION.gpu_memory_utilization} = {b.usable / GB:.1f} GB: "
        f"base {b.base / GB:.1f} + slots {b.slots / GB:.2f} + KV {b.kv / GB:.2f} "
        f"({b.kv_tokens} tokens; a full batch of {BRIEF.rows} x {BRIEF.tokens_per_row} needs "
        f"{b.kv_needed / GB:.2f}); {b.outside / GB:.1f} GB outside for activations",
        f"RAM tier: {PRODUCTION.ram_budget_bytes // per} rank-16 adapters of {per / 1e6:.1f} MB; "
        f"a replica owns {owned} ({owned * per / GB:.1f} GB)",
        f"disk tier: {PRODUCTION.disk_budget_bytes // per} adapters, "
        f"{PRODUCTION.disk_budget_bytes / BRIEF.registry_bytes:.0%} of the "
        f"{BRIEF.registry_bytes / GB:.0f} GB registry",
    ]


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="production | local")] = "production",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print a profile's replica sizes; for production, every place that reads them, side by side (exit 1
    when one disagrees with the profile)."""
    if name == "local":
        local = {k: _shown(normalized(k, v)) for k, v in LOCAL_REPLICA_ENV.items()}
        lines = [json.dumps(local, indent=1)] if as_json else [f"{k:44s} {v}" for k, v in local.items()]
        typer.echo("\n".join(lines))
        return
    if name != "production":
        raise typer.BadParameter(f"no profile {name!r}: production or local")
    sources = production_sources()
    wrong = disagreements(sources) + [f"profile: {p}" for p in problems(PRODUCTION)]
    if as_json:
        shown = {n: None if s is None else {k: _shown(v) for k, v in s.items()} for n, s in sources.items()}
        report: dict[str, Any] = {
            "sources": shown,
            "budget": budget_lines(),
            "disagreements": wrong,
        }
        typer.echo(json.dumps(report, indent=1))
    else:
        present = {n: s for n, s in sources.items() if s is not None}
        typer.echo(f"{'variable':44s} " + " | ".join(present))
        for variable in SIZES:
            cells = [_shown(s[variable]) if variable in s else "-" for s in present.values()]
            typer.echo(f"{variable:44s} " + " | ".join(cells))
        for name_, sizes in sources.items():
            if sizes is None:
                typer.echo(f"({name_}: not in this installation)")
        for line in budget_lines():
            typer.echo(line)
        for line in wrong:
            typer.echo(f"DISAGREES: {line}")
    if wrong:
        raise typer.Exit(1)
