#!/usr/bin/env python
"""Extract the published Study-3 numbers (MM-JudgeBias, arXiv 2604.18164) from the seed text.

Source: ``$MMFRAGILE_SEEDS/mm-judgebias.txt`` - Table 2 (main results: 30 judge rows x 9 bias
types, reliability ``Avg.`` and inter-run / inter-sample variance, plus the ``Avg.`` row over
judges), Table 3 / Table 4 (summaries), Table 13 (Unnecessary-Image disentangled ablation),
Table 14 (abstention-aware, N/A-enabled results), Table 15 (abstention ratios) and Table 16
(prompt interventions).

Writes (tidy, long format) into ``src/mmfragile/resources/published/``:

* ``judgebias_table2.csv`` - ``category, judge, think, judge_label, column, dimension, metric, value``;
  ``column`` is a perturbation name (``text_dominance`` ... ``texture_insertion``), ``overall``
  (the Table-2 ``Avg.`` column = reliability score), ``inter_run_variance`` or
  ``inter_sample_variance``; ``dimension`` is ``integrality``/``congruity``/``robustness`` for a
  perturbation, else ``overall`` or ``variance``; ``metric`` is ``BD``, ``BC``, ``reliability`` or
  ``variance``.
  The across-judge ``Avg.`` row has ``category = judge = judge_label = "Avg."``.
  ``judge_label`` is unique: a judge evaluated both with and without reasoning gets `` (think)``
  appended on its reasoning row (e.g. ``Claude-Opus-4.5 (think)``).
* ``judgebias_prompt_settings.csv`` - Tables 14 and 16: ``source_table, judge, setting, column,
  dimension, metric, value``; settings ``original, na, score_guide, constraints, reasoning``;
  columns: the 9 perturbations, ``integrality, congruity, robustness, overall`` (for these four
  ``dimension`` repeats the column name and ``metric`` is ``reliability``).
* ``judgebias_abstention_ratio.csv`` - Table 15: ``judge, column, ratio`` (9 perturbations,
  ``integrality, congruity, robustness, overall``).
* ``judgebias_summary.csv`` - Tables 3 and 4: ``source_table, judge, setting, column, value``.
* ``judgebias_unnecessary_image_ablation.csv`` - Table 13: ``judge, setting, unbiased, biased, bc``.

The seed's markdown tables drop leading empty cells on some rows (the row then ends in an extra
empty cell), so rows are parsed by content: numeric cells in order, text cells for the names,
``$\\checkmark$`` for the Think / N/A flags.

Usage: ``python scripts/extract_judgebias.py [--seed PATH] [--out DIR]``
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from mmfragile.paths import seed_missing, seed_path

ROOT = Path(__file__).resolve().parents[1]
SEED_NAME = "mm-judgebias.txt"
DEFAULT_SEED = seed_path(SEED_NAME)  # None unless $MMFRAGILE_SEEDS holds it
DEFAULT_OUT = ROOT / "src" / "mmfragile" / "resources" / "published"

#: Column header in the paper -> perturbation name used throughout mmfragile.
PERTURBATION_HEADERS = {
    "TextDom.": "text_dominance",
    "ImgDom.": "image_dominance",
    "RespDom.": "response_dominance",
    "InstrMis.": "instruction_misalignment",
    "ImgMis.": "image_misalignment",
    "DetailDesc.": "detail_description",
    "UnnecImg.": "unnecessary_image",
    "VisualTrans.": "visual_transformation",
    "TextInsert.": "texture_insertion",
}
PERTURBATIONS = list(PERTURBATION_HEADERS.values())
DIMENSION = {p: ("integrality" if i < 3 else "congruity" if i < 5 else "robustness") for i, p in enumerate(PERTURBATIONS)}
METRIC = {p: ("BD" if DIMENSION[p] != "robustness" else "BC") for p in PERTURBATIONS}
AGGREGATES = ["integrality", "congruity", "robustness", "overall"]
CHECK = "$\\checkmark$"
CATEGORIES = {"Closed-source": "closed-source", "Open-source": "open-source", "Critic": "critic"}
SETTINGS_16 = {"Original": "original", "+ Score Guide": "score_guide", "+ Constraints": "constraints",
               "+ Reasoning": "reasoning"}
SMALL_JUDGES = ["GPT-5 mini", "Qwen3-VL", "LLaVA-Critic"]


def _table_rows(lines: list[str], caption: str) -> list[list[str]]:
    """Body rows (list of stripped cells) of the markdown table following the caption line."""
    starts = [i for i, l in enumerate(lines) if l.startswith(caption)]
    if len(starts) != 1:
        raise ValueError(f"seed: expected one caption starting {caption!r}, found {len(starts)}")
    rows, seen_table = [], False
    for l in lines[starts[0] + 1:]:
        if not l.startswith("|"):
            if seen_table:
                break
            continue
        seen_table = True
        cells = [c.strip() for c in l.strip().strip("|").split("|")]
        if all(re.fullmatch(r"-+|", c) for c in cells):
            continue
        rows.append(cells)
    if not rows:
        raise ValueError(f"seed: no table after {caption!r}")
    return rows


def _num(c: str) -> float | None:
    try:
        return float(c)
    except ValueError:
        return None


def _split(cells: list[str]) -> tuple[list[str], bool, list[float]]:
    """(text cells without the checkmark, has checkmark, numbers in order)."""
    nums = [v for v in (_num(c) for c in cells) if v is not None]
    text = [c for c in cells if c and _num(c) is None and c != CHECK]
    return text, CHECK in cells, nums


def parse_table2(lines: list[str]) -> pd.DataFrame:
    rows = _table_rows(lines, "Table 2: Main experimental results on MM-JudgeBias")
    header = rows[1]
    pert = [PERTURBATION_HEADERS[h] for h in header if h in PERTURBATION_HEADERS]
    assert pert == PERTURBATIONS, header
    cols = PERTURBATIONS + ["overall", "inter_run_variance", "inter_sample_variance"]
    recs, category = [], None
    for cells in rows[2:]:
        text, think, nums = _split(cells)
        if len(nums) != 12:
            raise ValueError(f"Table 2: row {cells} has {len(nums)} numbers, expected 12")
        if text and text[0] in CATEGORIES:
            category = CATEGORIES[text.pop(0)]
        if text == ["Avg."]:
            cat, judge = "Avg.", "Avg."
        else:
            assert len(text) == 1 and category, cells
            cat, judge = category, text[0]
        for c, v in zip(cols, nums):
            metric = METRIC.get(c, "reliability" if c == "overall" else "variance")
            dim = DIMENSION.get(c, "overall" if c == "overall" else "variance")
            recs.append(dict(category=cat, judge=judge, think=think, column=c,
                             dimension=dim, metric=metric, value=v))
    df = pd.DataFrame(recs)
    n_variants = df.groupby("judge")["think"].nunique()
    dup = set(n_variants[n_variants > 1].index)
    df.insert(3, "judge_label", [f"{j} (think)" if (j in dup and t) else j for j, t in zip(df.judge, df.think)])
    return df


def _agg_cols(header: list[str]) -> list[str]:
    out = []
    for h in header:
        if h in PERTURBATION_HEADERS:
            out.append(PERTURBATION_HEADERS[h])
        elif h.lower() in AGGREGATES:
            out.append(h.lower())
        elif h in ("Overall Ratio",):
            out.append("overall")
    return out


def _long(recs: list[dict], cols: list[str], nums: list[float], **key) -> None:
    for c, v in zip(cols, nums):
        metric = METRIC.get(c, "reliability")
        recs.append(dict(**key, column=c, dimension=DIMENSION.get(c, c), metric=metric, value=v))


def parse_table14(lines: list[str]) -> pd.DataFrame:
    rows = _table_rows(lines, "Table 14: Full results of abstention-aware evaluation")
    cols = _agg_cols(rows[0])
    assert cols == PERTURBATIONS + AGGREGATES, rows[0]
    recs, judge = [], None
    for cells in rows[1:]:
        text, flag, nums = _split(cells)
        assert len(nums) == 13, cells
        if text:
            judge = text[0]
        _long(recs, cols, nums, source_table=14, judge=judge, setting="na" if flag else "original")
    return pd.DataFrame(recs)


def parse_table16(lines: list[str]) -> pd.DataFrame:
    rows = _table_rows(lines, "Table 16: Full results of prompt interventions")
    cols = _agg_cols(rows[0])
    assert cols == PERTURBATIONS + AGGREGATES, rows[0]
    recs, judge = [], None
    for cells in rows[1:]:
        text, _, nums = _split(cells)
        assert len(nums) == 13, cells
        if len(text) == 2:
            judge = text.pop(0)
        _long(recs, cols, nums, source_table=16, judge=judge, setting=SETTINGS_16[text[0]])
    return pd.DataFrame(recs)


def parse_table15(lines: list[str]) -> pd.DataFrame:
    rows = _table_rows(lines, "Table 15: Abstention ratio under the N/A-enabled setting")
    cols = _agg_cols(rows[0])
    assert cols == PERTURBATIONS + AGGREGATES, rows[0]
    recs = []
    for cells in rows[1:]:
        text, _, nums = _split(cells)
        assert len(text) == 1 and len(nums) == 13, cells
        recs += [dict(judge=text[0], column=c, ratio=v) for c, v in zip(cols, nums)]
    return pd.DataFrame(recs)


def parse_summaries(lines: list[str]) -> pd.DataFrame:
    recs = []
    rows = _table_rows(lines, "Table 3: Abstention-aware evaluation")
    assert rows[0] == ["Model", "N/A", "Int.", "Cong.", "Rob.", "Overall", "Ratio"], rows[0]
    judge = None
    for cells in rows[1:]:
        text, flag, nums = _split(cells)
        if text:
            judge = text[0]
        cols = ["integrality", "congruity", "robustness", "overall", "ratio"][: len(nums)]
        recs += [dict(source_table=3, judge=judge, setting="na" if flag else "original", column=c, value=v)
                 for c, v in zip(cols, nums)]
    rows = _table_rows(lines, "Table 4: Prompt-level intervention")
    assert rows[0] == ["Model", "Orig.", "+Guide", "+Const.", "+Reason."], rows[0]
    for cells in rows[1:]:
        text, _, nums = _split(cells)
        assert len(nums) == 4, cells
        recs += [dict(source_table=4, judge=text[0], setting=s, column="overall", value=v)
                 for s, v in zip(["original", "score_guide", "constraints", "reasoning"], nums)]
    return pd.DataFrame(recs)


def parse_table13(lines: list[str]) -> pd.DataFrame:
    rows = _table_rows(lines, "Table 13: Disentangled ablation of the Unnecessary-Image bias")
    recs, judge = [], None
    for cells in rows[1:]:
        text, _, nums = _split(cells)
        assert len(nums) == 1, cells
        if len(text) == 4:
            judge = text.pop(0)
        setting, unbiased, biased = text
        recs.append(dict(judge=judge, setting=setting, unbiased=unbiased, biased=biased, bc=nums[0]))
    return pd.DataFrame(recs)


def extract(seed: Path) -> dict[str, pd.DataFrame]:
    lines = seed.read_text(encoding="utf-8").splitlines()
    t2 = parse_table2(lines)
    assert t2.judge_label.nunique() == 31, t2.judge_label.nunique()  # 30 judge rows + Avg.
    settings = pd.concat([parse_table14(lines), parse_table16(lines)], ignore_index=True)
    assert set(settings.judge) == set(SMALL_JUDGES), set(settings.judge)
    return {
        "judgebias_table2.csv": t2,
        "judgebias_prompt_settings.csv": settings,
        "judgebias_abstention_ratio.csv": parse_table15(lines),
        "judgebias_summary.csv": parse_summaries(lines),
        "judgebias_unnecessary_image_ablation.csv": parse_table13(lines),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=Path, default=DEFAULT_SEED)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.seed is None:
        ap.error(seed_missing(SEED_NAME) + " (or pass --seed PATH)")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, df in extract(args.seed).items():
        df.to_csv(args.out / name, index=False)
        print(f"wrote {args.out / name} ({len(df)} rows)")


if __name__ == "__main__":
    main()
