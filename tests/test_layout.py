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
CORE = ("schema", "store", "shards", "runner", "engine", "faults", "paths", "figures", "models",
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


#: study names a core module may still write, and why (each one a registry or a reader of old stores; the rest of
#: the core learns the studies from the registry): module -> the names
STUDY_NAMES_ALLOWED = {
    "mmfragile.study": {"format-bias", "promptception", "judge", "numerics", "formats", "judgebias", "mm-judgebias"},
    "mmfragile.store": {"format-bias", "promptception", "judgebias", "judge"},   # LEGACY_TAGS: stores before tags
    "mmfragile.data.benchmarks": {"judge", "mm-judgebias"},   # the benchmark registry: the judge set's own entries
    "mmfragile.models.zoo": {"judge"},                        # a zoo model's role (a judge model), not the study
    "mmfragile.report.build": {"judge"},                      # the judge column of a judge study's rows
}


def study_name_literals(root: Path, names: set[str]) -> dict[str, set[str]]:
    """module -> the study names written as string literals in it (docstrings aside), over the core modules."""
    found: dict[str, set[str]] = {}
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).with_suffix("").as_posix()
        if rel.split("/")[0] not in CORE:
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and ast.get_docstring(node, clean=False) is not None}
        hits = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                and isinstance(node.value, str) and node.value in names and id(node) not in docstrings}
        if hits:
            found["mmfragile." + rel.replace("/", ".").removesuffix(".__init__")] = hits
    return found


def test_the_core_writes_no_study_name():
    """The core finds a study by the registry, never by writing its name: no study name (or alias) as a string
    in a core module, apart from the registries of STUDY_NAMES_ALLOWED."""
    from mmfragile.study import ALIASES, study_names

    names = set(study_names()) | set(ALIASES)
    found = study_name_literals(ROOT, names)
    extra = {m: sorted(hits - STUDY_NAMES_ALLOWED.get(m, set())) for m, hits in found.items()}
    assert {m: h for m, h in extra.items() if h} == {}


def test_study_name_check_sees_a_name_in_code_not_in_a_docstring(tmp_path):
    (tmp_path / "budget").mkdir()
    (tmp_path / "budget" / "x.py").write_text('STUDY = "format-bias"\n'
                                              'def f():\n    """judge"""\n    return "promptception"\n')
    assert study_name_literals(tmp_path, {"format-bias", "promptception", "judge"}) == {
        "mmfragile.budget.x": {"format-bias", "promptception"}}


def private_member_uses(root: Path) -> list[str]:
    """``obj._name`` (not on ``self`` / ``cls`` / ``super()``) where ``_name`` is a private member defined in another
    mmfragile module and not in this one: one module reaching into another's object. file:line each."""
    trees = {f: ast.parse(f.read_text(encoding="utf-8")) for f in sorted(root.rglob("*.py"))}
    defined: dict[Path, set[str]] = {}
    for f, tree in trees.items():
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id in ("self", "cls") and isinstance(n.ctx, ast.Store)}
        defined[f] = {n for n in names if _private(n)}
    found = []
    for f, tree in trees.items():
        elsewhere = set().union(*(d for g, d in defined.items() if g != f)) - defined[f]
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and _private(n.attr) and n.attr in elsewhere):
                continue
            on = n.value
            if isinstance(on, ast.Name) and on.id in ("self", "cls") or (
                    isinstance(on, ast.Call) and isinstance(on.func, ast.Name) and on.func.id == "super"):
                continue
            found.append(f"{f.relative_to(root)}:{n.lineno} {ast.unparse(n)}")
    return sorted(found)


def test_no_module_uses_anothers_private_members():
    assert private_member_uses(ROOT) == []


def test_private_member_check_sees_a_method_of_another_module(tmp_path):
    (tmp_path / "store.py").write_text("class S:\n    def _index(self):\n        self._cache = 1\n"
                                       "    def public(self, other):\n        return other._index()\n")
    (tmp_path / "dist.py").write_text("def f(store):\n    return store._index(), store._cache, store._own\n")
    assert private_member_uses(tmp_path) == ["dist.py:2 store._cache", "dist.py:2 store._index"]
