"""CONTRIBUTING.md tells the truth (issue 36, item 8).

Every recipe of CONTRIBUTING.md - a model family, a backend, a benchmark, a metric, a study - ends in a **Files**
list of backticked paths (and, where only some additions need more, a **Where it applies** list), ``<name>``
standing for the addition's own name. Here:

* every listed path exists;
* a fake model family and a fake benchmark are added to a copy of the repository by editing exactly the files
  their recipes list; the registry tests a new family / benchmark trips pass in that copy, and fail when any one
  of those edits is left out - every listed file is forced, and the edits the tests force are the listed ones;
* every benchmark of the registry (:data:`mmfragile.data.benchmarks.BENCHMARKS`) is written in its authors'
  published layout by its fixture writer and read back through :func:`mmfragile.data.loaders.load_dataset`,
  giving what the writer planted (:data:`EXPECTED`); its bad rows raise, naming the file, and are left out on
  request. A benchmark without a fixture writer or without its planted questions here fails, saying what to add.

The copy's test runs go through ``tests/forked_runs.py`` (one process imports torch & co. once and forks a run per
variant), so the two fake additions take ~25-40 s each on 2 cores instead of ~10 s of imports per run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

import test_docs_counts as counts
from mmfragile.data.benchmarks import BENCHMARKS, Benchmark
from mmfragile.data.loaders import MVBENCH_TASKS, load_dataset, skipped_rows
from mmfragile.errors import DataError
from mmfragile.schema import QUESTION_COLUMNS, validate_questions

REPO = Path(__file__).resolve().parents[1]
#: the recipes of CONTRIBUTING.md, by their headings ("## A new <recipe>")
RECIPES = ("model family", "backend", "benchmark", "metric", "study")


# ---------------------------------------------------------------------------------------------- the recipes' lists
def section(recipe: str, text: str | None = None) -> str:
    """The text of CONTRIBUTING.md's ``## A new <recipe>`` section."""
    text = (REPO / "CONTRIBUTING.md").read_text() if text is None else text
    m = re.search(rf"^## A new {re.escape(recipe)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"CONTRIBUTING.md has no section '## A new {recipe}'"
    return m.group(1)


def listed(recipe: str, label: str = "Files", text: str | None = None) -> list[str]:
    """The backticked paths of the bullet list under the ``**<label>**`` paragraph of a recipe ([] if it has none).
    A bullet is ``- `path`: why``; its continuation lines are indented; a blank line or other text ends the list."""
    lines = section(recipe, text).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"**{label}**")), None)
    if start is None:
        return []
    paths: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("- "):
            m = re.match(r"- `([^`]+)`", line)
            assert m, f"CONTRIBUTING.md, A new {recipe}, {label}: a bullet that names no `path`: {line!r}"
            paths.append(m.group(1))
        elif not paths or line.startswith("  "):   # the label's own paragraph, or a bullet's continuation
            continue
        else:
            break
    return paths


def named(path: str, name: str) -> str:
    """A listed path with its ``<placeholders>`` filled in."""
    return re.sub(r"<[^>]+>", name, path)


def test_the_list_reader_reads_bullets_under_their_label():
    text = ("## A new thing\n\nProse `not/a/file.py`.\n\n**Files** (why,\nwrapped):\n\n- `a/b.py`: one\n"
            "  continued `not/this.py`\n- `docs/<thing>.md`\n\nMore prose.\n\n**Where it applies**:\n\n- `c.md`\n"
            "## A new other\n\n**Files**:\n\n- `z.py`\n")
    assert listed("thing", text=text) == ["a/b.py", "docs/<thing>.md"]
    assert listed("thing", "Where it applies", text=text) == ["c.md"]
    assert listed("other", "Where it applies", text=text) == []
    assert named("docs/<thing>.md", "toy") == "docs/toy.md"


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_file_a_recipe_lists_exists(recipe):
    files = listed(recipe)
    assert files, f"CONTRIBUTING.md, A new {recipe}: no **Files** list"
    assert len(set(files)) == len(files), f"CONTRIBUTING.md, A new {recipe}: a file listed twice: {files}"
    everything = files + listed(recipe, "Where it applies")
    missing = [f for f in everything if not any(REPO.glob(named(f, "*")))]
    assert not missing, f"CONTRIBUTING.md, A new {recipe}, lists files that do not exist: {missing}"


# ---------------------------------------------------------------------------------------------- a copy of the repo
#: what the registry tests read: the package, the tests, the pages whose counts they check, the pytest config
COPIED = ("src", "tests", "docs", "README.md", "CONTRIBUTING.md", "pyproject.toml")
#: never needed by them: caches, run outputs, figures, git, the zoo's weights (~110 MB; the registries are code)
NOT_COPIED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".ipynb_checkpoints",
                                    "runs", "figures", ".git", "*.safetensors")

Edit = Callable[[Any], str]   # the file's text (None: a new file) -> its new text


def copy_repo(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in COPIED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=NOT_COPIED)
        else:
            shutil.copy2(REPO / name, dest / name)
    return dest


#: what every run imports anyway, imported once by tests/forked_runs.py before it forks the runs
PRELOAD = ["numpy", "pandas", "pyarrow", "scipy.stats", "PIL.Image", "yaml", "torch", "hypothesis", "pytest"]


def check_each_edit_is_forced(copy: Path, edits: dict[str, Edit], args: list[str], must_pass: list[str],
                              preload: list[str] = PRELOAD) -> None:
    """pytest ``args`` in the copy - offline, stopping at the first failure, importing the copy's package: with
    every edit made they pass (``must_pass`` among them); with any one of them left out, they fail."""
    before = {p: (copy / p).read_text() if (copy / p).exists() else None for p in edits}
    after = {p: edit(before[p]) for p, edit in edits.items()}
    work = copy.parent
    variants = {"every edit": after, **{f"without {p}": {**after, p: before[p]} for p in edits}}
    runs = [{"writes": {str(copy / p): text for p, text in files.items()}, "out": str(work / f"run{i}.txt")}
            for i, files in enumerate(variants.values())]
    plan = {"copy": str(copy), "preload": preload, "runs": runs,
            "args": ["-v", "-x", "-p", "no:cacheprovider", "-W", "ignore", f"--basetemp={work / 'basetemp'}", *args]}
    (work / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "MPLBACKEND": "Agg", "MMFRAGILE_CACHE": str(work / "cache")}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, str(REPO / "tests" / "forked_runs.py"), str(work / "plan.json")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(runs), done.stdout + done.stderr
    for (variant, _), step, result in zip(variants.items(), runs, results):
        output = Path(step["out"]).read_text()
        tail = "\n".join(output.splitlines()[-40:])
        assert result["mmfragile"] and Path(result["mmfragile"]).is_relative_to(copy), (variant, result, tail)
        if variant == "every edit":
            assert result["rc"] == 0, f"the registry tests fail with every listed edit made:\n{tail}"
            for test in must_pass:
                assert f"{test} PASSED" in output, f"{test} did not run:\n{tail}"
        else:
            assert result["rc"] in (1, 2), (f"{variant.removeprefix('without ')}: the registry tests pass without "
                                            f"its edit, so CONTRIBUTING.md need not list it (exit {result['rc']}):"
                                            f"\n{tail}")


def recount(pattern: str, deltas: list[int]) -> Edit:
    """An edit moving each count that ``pattern`` (a claim of tests/test_docs_counts.py) matches by its delta,
    written as it was written (digits, or a word)."""
    words = list(counts.WORDS)

    def number(old: str, delta: int) -> str:
        n = counts.count(old) + delta
        return str(n) if old.isdigit() else words[n].capitalize() if old[0].isupper() else words[n]

    def one(m: re.Match) -> str:
        out, pos = [], m.start()
        for group, delta in enumerate(deltas, 1):
            out += [m.string[pos:m.start(group)], number(m.group(group), delta)]
            pos = m.end(group)
        return "".join(out) + m.string[pos:m.end()]

    def edit(text: str) -> str:
        new, n = re.subn(pattern, one, text, flags=re.I)
        assert n, f"no sentence matches {pattern!r}"
        return new
    return edit


def then(first: Edit | None, second: Edit) -> Edit:
    return second if first is None else (lambda text: second(first(text)))


# ---------------------------------------------------------------------------------------------- a fake family
FAKE_FAMILY = "toy_vlm"
#: the tests a new family trips: the docs' counts of the registry, the processor expectations, and the first
#: conformance check (it loads the tiny checkpoint by path, chat template and all); -x stops at the first failure
FAMILY_TESTS = ["tests/test_docs_counts.py", "tests/test_architectures.py", "-k",
                "test_docs_counts or test_every_family_has_a_processor_expectation or "
                f"(test_loads_by_path_with_its_real_classes and {FAKE_FAMILY})"]


def family_edits() -> dict[str, Edit]:
    """repo path -> edit: the fake family as CONTRIBUTING.md's recipe adds one - llava's architecture under a key
    and chat template of its own, engine-exact, without a real-processor build."""
    f = FAKE_FAMILY
    adapter = (f"\n\nclass ToyVlmAdapter(LlavaAdapter):\n"
               f'    """{f}: the fake family of tests/test_contributing.py (llava\'s architecture)."""\n'
               f'    model_types = ("{f}",)\n\n\nADAPTERS["{f}"] = ToyVlmAdapter()\n')
    builder = (f"\n\ndef build_toy_vlm(out: Path) -> None:\n"
               f'    """{f} (tests/test_contributing.py): a tiny llava checkpoint with the {f} chat template."""\n'
               f"    build_llava(out)\n"
               f'    (out / "chat_template.jinja").unlink()  # llava\'s template; the family has its own\n'
               f'    template = chat_template("{f}")\n'
               f"    if template is not None:\n"
               f'        (out / "chat_template.jinja").write_text(template)\n\n\n'
               f'FAMILIES["{f}"] = TinySpec(family="{f}", build=build_toy_vlm, interleave=False)\n')
    template = (REPO / "src/mmfragile/resources/chat_templates/llava.jinja").read_text()
    edits: dict[str, Edit] = {
        "src/mmfragile/models/adapters.py": lambda text: text + adapter,
        "src/mmfragile/models/tiny.py": lambda text: text + builder,
        f"src/mmfragile/resources/chat_templates/{f}.jinja": lambda text: template,
        "tests/test_architectures.py": lambda text: text + f'\nPROCESSORS["{f}"] = "LlavaProcessor"  # fake family\n',
    }
    grows = {counts.families: 1, counts.engine_exact_families: 1}   # one more family, one more engine-exact one
    for page, pattern, registries in counts.CLAIMS:
        if any(r in grows for r in registries):
            edits[page] = then(edits.get(page), recount(pattern, [grows.get(r, 0) for r in registries]))
    return edits


def check_recipe(tmp_path: Path, recipe: str, fake: str, edits: dict, tests: list, selected: list, **kw: Any) -> None:
    """The files a fake addition changed are the ones recipe ``recipe`` lists, and each of those edits is forced."""
    files = [named(p, fake) for p in listed(recipe)]
    assert sorted(edits) == sorted(files), (f"CONTRIBUTING.md, A new {recipe}: the files a new {recipe} changes "
                                            f"are {sorted(edits)}; it lists {sorted(files)}")
    check_each_edit_is_forced(copy_repo(tmp_path / "repo"), edits, tests, selected, **kw)


def test_a_new_family_changes_exactly_the_files_contributing_lists(tmp_path):
    check_recipe(tmp_path, "model family", FAKE_FAMILY, family_edits(), FAMILY_TESTS,
                 ["test_every_family_has_a_processor_expectation",
                  f"test_loads_by_path_with_its_real_classes[{FAKE_FAMILY}]"],
                 preload=PRELOAD + ["transformers", "transformers.modeling_utils"])


# ---------------------------------------------------------------------------------------------- a fake benchmark
FAKE_BENCHMARK = "toybench"
#: the tests a new benchmark trips: this module's registry tests for it, and the standard formats of study 1
BENCHMARK_TESTS = ["tests/test_contributing.py", "tests/test_formats.py", "-k",
                   f"(test_every_benchmark_loads_its_fixture and {FAKE_BENCHMARK}) or "
                   "test_expectations_name_registered_benchmarks or test_standard_formats_table5"]


def benchmark_edits() -> dict[str, Edit]:
    """repo path -> edit: the fake benchmark as CONTRIBUTING.md's recipe adds one - a JSONL release with one JPEG
    per question, read by a loader of its own, with a standard format from Table 5."""
    b = FAKE_BENCHMARK
    loader = (f"\n\ndef load_{b}(path: str | Path, n: int | None = None,\n"
              f"              skip_bad_rows: bool = False) -> pd.DataFrame:\n"
              f'    """ToyBench (the fake benchmark of tests/test_contributing.py): ``{b}.jsonl``, one\n'
              f'    ``{{question_id, question, options, answer (letter), image (a file beside it)}}`` a line."""\n'
              f'    return load_generic(path, dataset="{b}", n=n, skip_bad_rows=skip_bad_rows)\n')
    record = (f'    Benchmark(name="ToyBench", prefix="{b}", loader="mmfragile.data.loaders:load_{b}",\n'
              f'              source="tests/test_contributing.py (a fake benchmark)",\n'
              f'              standard_format="uppercase-dot-line_break",\n'
              f'              fixture="mmfragile.data.fixtures:write_{b}"),\n')
    writer = (f"\n\ndef write_{b}(root: str | Path, bad_rows: bool = False) -> str:\n"
              f'    """ToyBench (tests/test_contributing.py): ``{b}.jsonl`` and a JPEG per question."""\n'
              f"    root = Path(root)\n"
              f"    root.mkdir(parents=True, exist_ok=True)\n"
              f"    recs = []\n"
              f"    for i in range(3):\n"
              f'        noise_image(i).save(root / f"toy{{i}}.jpg")\n'
              f'        recs.append({{"question_id": f"toy{{i}}", "question": "What colour is the square?",\n'
              f'                     "options": ["red", "green", "blue", "yellow"], "answer": "ABCD"[i],\n'
              f'                     "image": f"toy{{i}}.jpg"}})\n'
              f"    if bad_rows:\n"
              f'        recs.append({{**recs[0], "question_id": "toy-bad", "answer": "E"}})  # not among the options\n'
              f'    f = root / "{b}.jsonl"\n'
              f'    f.write_text("".join(json.dumps(r) + "\\n" for r in recs))\n'
              f'    return f"{b}:{{f}}"\n')
    planted = f'\n\nEXPECTED["{b}"] = questions("{b}", ["toy0", "toy1", "toy2"], [0, 1, 2], 4)\n'

    def add_record(text: str) -> str:
        new, n = re.subn(r"^(BENCHMARKS\b[^\n]*=\s*\(\n)", lambda m: m.group(1) + record, text, count=1,
                         flags=re.M)
        assert n, "src/mmfragile/data/benchmarks.py: no 'BENCHMARKS ... = (' line to add a record under"
        return new
    return {
        "src/mmfragile/data/loaders.py": lambda text: text + loader,
        "src/mmfragile/data/benchmarks.py": add_record,
        "src/mmfragile/data/fixtures.py": lambda text: text + writer,
        "tests/test_contributing.py": lambda text: text + planted,
    }


def test_a_new_benchmark_changes_exactly_the_files_contributing_lists(tmp_path):
    check_recipe(tmp_path, "benchmark", FAKE_BENCHMARK, benchmark_edits(), BENCHMARK_TESTS,
                 [f"test_every_benchmark_loads_its_fixture[{FAKE_BENCHMARK}]",
                  "test_expectations_name_registered_benchmarks", "test_standard_formats_table5"])


# ---------------------------------------------------------------------------------------------- every benchmark
def questions(dataset: str, ids, answers, n_options, modality="image", **more) -> dict[str, tuple]:
    """What a fixture plants, column by column (``n_options`` / ``n_images``: the lengths of options / images); a
    single value stands for every question."""
    each = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v,) * len(ids)  # noqa: E731
    return {"dataset": each(dataset), "question_id": tuple(ids), "answer": tuple(answers),
            "n_options": each(n_options), "modality": each(modality), **{k: each(v) for k, v in more.items()}}


MMMU_IDS = ["test_Art_1", "test_Design_2", "test_Math_3"]
MMMU_STANDARD = {"modality": ["image", "multi-image", "multi-image"], "n_images": [1, 2, 2]}  # <image k> markers
#: spec prefix -> what its fixture writer plants (read off the writer, not the loader): every registry benchmark
#: read from files has an entry
EXPECTED: dict[str, dict[str, tuple]] = {
    "aokvqa": questions("a-okvqa", ["q0", "q1", "q2"], [0, 1, 2], 4, n_images=1),
    "hrbench4k": questions("hrbench-4k", ["0", "1"], [0, 1], 4, category=["single", "cross"]),  # cycle 1 of 4
    "hrbench8k": questions("hrbench-8k", ["0", "1"], [0, 1], 4, category=["single", "cross"]),
    "mmbench": questions("mmbench", ["0", "1", "2"], [0, 1, 1], [4, 4, 2]),   # the circular copy left out
    "mme-realworld-lite": questions("mme-realworld-lite", ["0", "1", "2"], [0, 1, 2], 5),
    "vstar": questions("vstar", ["direct_attributes/sa_0", "direct_attributes/sa_1", "relative_position/sa_100",
                                 "relative_position/sa_101"], [0, 0, 0, 0], [4, 4, 2, 2]),  # the right option first
    "mmstar": questions("mmstar", ["0", "1", "2"], [0, 1, 2], 4),
    "mmmu-pro": questions("mmmu-pro-s10", MMMU_IDS, [0, 1, 2], 10, **MMMU_STANDARD),
    "mmmu-pro-s4": questions("mmmu-pro-s4", MMMU_IDS, [0, 1, 2], 4, **MMMU_STANDARD),
    "mmmu-pro-s10": questions("mmmu-pro-s10", MMMU_IDS, [0, 1, 2], 10, **MMMU_STANDARD),
    "mmmu-pro-vision": questions("mmmu-pro-vision", MMMU_IDS, [0, 1, 2], 10, n_images=1, options_in_image=True),
    # one question per task: seed 10 * t, 3 + t % 2 candidates, the answer candidate seed % count
    "mvbench": questions("mvbench", [f"{task}/0" for task in MVBENCH_TASKS],
                         [10 * t % (3 + t % 2) for t in range(len(MVBENCH_TASKS))],
                         [3 + t % 2 for t in range(len(MVBENCH_TASKS))], "video", n_images=1),
    # the judge study's data: each record an unbiased and a biased sample; record 3's images reconstructed from
    # images/, record 4's unbiased sample text-only
    "mm-judgebias": {"sample_id": ("1", "1", "2", "2", "3", "3", "4", "4"), "role": ("unbiased", "biased") * 4,
                     "n_images": (1, 1, 1, 1, 1, 1, 0, 1)},
    "generic": questions("mcq", ["g0", "g1", "g2"], [0, 0, 1], [4, 2, 3], ["image", "multi-image", "text"],
                         n_images=[1, 2, 0]),
}


def fixture_writer(b: Benchmark) -> Callable[..., str]:
    if b.fixture:
        return b.write_fixture
    pytest.fail(f"{b.name}: no fixture writer - add fixture=\"mmfragile.data.fixtures:write_<name>\" to its Benchmark "
                "record (src/mmfragile/data/benchmarks.py) and that writer to src/mmfragile/data/fixtures.py "
                "(CONTRIBUTING.md, A new benchmark)", pytrace=False)


def as_table(loaded: Any) -> pd.DataFrame:
    if isinstance(loaded, pd.DataFrame):
        return loaded.assign(n_options=loaded.options.map(len), n_images=loaded.images.map(len))
    return pd.DataFrame([{"sample_id": s.sample_id, "role": s.meta.get("role"), "n_images": len(s.images)}
                         for s in loaded])


@pytest.mark.parametrize("b", BENCHMARKS, ids=[b.prefix for b in BENCHMARKS])
def test_every_benchmark_loads_its_fixture(b, tmp_path):
    """Written in the published layout, read through the public loader: the planted questions, a question table
    with its sources; the bad rows raise naming the file, and ``skip_bad_rows`` leaves out only them."""
    if b.builtin:   # generated or shipped in a package: no layout to write, no path
        if b.study:
            assert len(b.load(n=2, seed=0, out_dir=tmp_path)) >= 2
        else:
            assert len(validate_questions(load_dataset(b.prefix, n=3), b.prefix)) == 3
        return
    write = fixture_writer(b)
    want = EXPECTED.get(b.prefix)
    if want is None:
        pytest.fail(f"{b.name}: add what its fixture writer plants to EXPECTED[{b.prefix!r}] in "
                    "tests/test_contributing.py (CONTRIBUTING.md, A new benchmark)", pytrace=False)
    good = tmp_path / "good"
    spec = write(good)
    assert spec.startswith(f"{b.prefix}:"), spec
    if b.study:
        table = as_table(b.load(spec.partition(":")[2]))   # the study's records, through its record
    else:
        df = load_dataset(spec)
        assert list(df.columns[:len(QUESTION_COLUMNS)]) == QUESTION_COLUMNS, list(df.columns)
        assert {"source_file", "source_row"} <= set(df.columns), list(df.columns)
        assert all(Path(f).is_relative_to(good) for f in df.source_file), set(df.source_file)
        validate_questions(df, spec)
        table = as_table(df)
    assert {c: tuple(table[c]) for c in want} == want
    if b.study:
        return
    bad_root = tmp_path / "bad"
    bad = write(bad_root, bad_rows=True)
    with pytest.raises(DataError, match=re.escape(str(bad_root))):
        load_dataset(bad)
    kept = load_dataset(bad, skip_bad_rows=True)
    assert skipped_rows(kept), f"{b.name}: its fixture writer plants no bad row with bad_rows=True"
    assert set(want["question_id"]) <= set(kept.question_id)


def test_expectations_name_registered_benchmarks():
    """No planted questions of a benchmark the registry does not have."""
    from_files = {b.prefix for b in BENCHMARKS if not b.builtin}
    assert set(EXPECTED) <= from_files, f"EXPECTED: no registry benchmark {sorted(set(EXPECTED) - from_files)}"
