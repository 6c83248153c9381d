#!/usr/bin/env python
"""Extract the published Study-1 numbers (prompt-format bias in multiple-choice VQA) from the seed text.

Source: ``$MMFRAGILE_SEEDS/format-bias-mcvqa.txt`` ("Unexplored Flaws in Multiple-Choice VQA
Evaluations"), appendix C.4 (Table 7, bias-mitigation results) and C.5 (Tables 8-12, full results
of 7 MLLMs x 48 prompt formats on 5 datasets).

Writes (tidy, long format) into ``src/mmfragile/resources/published/``:

* ``format_bias_results.csv`` - one row per dataset x model x option_ids x delimiter x separator
  (5 x 7 x 48 = 1680 rows): ``dataset, model, option_ids, delimiter, separator, accuracy, coverage``
  (both in percent, as printed, 3 decimals at most).
* ``format_bias_mitigation.csv`` - Table 7, one row per dataset x model x method
  (3 x 7 x 5 = 105 rows): ``dataset, model, method, accuracy, rank``; methods are
  ``pseudo_gt, vanilla, pia, pride, cp_ln``; PIA/PriDe on V*Bench are NA (empty cells).
* ``format_bias_mitigation_summary.csv`` - the footer rows of Table 7, one row per dataset x method:
  ``dataset, method, complexity, ranking_correlation, correctly_ranked, n_models``.

Number format of the seed: values sit in ``$...$``; digit groups are separated by commas on both sides
of the decimal point (siunitx style), so ``$77.990,4$`` is 77.9904 and ``$219,840$`` is 219840.

Usage: ``python scripts/extract_format_bias.py [--seed PATH] [--out DIR]``
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from mmfragile.paths import seed_missing, seed_path

ROOT = Path(__file__).resolve().parents[1]
SEED_NAME = "format-bias-mcvqa.txt"
DEFAULT_SEED = seed_path(SEED_NAME)  # None unless $MMFRAGILE_SEEDS holds it
DEFAULT_OUT = ROOT / "src" / "mmfragile" / "resources" / "published"

MODELS = ["Gemma-3", "LLaVA-1.5", "LLaVA-OV", "Phi-3.5", "Phi-4", "Qwen-2-VL", "Qwen-2.5-VL"]
#: Table number -> canonical dataset name (captions spell them "HR-Bench-4K", "MM-Bench").
FULL_TABLES = {8: "A-OKVQA", 9: "HRBench-4K", 10: "MMBench", 11: "MME-RealWorld-Lite", 12: "V*Bench"}
#: Circular-evaluation question counts (Tab. 5 / Tab. 6: "per prompt format variant").
N_CIRCULAR = {"A-OKVQA": 4580, "HRBench-4K": 800, "MMBench": 4876, "MME-RealWorld-Lite": 9595, "V*Bench": 596}

ID_MAP = {"Upp.": "uppercase", "Low.": "lowercase", "Num.": "numbers", "Rom.": "roman"}
DELIM_MAP = {"Dot": "dot", "Colon": "colon", "Bracket": "bracket", "Double brackets": "double_brackets"}
SEP_MAP = {"Comma": "comma", "Line break": "line_break", "Semicolon": "semicolon"}
METHOD_MAP = {"Pseudo GT": "pseudo_gt", "Vanilla": "vanilla", "PIA": "pia", "PriDe": "pride", "CP-LN": "cp_ln"}
MITIGATION_DATASETS = {"A-OKVQA": "A-OKVQA", "HRBench-4K": "HRBench-4K", "V*Bench": "V*Bench"}


def parse_number(tok: str) -> float:
    """``'$77.990,4$'`` -> 77.9904, ``'$219,840$'`` -> 219840, ``'$-$'``/``''`` -> nan, ``'36.75'`` -> 36.75."""
    t = tok.strip().strip("$").replace(",", "").strip()
    if t in ("", "-", "NA"):
        return float("nan")
    return float(t)


def _find_line(lines: list[str], pattern: str, start: int = 0) -> int:
    rx = re.compile(pattern)
    for i in range(start, len(lines)):
        if rx.search(lines[i]):
            return i
    raise ValueError(f"seed: no line matching {pattern!r} after line {start + 1}")


def parse_full_table(lines: list[str], table_no: int) -> pd.DataFrame:
    """Parse one of Tables 8-12 (3 separators x 7 models x {Acc, Cov} rows, 4 delimiters x 4 ID sets columns)."""
    dataset = FULL_TABLES[table_no]
    i0 = _find_line(lines, rf"^Table {table_no}: Full results of prompt format variations")
    # header: delimiter order, then ID-set order
    i_del = _find_line(lines, r"^\s*Dot\s", i0)
    delims = [d.strip() for d in lines[i_del].split("\t") if d.strip()]
    assert delims == ["Dot", "Colon", "Bracket", "Double brackets"], (table_no, delims)
    i_hdr = _find_line(lines, r"^Option sep\.\tModel", i_del)
    ids = [c.strip() for c in lines[i_hdr].split("\t")[2:] if c.strip()]
    assert ids == ["Upp.", "Low.", "Num.", "Rom."] * 4, (table_no, ids)
    columns = [(DELIM_MAP[delims[k // 4]], ID_MAP[ids[k]]) for k in range(16)]

    rows = []
    sep = model = None
    i = i_hdr + 1
    while i < len(lines) and lines[i].strip():
        fields = lines[i].split("\t")
        where = f"seed line {i + 1} (Table {table_no})"
        if fields[0].strip():
            sep = SEP_MAP[fields[0].strip()]
        if fields[1].strip():
            model = fields[1].strip()
        metric = fields[2].strip()
        values = re.findall(r"\$([^$]*)\$", lines[i])
        if len(values) != 16 or model not in MODELS or metric not in ("Acc. [%]", "Cov. [%]"):
            raise ValueError(f"{where}: cannot parse {lines[i]!r}")
        key = "accuracy" if metric.startswith("Acc") else "coverage"
        for (delim, oid), v in zip(columns, values):
            rows.append(dict(dataset=dataset, model=model, option_ids=oid, delimiter=delim,
                             separator=sep, metric=key, value=parse_number(v)))
        i += 1
    long = pd.DataFrame(rows)
    wide = (long.pivot_table(index=["dataset", "model", "option_ids", "delimiter", "separator"],
                             columns="metric", values="value", aggfunc="first")
            .reset_index())
    wide.columns.name = None
    return wide[["dataset", "model", "option_ids", "delimiter", "separator", "accuracy", "coverage"]]


def parse_mitigation(lines: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Parse Table 7 (a)-(c): per-model accuracy/rank per method and the footer rows."""
    i7 = _find_line(lines, r"^Table 7: Full bias mitigation results")
    rows, summary = [], []
    for name, dataset in MITIGATION_DATASETS.items():
        i = _find_line(lines, rf"^\([abc]\) Bias mitigation results on {re.escape(name)}\.", i7)
        i_m = _find_line(lines, r"^\tPseudo GT", i)
        methods = [METHOD_MAP[m.strip()] for m in lines[i_m].split("\t") if m.strip()]
        assert methods == ["pseudo_gt", "vanilla", "pia", "pride", "cp_ln"], methods
        i_model = _find_line(lines, r"^Model\t", i_m) + 1
        for k, model in enumerate(MODELS):
            fields = lines[i_model + k].split("\t")
            assert fields[0] == model and len(fields) == 11, (dataset, lines[i_model + k])
            for j, method in enumerate(methods):
                acc, rank = parse_number(fields[1 + 2 * j]), parse_number(fields[2 + 2 * j])
                rows.append(dict(dataset=dataset, model=model, method=method, accuracy=acc,
                                 rank=None if np.isnan(rank) else int(rank)))
        i_c = _find_line(lines, r"^Complexity", i_model)
        complexity = [parse_number(f) for f in lines[i_c].split("\t")[1:] if f.strip()]
        i_r = _find_line(lines, r"^Ranking correlation", i_c)
        corr = [parse_number(f) for f in lines[i_r].split("\t")[1:] if f.strip()]
        i_k = _find_line(lines, r"^Correctly ranked", i_r)
        correct = []
        for f in lines[i_k].split("\t")[1:]:
            if not f.strip():
                continue
            m = re.search(r"\((\d+)/(\d+)\)", f)
            correct.append((int(m.group(1)), int(m.group(2))) if m else (None, None))
        assert len(complexity) == 5 and len(corr) == 4 and len(correct) == 4, (dataset, complexity, corr, correct)
        for j, method in enumerate(methods):
            summary.append(dict(
                dataset=dataset, method=method,
                complexity=None if np.isnan(complexity[j]) else int(complexity[j]),
                ranking_correlation=np.nan if j == 0 else corr[j - 1],
                correctly_ranked=None if j == 0 else correct[j - 1][0],
                n_models=len(MODELS) if j == 0 else correct[j - 1][1],
            ))
    mit = pd.DataFrame(rows)
    mit["rank"] = mit["rank"].astype("Int64")
    summ = pd.DataFrame(summary)
    for c in ("complexity", "correctly_ranked", "n_models"):
        summ[c] = summ[c].astype("Int64")
    return mit, summ


def check(results: pd.DataFrame, mit: pd.DataFrame, summ: pd.DataFrame) -> None:
    """Counts and hand-read spot checks (values typed in from the seed text by a human)."""
    assert len(results) == 7 * 5 * 48, len(results)
    assert not results[["accuracy", "coverage"]].isna().any().any()
    assert results.groupby(["dataset", "model"]).size().eq(48).all()
    assert set(results.option_ids) == {"uppercase", "lowercase", "numbers", "roman"}
    assert set(results.delimiter) == {"dot", "colon", "bracket", "double_brackets"}
    assert set(results.separator) == {"line_break", "comma", "semicolon"}
    assert results.duplicated(["dataset", "model", "option_ids", "delimiter", "separator"]).sum() == 0
    assert results.accuracy.between(0, 100).all() and results.coverage.between(0, 100).all()
    assert (results.accuracy <= results.coverage + 1e-9).all(), "accuracy can never exceed coverage"

    def cell(ds, model, oid, de, se):
        r = results[(results.dataset == ds) & (results.model == model) & (results.option_ids == oid)
                    & (results.delimiter == de) & (results.separator == se)]
        assert len(r) == 1
        return float(r.accuracy.iloc[0]), float(r.coverage.iloc[0])

    # Tab. 8, first data row/cell; LLaVA-OV lowercase/double brackets collapse; last cell of the table
    assert cell("A-OKVQA", "Gemma-3", "uppercase", "dot", "comma") == (77.969, 100.0)
    assert cell("A-OKVQA", "LLaVA-OV", "lowercase", "double_brackets", "comma") == (3.821, 4.389)
    assert cell("A-OKVQA", "Qwen-2.5-VL", "roman", "double_brackets", "semicolon") == (85.502, 99.978)
    # Tab. 9 Phi-4 roman/bracket/line break; Tab. 10 Qwen-2-VL uppercase/double brackets/comma
    assert cell("HRBench-4K", "Phi-4", "roman", "bracket", "line_break") == (56.375, 96.375)
    assert cell("MMBench", "Qwen-2-VL", "uppercase", "double_brackets", "comma") == (66.181, 79.532)
    # Tab. 11 LLaVA-1.5 roman/double brackets/line break; Tab. 12 LLaVA-1.5 lowercase/double brackets/line break
    assert cell("MME-RealWorld-Lite", "LLaVA-1.5", "roman", "double_brackets", "line_break") == (4.763, 10.464)
    assert cell("V*Bench", "LLaVA-1.5", "lowercase", "double_brackets", "line_break") == (0.168, 0.168)
    # Phi-3.5 and LLaVA-1.5 never answer with numbers (0 % coverage in all 5 x 12 cells each)
    num = results[(results.option_ids == "numbers") & results.model.isin(["Phi-3.5", "LLaVA-1.5"])]
    assert len(num) == 2 * 5 * 12 and (num.coverage == 0).all()
    # accuracies are counts over the N x O circular-evaluation questions of Tab. 5 (3-decimal rounding)
    for ds, n in N_CIRCULAR.items():
        k = results.loc[results.dataset == ds, "accuracy"] * n / 100
        assert (k - k.round()).abs().max() <= 0.0005 * n / 100 + 1e-9, ds

    assert len(mit) == 3 * 7 * 5, len(mit)
    assert mit.loc[mit.method.isin(["pia", "pride"]) & (mit.dataset == "V*Bench"), "accuracy"].isna().all()
    assert mit.accuracy.notna().sum() == 105 - 14
    m = mit.set_index(["dataset", "model", "method"])
    assert m.loc[("A-OKVQA", "Gemma-3", "pseudo_gt"), "accuracy"] == 77.9904
    assert m.loc[("A-OKVQA", "LLaVA-1.5", "pride"), "accuracy"] == 77.1179
    assert m.loc[("HRBench-4K", "LLaVA-OV", "vanilla"), "rank"] == 1
    assert m.loc[("HRBench-4K", "Phi-4", "vanilla"), "rank"] == 1
    assert m.loc[("V*Bench", "Qwen-2.5-VL", "pseudo_gt"), "accuracy"] == 77.4364
    assert m.loc[("V*Bench", "Phi-4", "cp_ln"), ("accuracy", "rank")].tolist() == [62.83, 4]
    s = summ.set_index(["dataset", "method"])
    assert s.loc[("A-OKVQA", "pseudo_gt"), "complexity"] == 219840
    assert s.loc[("A-OKVQA", "vanilla"), ["ranking_correlation", "correctly_ranked"]].tolist() == [0.32, 3]
    assert s.loc[("HRBench-4K", "cp_ln"), ["ranking_correlation", "correctly_ranked"]].tolist() == [0.93, 3]
    assert pd.isna(s.loc[("V*Bench", "pia"), "ranking_correlation"])
    assert s.loc[("V*Bench", "cp_ln"), "complexity"] == 596


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=Path, default=DEFAULT_SEED)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.seed is None:
        ap.error(seed_missing(SEED_NAME) + " (or pass --seed PATH)")
    lines = args.seed.read_text(encoding="utf-8").splitlines()

    results = pd.concat([parse_full_table(lines, t) for t in FULL_TABLES], ignore_index=True)
    cat = {"dataset": list(FULL_TABLES.values()), "model": MODELS,
           "option_ids": list(ID_MAP.values()), "delimiter": list(DELIM_MAP.values()),
           "separator": ["line_break", "comma", "semicolon"]}
    order = [c for c in cat]
    results = (results.assign(**{c: pd.Categorical(results[c], categories=v, ordered=True) for c, v in cat.items()})
               .sort_values(order).reset_index(drop=True))
    for c in order:
        results[c] = results[c].astype(str)
    mit, summ = parse_mitigation(lines)
    check(results, mit, summ)

    args.out.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out / "format_bias_results.csv", index=False, float_format="%.6g")
    mit.to_csv(args.out / "format_bias_mitigation.csv", index=False, float_format="%.6g")
    summ.to_csv(args.out / "format_bias_mitigation_summary.csv", index=False, float_format="%.6g")
    print(f"wrote {len(results)} + {len(mit)} + {len(summ)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
