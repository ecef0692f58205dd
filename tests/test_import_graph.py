"""The package's import graph has no cycle, function-level imports included, and keeps its
layers: the framework-free parts import neither torch nor sglang, and no folder imports a
folder above it. Every module of the package is one users run: reached from a command, the
console script or the SGLang plugin (what only scripts or tests use lives in scripts/lib).

Edges come from every ``import`` / ``from ... import`` statement in the source (read with
``ast``, wherever the statement stands). ``from pkg import name`` is an edge to ``pkg.name``
when that is a module of the package, else to ``pkg``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sglang_marconi"
SETUP = PACKAGE.parent / "setup.py"
ROOT = PACKAGE.name

# folder -> the folders (and top-level modules) it may import; every folder may import
# itself and the leaf modules listed in LEAVES
LEAVES = {"errors", "sglang_version"}
LAYERS = {
    "model": set(),
    "policy": {"model"},
    "sim": {"model", "policy"},
    "exact": {"model", "policy"},
    "sglang_integration": {"model", "policy", "driver"},
    "driver": set(),
    "harness": {"model", "policy", "sim", "driver", "sglang_integration"},
    "serving": {"model", "policy", "sim", "driver", "sglang_integration", "harness"},
    "cli": {"model", "policy", "sim", "exact", "driver", "sglang_integration", "harness",
            "serving"},
}
FRAMEWORK_FREE = ("model", "policy", "sim")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: dict) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
    return out


def graph() -> dict:
    known = modules()
    return {name: {m for m in imports_of(path, known) if m in known and m != name}
            for name, path in known.items()}


def find_cycle(edges: dict):
    """One cycle as a list of modules, or None (iterative DFS, three colours)."""
    colour = dict.fromkeys(edges, 0)
    for start in edges:
        if colour[start]:
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            nxt = next(children, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                stack.append((nxt, iter(sorted(edges[nxt]))))
                path.append(nxt)
    return None


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_folders_import_only_lower_layers():
    bad = []
    for module, targets in graph().items():
        here = folder(module)
        if here not in LAYERS:
            continue
        for target in targets:
            there = folder(target)
            if there == here or there in LEAVES or target == ROOT:
                continue
            if there not in LAYERS[here]:
                bad.append(f"{module} -> {target}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_every_folder_is_layered():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(LAYERS), f"folders without a layer: {sorted(folders - set(LAYERS))}"


@pytest.mark.parametrize("top", FRAMEWORK_FREE)
def test_framework_free_parts(top):
    known = modules()
    for name, path in known.items():
        if folder(name) != top:
            continue
        heavy = {m.split(".")[0] for m in imports_of(path, known)} & {"torch", "sglang"}
        assert not heavy, f"{name} imports {sorted(heavy)}"


def entry_points() -> set:
    """The modules users run: every command of ``cli/main.py``'s ``COMMANDS``, the entry
    points of setup.py (the console script, the SGLang plugin), ``python -m sglang_marconi``
    and ``python -m sglang_marconi.launch_server``."""
    tree = ast.parse((PACKAGE / "cli" / "main.py").read_text(encoding="utf-8"))
    commands = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "COMMANDS" for t in node.targets))
    roots = {module for module, _ in ast.literal_eval(commands).values()}
    roots |= set(re.findall(r"(sglang_marconi[\w.]*):\w+", SETUP.read_text(encoding="utf-8")))
    return roots | {f"{ROOT}.__main__", f"{ROOT}.launch_server"}


def reached(edges: dict, roots: set) -> set:
    """Every module ``roots`` import, transitively, with the packages that hold them."""
    seen, stack = set(), list(roots)
    while stack:
        module = stack.pop()
        if module in seen or module not in edges:
            continue
        seen.add(module)
        stack.extend(edges[module])
        parts = module.split(".")
        stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))
    return seen


def test_reached_follows_imports_and_parents():
    edges = {"p": set(), "p.a": {"p.b"}, "p.b": set(), "p.c": set()}
    assert reached(edges, {"p.a"}) == {"p", "p.a", "p.b"}


def test_every_module_is_one_users_run():
    edges = graph()
    roots = entry_points()
    assert {f"{ROOT}.cli.sim", f"{ROOT}.sglang_integration.plugin", f"{ROOT}.cli"} <= roots
    assert roots <= set(edges), f"entry points not in the package: {sorted(roots - set(edges))}"
    unused = sorted(set(edges) - reached(edges, roots))
    assert not unused, ("modules no command, console script or plugin imports (scripts/lib "
                        "holds what only scripts and tests use):\n" + "\n".join(unused))
