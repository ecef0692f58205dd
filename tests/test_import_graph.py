"""The package's import graph has no cycle, function-level imports included, and keeps its
layers: the framework-free parts import neither torch nor sglang, and no folder imports a
folder above it.

Edges come from every ``import`` / ``from ... import`` statement in the source (read with
``ast``, wherever the statement stands). ``from pkg import name`` is an edge to ``pkg.name``
when that is a module of the package, else to ``pkg``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sglang_marconi"
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
