"""No module of the hostpool package imports one that imports it, at any depth.

Imports inside functions count: a lazy import is still an edge (the old
``hostpool.torch`` imported ``hostpool.vllm`` for a side effect, and
``hostpool.vllm`` imported ``hostpool.torch``).
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "crates/hostpool-py/python/hostpool"


def module_graph(package: pathlib.Path, name: str = "hostpool") -> dict[str, set[str]]:
    """Each module of ``package`` (``hostpool``, ``hostpool.torch``, ...) and the package's
    modules it imports, anywhere in its code."""
    def dotted(f: pathlib.Path) -> str:
        parts = [name, *f.relative_to(package).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    # Subpackages too (hostpool._engines and its engine modules).
    modules = {dotted(f): f for f in sorted(package.rglob("*.py"))}
    # The compiled extension, known by its type stubs.
    for stub in package.glob("*.pyi"):
        modules.setdefault(f"{name}.{stub.stem}", stub)

    def deepest(target: str) -> str | None:
        parts = target.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        deps: set[str] = set()
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    deps.update(filter(None, (deepest(a.name) for a in node.names)))
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        # Relative to the module's package (a package's __init__ is its own).
                        here = module.split(".") if path.stem == "__init__" else module.split(".")[:-1]
                        anchor = ".".join(here[: len(here) - (node.level - 1)])
                        base = f"{anchor}.{base}" if base else anchor
                    for a in node.names:
                        # `from pkg import submodule` imports the submodule;
                        # `from module import item`, the module.
                        sub = f"{base}.{a.name}"
                        dep = sub if sub in modules else deepest(base)
                        if dep:
                            deps.add(dep)
            deps.discard(module)
        graph[module] = deps
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph``, if it has one. Importing a submodule imports its
    package first; that edge is the import system's, not the module's, and a
    cycle needs the package to import the submodule back."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        done.add(node)
        for dep in sorted(graph.get(node, ())):
            found = visit(dep, path + [node])
            if found:
                return found
        return None

    for node in sorted(graph):
        found = visit(node, [])
        if found:
            return found
    return None


def test_no_module_of_the_package_imports_one_that_imports_it():
    graph = module_graph(PACKAGE)
    assert {"hostpool", "hostpool.torch", "hostpool.vllm", "hostpool._vllm_region", "hostpool._engines.vllm"} <= set(graph)
    assert "hostpool._engines" in graph["hostpool._engines.vllm"]
    assert cycle(graph) is None, (cycle(graph), graph)
    # hostpool.torch keeps as_tensor and the old paths, and imports nothing of vLLM's.
    assert "hostpool.vllm" not in graph["hostpool.torch"]
    assert "hostpool._vllm_region" in graph["hostpool.vllm"]


def test_the_reader_sees_a_lazy_import_cycle(tmp_path):
    # The shape the package once had: torch imports vllm inside a function.
    pkg = tmp_path / "hostpool"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from ._errors import Error\n")
    (pkg / "_errors.py").write_text("class Error(Exception): ...\n")
    (pkg / "torch.py").write_text(
        "import hostpool\n\ndef guard():\n    import hostpool.vllm  # noqa\n"
    )
    (pkg / "vllm.py").write_text("from hostpool.torch import guard\n")
    graph = module_graph(pkg)
    assert graph["hostpool.torch"] == {"hostpool", "hostpool.vllm"}
    assert graph["hostpool.vllm"] == {"hostpool.torch"}
    assert cycle(graph) in (
        ["hostpool.torch", "hostpool.vllm", "hostpool.torch"],
        ["hostpool.vllm", "hostpool.torch", "hostpool.vllm"],
    )
    # Relative imports are edges too.
    (pkg / "vllm.py").write_text("from . import _errors\n")
    graph = module_graph(pkg)
    assert graph["hostpool.vllm"] == {"hostpool._errors"}
    assert cycle(graph) is None


def test_the_old_import_paths_keep_working():
    import hostpool.torch
    import hostpool._vllm_region as region

    for name in ("HostPoolRegion", "OffloadRegion", "RegionFullError", "NoWorkerSlotError", "pool_name"):
        assert getattr(hostpool.torch, name) is getattr(region, name), name
    assert callable(hostpool.torch.as_tensor)
