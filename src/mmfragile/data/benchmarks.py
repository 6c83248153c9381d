"""One record per benchmark: the facts every part of the toolkit reads about a dataset.

A :class:`Benchmark` names the benchmark as the papers do, the spec prefix of :func:`mmfragile.data.load_dataset`
(``<prefix>:<path>``), the aliases a question table's ``dataset`` column or a user may use, its loader, its standard
prompt format (format-bias Table 5, or where it comes from when Table 5 does not list it), whether its options
are in the image, its video protocol, where its files come from, and the writer of a tiny copy in its published
layout (:mod:`mmfragile.data.fixtures`). Loaders, the format-bias study's standard formats, the CLI and
``python -m mmfragile benchmarks`` all read :data:`BENCHMARKS`; a new benchmark is one record here and one loader.

Loaders and fixture writers are named as ``"module:function"`` and imported on use, so reading the registry
imports no loader (and the judge study's release lives with the judge study).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    name: str                                  # as the papers name it
    prefix: str                                # a spec's prefix: <prefix>:<path>, or the whole spec of a built-in set
    loader: str                                # "module:function" taking (path, n=, skip_bad_rows=, **loader_kwargs)
    source: str                                # where its files come from
    aliases: tuple[str, ...] = ()              # other names (the loader's ``dataset`` column, common spellings)
    standard_format: str | None = None         # format name of its standard prompt format (None: no text format)
    standard_source: str = "Table 5"           # where that format comes from
    options_in_image: bool = False             # the options are only in the image (MMMU-Pro vision)
    second_path: str | None = None             # the loader's keyword for a spec's second path (``<file>::<images>``)
    loader_kwargs: tuple[tuple[str, Any], ...] = ()
    video: str = ""                            # the video protocol, where the benchmark has videos
    fixture: str | None = None                 # "module:function" writing a tiny published-layout copy
    builtin: bool = False                      # generated or shipped in a package: no path
    family: str | None = None                  # the benchmark this is a setting / subset of (MMMU-Pro (4 options))
    study: str | None = None                   # a study's own data (not a question table): that study loads it

    def load(self, path: str | None = None, n: int | None = None, skip_bad_rows: bool = False,
             **kwargs: Any) -> Any:
        """The question table (see :func:`mmfragile.data.load_dataset`); for a study's own data (``study``) that
        study's records, from its loader called with the whole spec (``<prefix>:<path>``), ``n`` and the study
        loader's own keyword arguments (the judge study's: ``skipped=[]`` collects the bad rows)."""
        fn = _resolve(self.loader)
        kw = {**dict(self.loader_kwargs), **kwargs}
        if self.builtin:
            return fn(n=n, **kw)
        if self.study:
            if skip_bad_rows:
                raise TypeError(f"{self.name} is the {self.study} study's data: its loader takes its own keyword "
                                "for bad rows (the judge study's: skipped=[]), not skip_bad_rows")
            return fn(f"{self.prefix}:{path}", n=n, **kw)
        first, _, second = str(path).partition("::")
        if self.second_path:
            kw[self.second_path] = second or None
        elif second:
            raise ValueError(f"{self.name}: a spec of this benchmark has one path, got {path!r}")
        return fn(first, n=n, skip_bad_rows=skip_bad_rows, **kw)

    def write_fixture(self, root, bad_rows: bool = False) -> str:
        """A tiny copy in the published layout under ``root``; returns its dataset spec."""
        if not self.fixture:
            raise ValueError(f"{self.name}: no fixture writer")
        return _resolve(self.fixture)(root, bad_rows=bad_rows)


def _resolve(ref: str) -> Callable:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


_L = "mmfragile.data.loaders:"
_F = "mmfragile.data.fixtures:"
_PROMPTCEPTION_BASELINE = "Promptception baseline prompt (Fig. 3, Type 1.1: 'A. x' lines)"

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(name="A-OKVQA", prefix="aokvqa", loader=_L + "load_aokvqa",
              source="github.com/allenai/aokvqa + COCO 2017", aliases=("a-okvqa",),
              standard_format="lowercase-double_brackets-line_break", second_path="coco_dir",
              fixture=_F + "write_aokvqa"),
    Benchmark(name="HRBench-4K", prefix="hrbench4k", loader=_L + "load_hrbench",
              source="HF DreamMr/HR-Bench (hr_bench_4k.tsv / .parquet)",
              aliases=("hrbench-4k", "hrbench", "hr-bench-4k"), standard_format="uppercase-dot-line_break",
              loader_kwargs=(("name", "hrbench-4k"),), fixture=_F + "write_hrbench_4k"),
    Benchmark(name="HRBench-8K", prefix="hrbench8k", loader=_L + "load_hrbench",
              source="HF DreamMr/HR-Bench (hr_bench_8k.tsv / .parquet)",
              aliases=("hrbench-8k", "hr-bench-8k"), standard_format="uppercase-dot-line_break",
              standard_source="same release and prompt code as HR-Bench 4K (Table 5: Upp., Dot, Line break)",
              loader_kwargs=(("name", "hrbench-8k"),), fixture=_F + "write_hrbench_8k"),
    Benchmark(name="MMBench", prefix="mmbench", loader=_L + "load_mmbench",
              source="github.com/open-compass/MMBench (MMBench_DEV_EN_V11.tsv)",
              aliases=("mmbench-dev", "mmbench-en", "mmbench-dev-en", "mmbench-dev-en-v11"),
              standard_format="uppercase-dot-semicolon",
              fixture=_F + "write_mmbench"),
    Benchmark(name="MME-RealWorld-Lite", prefix="mme-realworld-lite", loader=_L + "load_mme_realworld_lite",
              source="HF yifanzhang114/MME-RealWorld-Base64 (mme_realworld_lite.tsv), lmms-eval parquet, or the "
                     "official JSON", aliases=("mme-rw-lite", "mme-realworld"),
              standard_format="uppercase-double_brackets-line_break", second_path="images_dir",
              fixture=_F + "write_mme_realworld_lite"),
    Benchmark(name="V*Bench", prefix="vstar", loader=_L + "load_vstar", source="HF craigwu/vstar_bench",
              aliases=("vbench", "vstarbench", "v*bench"),
              standard_format="uppercase-dot-line_break", fixture=_F + "write_vstar"),
    Benchmark(name="MMStar", prefix="mmstar", loader=_L + "load_mmstar",
              source="HF Lin-Chen/MMStar (mmstar.parquet) or VLMEvalKit MMStar.tsv",
              aliases=(), standard_format="uppercase-dot-line_break", standard_source=_PROMPTCEPTION_BASELINE,
              fixture=_F + "write_mmstar"),
    Benchmark(name="MMMU-Pro", prefix="mmmu-pro", loader=_L + "load_mmmu_pro",
              source="HF MMMU/MMMU_Pro (the setting from the config folder)",
              aliases=("mmmu-pro",), standard_format="uppercase-dot-line_break",
              standard_source=_PROMPTCEPTION_BASELINE, second_path="images_dir",
              loader_kwargs=(("setting", None),), fixture=_F + "write_mmmu_pro_folder"),
    Benchmark(name="MMMU-Pro (4 options)", prefix="mmmu-pro-s4", loader=_L + "load_mmmu_pro",
              source="HF MMMU/MMMU_Pro, standard (4 options)",
              aliases=("mmmu-pro-s4",), standard_format="uppercase-dot-line_break",
              standard_source=_PROMPTCEPTION_BASELINE, second_path="images_dir",
              loader_kwargs=(("setting", "s4"),), fixture=_F + "write_mmmu_pro_s4", family="MMMU-Pro"),
    Benchmark(name="MMMU-Pro (10 options)", prefix="mmmu-pro-s10", loader=_L + "load_mmmu_pro",
              source="HF MMMU/MMMU_Pro, standard (10 options)",
              aliases=("mmmu-pro-s10",), standard_format="uppercase-dot-line_break",
              standard_source=_PROMPTCEPTION_BASELINE, second_path="images_dir",
              loader_kwargs=(("setting", "s10"),), fixture=_F + "write_mmmu_pro_s10", family="MMMU-Pro"),
    Benchmark(name="MMMU-Pro (vision)", prefix="mmmu-pro-vision", loader=_L + "load_mmmu_pro",
              source="HF MMMU/MMMU_Pro, vision setting",
              aliases=("mmmu-pro-vision",), standard_format=None, standard_source="none: the options are in the image",
              options_in_image=True, second_path="images_dir",
              loader_kwargs=(("setting", "vision"),), fixture=_F + "write_mmmu_pro_vision", family="MMMU-Pro"),
    Benchmark(name="MVBench", prefix="mvbench", loader=_L + "load_mvbench",
              source="HF OpenGVLab/MVBench (json/ + video/)", aliases=(),
              standard_format="uppercase-dot-line_break", standard_source=_PROMPTCEPTION_BASELINE,
              video="20 tasks; mp4 / webm / gif clips or JPEG frame folders at 3 fps; start/end windows where "
                    "MVBench's data_list bounds the clip", fixture=_F + "write_mvbench"),
    Benchmark(name="MM-JudgeBias", prefix="mm-judgebias", loader="mmfragile.studies.judgebias.data:load_judge_dataset",
              source="HF naver-ai/MM-JudgeBias (parquet export or the authors' JSON) + its images",
              second_path="images_dir",
              standard_source="none: judge data, not multiple choice", fixture=_F + "write_mm_judgebias",
              study="judge"),
    Benchmark(name="generic", prefix="generic", loader=_L + "load_generic",
              source="your parquet / JSONL / JSON with question, options, answer",
              standard_source="none: pass --standard-format", fixture=_F + "write_generic"),
    Benchmark(name="synthetic-vqa", prefix="synthetic-vqa", loader="mmfragile.data.loaders:synthetic_vqa",
              source="generated with Pillow (mmfragile.data.synthetic), seed 0", aliases=("synthetic",),
              standard_format="uppercase-dot-line_break",
              standard_source="ours: the most common choice in Table 5 per factor (uppercase 4/5, dot 3/5, "
                              "line break 4/5)",
              video="6-frame clips", builtin=True),
    Benchmark(name="synthetic-image", prefix="synthetic-image", loader="mmfragile.data.loaders:synthetic_image",
              source="the image questions of synthetic-vqa", standard_format="uppercase-dot-line_break",
              standard_source="as synthetic-vqa", builtin=True, family="synthetic-vqa"),
    Benchmark(name="synthetic-text", prefix="synthetic-text", loader="mmfragile.data.loaders:synthetic_text",
              source="the text questions of synthetic-vqa", standard_format="uppercase-dot-line_break",
              standard_source="as synthetic-vqa", builtin=True, family="synthetic-vqa"),
    Benchmark(name="easy-vqa", prefix="easy-vqa", loader="mmfragile.data.easyvqa:load_easy_vqa_mc",
              source="PyPI easy-vqa (test split), multiple choice with seeded distractors",
              standard_format="uppercase-dot-line_break", standard_source="as synthetic-vqa", builtin=True),
    Benchmark(name="easy-vqa-media", prefix="easy-vqa-media", loader="mmfragile.data.easyvqa:load_easy_vqa_media",
              source="PyPI easy-vqa (test split): its questions as multiple choice + multi-image and 3-frame "
                     "video questions built from its pictures (mmfragile.data.easyvqa)",
              standard_format="uppercase-dot-line_break", standard_source="as synthetic-vqa",
              video="3-frame clips of easy-VQA pictures", builtin=True),
    Benchmark(name="easy-VQA judge set", prefix="easy-vqa-judge",
              loader="mmfragile.studies.judgebias.data:make_easy_vqa_judge_set",
              source="PyPI easy-vqa (test split): colour / shape questions with a correct and a wrong response each",
              standard_source="none: judge data, not multiple choice", builtin=True, study="judge"),
)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


_BY_NAME: dict[str, Benchmark] = {}
for _b in BENCHMARKS:
    for _key in (_b.name, _b.prefix, *_b.aliases):
        _BY_NAME.setdefault(_norm(_key), _b)
_BY_PREFIX = {b.prefix: b for b in BENCHMARKS}


def benchmark(name: str) -> Benchmark:
    """The record of a benchmark by its name, spec prefix, an alias or a question table's ``dataset`` value (case
    and punctuation ignored); KeyError naming the known ones otherwise."""
    b = _BY_NAME.get(_norm(name))
    if b is None:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(b.name for b in BENCHMARKS)}")
    return b


def by_prefix(prefix: str) -> Benchmark | None:
    """The record of a spec prefix (``mmbench`` of ``mmbench:<file>``), None if there is none."""
    return _BY_PREFIX.get(prefix)


def standard_formats() -> dict[str, str]:
    """Benchmark name -> standard format name, one entry per benchmark (its settings and subsets resolve through
    :func:`benchmark`)."""
    return {b.name: b.standard_format for b in BENCHMARKS if b.family is None and b.standard_format}


def inferred_standard() -> dict[str, str]:
    """The standard formats format-bias Table 5 does not print, with where each comes from."""
    return {b.name: b.standard_source for b in BENCHMARKS
            if b.family is None and b.standard_format and not b.builtin and b.standard_source != "Table 5"}


def spec_prefixes() -> list[str]:
    return [b.prefix for b in BENCHMARKS if not b.builtin]


def benchmark_table() -> pd.DataFrame:
    """The registry as a table (``python -m mmfragile benchmarks``)."""
    return pd.DataFrame([{"benchmark": b.name, "spec": b.prefix if b.builtin else
                          f"{b.prefix}:<path>" + ("[::<images>]" if b.second_path else ""),
                          "standard format": b.standard_format or "-", "from": b.standard_source,
                          "source": b.source} for b in BENCHMARKS])
