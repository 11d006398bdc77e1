"""The package boundaries of DESIGN section 2, checked on the source with ``ast``.

* Library code reaches another package only through its public face: nothing outside
  ``engine/`` imports ``engine._*`` and nothing outside ``tracer/`` imports ``tracer._*``.
* No import cycle between the modules of one package. Imports inside functions count (a lazy
  import must not hide a cycle); imports under ``if TYPE_CHECKING:`` do not.
* Every public face lists in ``__all__`` exactly the public names it has, each once.
"""

from __future__ import annotations

import ast
import importlib
import itertools
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The library packages (tests and scripts are not library code).
LIBRARY = ("engine", "tracer", "replay", "tui", "apps", "benchmarks")
#: Packages whose private modules nobody outside them may import.
GUARDED = ("engine", "tracer")
#: Every public face, checked for a truthful ``__all__`` (``apps`` itself exports nothing:
#: each application is its own package).
#: Every package's public face, and every built-in app's package.
FACES = ("engine", "engine.lowlevel", "tracer", "replay", "tui") + tuple(
    f"apps.{p.name}" for p in sorted((ROOT / "apps").iterdir()) if (p / "__init__.py").is_file()
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(packages: tuple[str, ...] = LIBRARY) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted target)`` of every import in ``path``, at any depth, minus TYPE_CHECKING.

    ``from X import y`` yields ``X.y`` (``y`` may be a submodule or a name: callers resolve it).
    """
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imports_in(path.read_text(), package, str(path))


def _imports_in(source: str, package: str, filename: str = "<src>") -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            found.extend((node.lineno, f"{base_name}.{a.name}") for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source, filename=filename))
    return found


def test_no_private_imports_across_packages() -> None:
    offences = []
    for path in _sources():
        owner = _module_name(path).split(".")[0]
        for line, target in _imports(path):
            parts = target.split(".")
            if parts[0] in GUARDED and parts[0] != owner:
                if any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
                    offences.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert not offences, "private imports across packages:\n" + "\n".join(offences)


def _module_graph(package: str) -> dict[str, dict[str, int]]:
    """Edges ``module -> {imported module of the same package: line}``."""
    paths = _sources((package,))
    modules = {_module_name(p): p for p in paths}
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for mod, path in modules.items():
        for line, target in _imports(path):
            # The longest prefix that is a module of the package: "engine._data.dds.dvector" ->
            # "engine._data.dds", "engine.dvector" -> "engine" (a name from the package's face).
            parts = target.split(".")
            for k in range(len(parts), 0, -1):
                cand = ".".join(parts[:k])
                if cand in modules:
                    if cand != mod:
                        graph[mod].setdefault(cand, line)
                    break
    return graph


def _find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


@pytest.mark.parametrize("package", LIBRARY)
def test_no_import_cycle_within_package(package: str) -> None:
    graph = _module_graph(package)
    cycle = _find_cycle(graph)
    if cycle:
        hops = [f"{a} -> {b} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
        pytest.fail(f"import cycle in {package}:\n  " + "\n  ".join(hops))


def test_cycle_finder_sees_lazy_imports_and_skips_type_checking() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b": 1}, "b": {}}) is None
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from engine import _dds\n"
        "def f():\n    from engine._machines.planner import Plan\n"
    )
    tree_targets = [t for _, t in _imports_in(src, "engine")]
    assert "engine._machines.planner.Plan" in tree_targets and "engine._dds" not in tree_targets


@pytest.mark.parametrize("face", FACES)
def test_all_is_truthful(face: str) -> None:
    module = importlib.import_module(face)
    names = getattr(module, "__all__", None)
    assert names is not None, f"{face} has no __all__"
    assert len(names) == len(set(names)), f"{face}.__all__ has duplicates"
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{face}.__all__ lists names it does not have: {missing}"
    # what users get: every public name that is not a submodule or ``annotations``
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and n != "annotations" and not isinstance(v, ModuleType)
    }
    unlisted = sorted(public - set(names))
    assert not unlisted, f"{face} has public names missing from __all__: {unlisted}"


def test_the_sync_for_reference_does_not_use_the_distributed_code() -> None:
    """The dual tests' serial ``sync_for`` must keep its own aggregation arithmetic: if it
    imported the distributed implementation (where ``tests/mutants.py`` breaks the
    aggregation), a broken aggregation would be broken on both sides and pass."""
    path = ROOT / "engine" / "_syncfor" / "reference.py"
    distributed = ("engine._syncfor.node", "engine._syncfor.layout", "engine._syncfor.drive")
    found = [t for _, t in _imports(path) if t.startswith(distributed)]
    assert found == []
    assert "summation_order" not in path.read_text()


def test_importing_tracer_loads_no_store_until_one_is_used() -> None:
    """``tracer`` loads its modules when a name is first used, so an MPI rank that writes
    no trace (``--no-trace``) does not import SQLAlchemy; every public name still loads."""
    import subprocess
    import sys

    code = (
        "import sys, tracer\n"
        "from tracer import TraceWriteError, TracerError\n"
        "assert 'sqlalchemy' not in sys.modules, 'importing tracer loaded SQLAlchemy'\n"
        "for name in tracer.__all__:\n"
        "    getattr(tracer, name)\n"
        "assert set(tracer.__all__) <= set(dir(tracer))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
