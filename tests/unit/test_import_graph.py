"""No import cycles among globald's modules.

A cycle means two modules cannot be understood, tested or replaced apart, and it breaks at import time as soon as
one side needs a name of the other at module level. Every import counts: module level, inside functions (they only
defer the cycle) and under ``TYPE_CHECKING`` (the coupling is the same).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import globald

PACKAGE_ROOT = Path(globald.__file__).parent


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package rooted at ``root``."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _known_prefix(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module a dotted name lives in: ``pkg.mod.Class`` → ``pkg.mod``; None outside ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``module`` imports anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(_known_prefix(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb from the importing module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                # "from pkg import mod" imports the submodule; "from pkg import name" only pkg/__init__
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in modules else _known_prefix(source, modules))
    targets.discard(None)
    targets.discard(module)
    return {t for t in targets if t is not None}


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = module_files(root, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        # Each frame: a node and the iterator over its remaining successors; explicit so deep chains cannot
        # hit the recursion limit.
        work = [(start, iter(graph.get(start, ())))]
        index[start] = lowlink[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = lowlink[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(graph.get(succ, ()))))
                    break
                if succ in on_stack:
                    lowlink[node] = min(lowlink[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowlink[parent] = min(lowlink[parent], lowlink[node])
                if lowlink[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _describe(component: list[str], graph: Mapping[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component]
    return "; ".join(edges)


def test_no_import_cycles_among_globald_modules() -> None:
    graph = import_graph(PACKAGE_ROOT, "globald")
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(c, graph) for c in found)


def package_graph(graph: Mapping[str, Iterable[str]], package: str) -> dict[str, set[str]]:
    """The module graph folded onto ``package``'s subpackages: ``a -> b`` when a module of ``a`` imports one of ``b``.
    Modules directly in ``package`` (``__main__``, ``__init__``) belong to no subpackage and are left out."""

    def owner(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != package or len(parts) < 2:
            return None
        return parts[1] if len(parts) > 2 or (PACKAGE_ROOT / parts[1]).is_dir() else None

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = owner(module)
        if source is None:
            continue
        folded.setdefault(source, set()).update(
            t for t in (owner(target) for target in targets) if t is not None and t != source)
    return folded


def test_no_import_cycles_among_globald_packages() -> None:
    """Package level, every import counted (under ``TYPE_CHECKING`` too, which import-linter's layers contract
    leaves out): a cycle between two packages means neither can be read, nor replaced, without the other."""
    graph = package_graph(import_graph(PACKAGE_ROOT, "globald"), "globald")
    found = cycles(graph)
    assert not found, "package cycles: " + " | ".join(_describe(c, graph) for c in found)


def test_the_layers_contract_names_every_package() -> None:
    """A package left out of the layers contract is a package whose imports nothing checks."""
    import tomllib

    pyproject = PACKAGE_ROOT.parent / "pyproject.toml"
    contracts = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    named = {p.strip().removeprefix("globald.") for layer in layers for p in layer.split("|")}
    packages = {p.parent.name for p in PACKAGE_ROOT.glob("*/__init__.py")}
    assert named == packages


def test_package_graph_folds_modules_onto_their_packages(tmp_path: Path) -> None:
    graph = {"globald.ops.a": {"globald.engine.b", "globald.ops.c"}, "globald.engine.b": {"globald.ops"},
             "globald.__main__": {"globald.cli.main"}, "globald.cli.main": set()}
    folded = package_graph(graph, "globald")
    assert folded == {"ops": {"engine"}, "engine": {"ops"}, "cli": set()}
    assert cycles(folded) == [["engine", "ops"]]


def test_checker_finds_cycles_through_function_level_and_package_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.leaf import VALUE\n")
    (pkg / "sub" / "leaf.py").write_text("VALUE = 1\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from .sub import VALUE\nimport pkg.a\n")
    (pkg / "c.py").write_text("from pkg.sub import leaf\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.b"] == {"pkg.a", "pkg.sub"}
    assert graph["pkg.c"] == {"pkg.sub.leaf"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]


def test_globald_run_imports_no_dev_demo_or_test_machinery(tmp_path: Path) -> None:
    """The daemon's command loads only what the daemon uses: not the embedded broker of ``dev`` and ``demo``, the
    Spark helpers or anything of the test and benchmark support."""
    import subprocess
    import sys

    probe = ("import runpy, sys\n"
             "sys.argv = ['globald', 'run', '--config', sys.argv[1]]\n"
             "try:\n    runpy.run_module('globald', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print('\\n'.join(sorted(sys.modules)))\n")
    loaded = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "missing.toml")], capture_output=True,
                            text=True, timeout=60, check=True).stdout.split()
    assert "globald.cli.main" in loaded and "globald.settings.config" in loaded, loaded  # the probe did run the command
    unwanted = [m for m in loaded if m.startswith(("globald.cli.dev", "globald.embedded", "globald.spark", "tests",
                                                   "bench", "pyspark"))]
    assert unwanted == []


def module_name_strings(source: str, modules: Iterable[str]) -> list[str]:
    """The strings of a source that spell one of ``modules`` (``"globald.typed.decode_snapshot"``), docstrings and
    logger names aside: a reach, such as a child process started by ``-m`` and a module path, that no import shows
    (a moved module breaks it only at run time). ``-m globald``, the entry point an operator types, is none."""
    names = set(modules) - {"globald"}
    tree = ast.parse(source)
    skip = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # docstrings, bare strings
    skip |= {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger" for arg in node.args}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in skip
            and isinstance(node.value, str) and node.value in names]


def test_no_module_reaches_another_by_a_module_name_string() -> None:
    """A child process is started by the imported module's ``__name__`` (``decode_snapshot.__name__``), so the import
    graph, the layers contract and a rename all see the reach."""
    modules = module_files(PACKAGE_ROOT, "globald")
    # Module files only: a package name is a label too (``versions.require(..., "globald.spark")``), and only the
    # entry point package runs with -m.
    files = [name for name, path in modules.items() if path.name != "__init__.py"]
    found = {name: spelled for name, path in modules.items()
             if (spelled := module_name_strings(path.read_text(encoding="utf-8"), files))}
    assert found == {}


def test_the_module_name_string_check_finds_one() -> None:
    modules = ["globald", "globald.typed.decode_snapshot", "globald.cli.main"]
    bad = 'MODULE = "globald.typed.decode_snapshot"\nrun([sys.executable, "-m", "globald.cli.main", "check-config"])\n'
    good = ('"""Run as ``globald.typed.decode_snapshot``."""\n'
            'log = logging.getLogger("globald.typed.decode_snapshot")\n'
            'argv = [sys.executable, "-m", decode_snapshot.__name__]\nrun([sys.executable, "-m", "globald", "run"])\n')
    assert sorted(module_name_strings(bad, modules)) == ["globald.cli.main", "globald.typed.decode_snapshot"]
    assert module_name_strings(good, modules) == []
