"""The package layout shows the architecture: no import cycles between mmfragile's modules (counting imports
inside functions too), and the core - the shared layers included (report, budget, the CLI) - never imports a study
package: they learn about studies from the registry (mmfragile.study); no module reaches into another's private
names (what one module needs from another is public there, with a docstring)."""
from __future__ import annotations

import ast
from pathlib import Path

import mmfragile

ROOT = Path(mmfragile.__file__).parent
#: the core: what every study runs on; studies import it, never the other way round
CORE = ("schema", "store", "shards", "runner", "engine", "extraction", "faults", "paths", "figures", "models",
        "data", "study", "report", "budget", "cli")


def module_graph() -> dict[str, set[str]]:
    """module -> the mmfragile modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    names = {"mmfragile." + f.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__"): f
             for f in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, f in names.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mmfragile"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & names.keys()
                deps |= subs or {node.module}
            elif isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{f}: relative import (use absolute mmfragile.* imports)")
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("mmfragile")}
        graph[name] = {d for d in deps if d in names and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(module_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_core_imports_no_study():
    graph = module_graph()
    core = [m for m in graph if m.split(".")[1] in CORE]
    bad = {m: sorted(d for d in graph[m] if d.startswith("mmfragile.studies")) for m in core}
    assert {m: d for m, d in bad.items() if d} == {}


def test_core_check_sees_a_study_import(tmp_path, monkeypatch):
    """The check counts imports inside functions of a shared layer (as report/build.py had)."""
    pkg = tmp_path / "mmfragile"
    (pkg / "report").mkdir(parents=True)
    (pkg / "studies" / "x").mkdir(parents=True)
    for f in ("__init__.py", "report/__init__.py", "studies/__init__.py", "studies/x/__init__.py", "studies/x/metrics.py"):
        (pkg / f).write_text("")
    (pkg / "report" / "build.py").write_text("def f():\n    from mmfragile.studies.x import metrics\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    graph = module_graph()
    assert graph["mmfragile.report.build"] == {"mmfragile.studies.x.metrics"}


def private_imports(root: Path) -> list[str]:
    """``from mmfragile.x import _name`` and ``module._name`` on an imported mmfragile module, file:line each."""
    found = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmfragile"):
                found += [f"{f.name}:{node.lineno} {a.name}" for a in node.names if _private(a.name)]
                modules |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                modules |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("mmfragile")}
        found += [f"{f.name}:{node.lineno} {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in modules and _private(node.attr)]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_anothers_private_names():
    assert private_imports(ROOT) == []


def test_private_import_check_sees_both_forms(tmp_path):
    (tmp_path / "a.py").write_text("from mmfragile.store import _key_index\n")
    (tmp_path / "b.py").write_text("from mmfragile.studies.x import metrics as m\nm._require(1)\nm.public(2)\n")
    assert private_imports(tmp_path) == ["a.py:1 _key_index", "b.py:2 m._require"]
