#!/usr/bin/env python
"""Extract the published Promptception numbers from the seed text into tidy CSVs.

Reads ``$MMFRAGILE_SEEDS/promptception.txt`` (or ``--seed``) and writes, into
``src/mmfragile/resources/published/`` (or ``--out``):

* ``promptception_accuracy.csv``  - Appendix B Tables 6 (MVBench), 7 (MMMU-Pro, s4 columns only) and
  8 (MMStar): ``benchmark, model, prompt_id, accuracy`` (accuracy in %, prompt_id a string "1.1").
* ``promptception_mmmupro_settings.csv`` - Table 7 for the two models that were also run on the
  10-option (s10) and vision-only (v) MMMU-Pro settings: ``benchmark, setting, model, prompt_id,
  accuracy`` (setting in s4/s10/v; the "-" cells of the v columns are dropped).
* ``promptception_table2.csv`` - Table 2: ``benchmark, model, trimmed_mean, baseline`` ("-" cells,
  i.e. Llama/Molmo on MMMU-Pro and MVBench, are dropped).
* ``promptception_table9.csv`` - Table 9 persona ablation: ``model, prompt_id, persona, accuracy``
  (``persona`` is "with" or "without"; MMStar).
* ``promptception_table10.csv`` - Table 10: ``model, evaluation_set, trimmed_mean, baseline``
  (``evaluation_set`` "full" = 4000 MVBench questions, "subset" = the 100-video subset).

The seed is a flattened PDF text: every table is a block of tab-separated lines followed (after a blank
line) by its caption "Table N: ...".  Each table is located by its caption, parsed, and checked with
hard asserts (row/column counts and spot values read off the text by hand), so a changed seed fails
loudly instead of producing silently wrong CSVs.

Usage: ``python scripts/extract_promptception.py [--seed PATH] [--out DIR]``
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from mmfragile.paths import seed_missing, seed_path

REPO = Path(__file__).resolve().parents[1]
SEED_NAME = "promptception.txt"
DEFAULT_SEED = seed_path(SEED_NAME)  # None unless $MMFRAGILE_SEEDS holds it
DEFAULT_OUT = REPO / "src" / "mmfragile" / "resources" / "published"

# Canonical model names = the names of Table 2; the appendix tables spell them differently.
MODEL_ALIASES = {
    "LLaVA-OV-7B": "LLaVA-OV-7B",
    "Qwen2-VL-7B-Instruct": "Qwen2-VL-7B",
    "Qwen2-VL-7B": "Qwen2-VL-7B",
    "MiniCPM-V2.6": "MiniCPM-V 2.6",
    "MiniCPM-V-2.6-8B": "MiniCPM-V 2.6",
    "MiniCPM-V 2.6": "MiniCPM-V 2.6",
    "Llama-3.2-11B-Vision": "Llama-3.2-11B-Vision",
    "Molmo-7B-D-0924": "Molmo-7B-D-0924",
    "InternVL2.5-1B": "InternVL2.5-1B",
    "InternVL2.5-8B": "InternVL2.5-8B",
    "InternVL2.5-38B": "InternVL2.5-38B",
    "GPT4o": "GPT-4o",
    "GPT-4o": "GPT-4o",
    "Gemini 1.5 Pro": "Gemini 1.5 Pro",
    "Gemini1.5-Pro": "Gemini 1.5 Pro",
}
# Table 7 header -> (canonical model, MMMU-Pro setting)
MMMU_COLUMNS = {
    "InternVL2.5-8B-s4": ("InternVL2.5-8B", "s4"),
    "InternVL2.5-8B-s10": ("InternVL2.5-8B", "s10"),
    "InternVL2.5-8B-v": ("InternVL2.5-8B", "v"),
    "Gemini1.5-Pro": ("Gemini 1.5 Pro", "s4"),
    "Gemini1.5-Pro s10": ("Gemini 1.5 Pro", "s10"),
    "Gemini1.5-Pro v": ("Gemini 1.5 Pro", "v"),
}
PROMPT_ID = re.compile(r"^\d{1,2}\.\d$")
# Number of prompt types per category (Appendix A, Table 5): 61 in total.
TYPES_PER_CATEGORY = {1: 3, 2: 9, 3: 2, 4: 5, 5: 3, 6: 4, 7: 6, 8: 4, 9: 3, 10: 2, 11: 5, 12: 5, 13: 4, 14: 3, 15: 3}
ALL_PROMPTS = [f"{c}.{i}" for c, n in TYPES_PER_CATEGORY.items() for i in range(1, n + 1)]
VIDEO_ONLY = {"11.4", "11.5"}  # temporal prompts, only used on MVBench
IMAGE_PROMPTS = [p for p in ALL_PROMPTS if p not in VIDEO_ONLY]


def table_block(lines: list[str], number: int) -> list[list[str]]:
    """Tab-split lines of the table whose caption is 'Table <number>:' (header line first)."""
    cap = [i for i, l in enumerate(lines) if l.startswith(f"Table {number}:")]
    assert len(cap) == 1, f"caption of Table {number} found {len(cap)} times"
    end = cap[0] - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    start = end
    while start - 1 >= 0 and lines[start - 1].strip():
        start -= 1
    return [l.split("\t") for l in lines[start : end + 1]]


def to_float(cell: str) -> float | None:
    cell = cell.strip()
    return None if cell in {"-", "–", ""} else float(cell)


def parse_appendix_table(block: list[list[str]], benchmark: str, n_rows: int) -> pd.DataFrame:
    header, rows = block[0], block[1:]
    assert header[0] == "Type", header
    assert len(rows) == n_rows, f"{benchmark}: {len(rows)} prompt rows, expected {n_rows}"
    out = []
    for r in rows:
        assert len(r) == len(header), f"{benchmark}: row {r[0]} has {len(r)} cells, header {len(header)}"
        pid = r[0].strip()
        assert PROMPT_ID.match(pid), f"{benchmark}: bad prompt id {pid!r}"
        for col, cell in zip(header[1:], r[1:]):
            v = to_float(cell)
            if v is None:
                continue
            model, setting = MMMU_COLUMNS.get(col, (MODEL_ALIASES.get(col), "s4"))
            assert model is not None, f"{benchmark}: unknown model column {col!r}"
            out.append(dict(benchmark=benchmark, setting=setting, model=model, prompt_id=pid, accuracy=v))
    return pd.DataFrame(out)


def parse_table2(block: list[list[str]]) -> pd.DataFrame:
    assert block[0][0] == "Model" and block[0][1] == "MMStar", block[0]
    benches = ["MMStar", "MMMU-Pro", "MVBench"]
    rows = block[2:]
    assert len(rows) == 10, len(rows)
    out = []
    for r in rows:
        assert len(r) == 7, r
        model = MODEL_ALIASES[r[0].strip()]
        for j, b in enumerate(benches):
            tm, base = to_float(r[1 + 2 * j]), to_float(r[2 + 2 * j])
            assert (tm is None) == (base is None), r
            if tm is not None:
                out.append(dict(benchmark=b, model=model, trimmed_mean=tm, baseline=base))
    return pd.DataFrame(out)


def parse_table9(block: list[list[str]]) -> pd.DataFrame:
    header, rows = block[0], block[1:]
    assert header == ["Prompt", "IVL2.5-8B (w/)", "IVL2.5-8B (w/o)", "GPT-4o (w/)", "GPT-4o (w/o)"], header
    assert len(rows) == 4
    out = []
    for r in rows:
        for col, cell in zip(header[1:], r[1:]):
            model = "InternVL2.5-8B" if col.startswith("IVL") else "GPT-4o"
            persona = "without" if "w/o" in col else "with"
            out.append(dict(benchmark="MMStar", model=model, prompt_id=r[0].strip(), persona=persona,
                            accuracy=float(cell)))
    return pd.DataFrame(out)


def parse_table10(block: list[list[str]]) -> pd.DataFrame:
    assert block[0][0] == "Model" and block[0][1].startswith("Full Set"), block[0]
    rows = block[2:]
    assert len(rows) == 8, len(rows)
    out = []
    for r in rows:
        model = MODEL_ALIASES[r[0].strip()]
        for j, s in enumerate(["full", "subset"]):
            tm, base = to_float(r[1 + 2 * j]), to_float(r[2 + 2 * j])
            if tm is not None:
                out.append(dict(benchmark="MVBench", model=model, evaluation_set=s, trimmed_mean=tm, baseline=base))
    return pd.DataFrame(out)


def extract(seed: Path) -> dict[str, pd.DataFrame]:
    lines = seed.read_text(encoding="utf-8").split("\n")

    mv = parse_appendix_table(table_block(lines, 6), "MVBench", 61)
    mmmu = parse_appendix_table(table_block(lines, 7), "MMMU-Pro", 59)
    star = parse_appendix_table(table_block(lines, 8), "MMStar", 59)

    # --- structural checks -------------------------------------------------------------------
    for df, prompts, n_models in ((mv, ALL_PROMPTS, 8), (star, IMAGE_PROMPTS, 10)):
        assert df.model.nunique() == n_models, (df.benchmark.iat[0], sorted(df.model.unique()))
        for m, g in df.groupby("model"):
            assert list(g.prompt_id) == prompts, (df.benchmark.iat[0], m)
    s4 = mmmu[mmmu.setting == "s4"]
    assert s4.model.nunique() == 8
    for m, g in s4.groupby("model"):
        assert list(g.prompt_id) == IMAGE_PROMPTS, m
    # vision-only setting was only run with 1.1 and categories 4-15 (46 prompts)
    v = mmmu[mmmu.setting == "v"]
    assert v.groupby("model").size().to_dict() == {"Gemini 1.5 Pro": 46, "InternVL2.5-8B": 46}
    assert (mmmu[mmmu.setting == "s10"].groupby("model").size() == 59).all()

    # --- spot values read off the seed by hand ---------------------------------------------
    def val(df, model, pid, setting="s4"):
        sel = df[(df.model == model) & (df.prompt_id == pid) & (df.setting == setting)]
        assert len(sel) == 1, (model, pid, setting)
        return sel.accuracy.iat[0]

    assert val(mv, "LLaVA-OV-7B", "1.1") == 56.50
    assert val(mv, "Gemini 1.5 Pro", "9.2") == 19.60
    assert val(mv, "InternVL2.5-1B", "13.1") == 37.00
    assert val(mv, "MiniCPM-V 2.6", "15.3") == 45.60
    assert val(mmmu, "InternVL2.5-8B", "6.2", "v") == 19.80
    assert val(mmmu, "Gemini 1.5 Pro", "9.2", "s10") == 8.80
    assert val(mmmu, "Gemini 1.5 Pro", "9.2") == 18.30
    assert val(mmmu, "GPT-4o", "6.4") == 68.00
    assert val(mmmu, "InternVL2.5-1B", "9.3") == 19.40
    assert val(star, "Molmo-7B-D-0924", "7.6") == 34.10
    assert val(star, "Llama-3.2-11B-Vision", "15.3") == 49.80
    assert val(star, "GPT-4o", "9.2") == 28.30
    assert val(star, "InternVL2.5-38B", "3.2") == 69.60

    acc = pd.concat([mv, s4, star], ignore_index=True)[["benchmark", "model", "prompt_id", "accuracy"]]
    assert len(acc) == 8 * 61 + 8 * 59 + 10 * 59 == 1550
    settings = mmmu[mmmu.model.isin(["InternVL2.5-8B", "Gemini 1.5 Pro"])][
        ["benchmark", "setting", "model", "prompt_id", "accuracy"]].reset_index(drop=True)
    assert len(settings) == 2 * (59 + 59 + 46)

    t2 = parse_table2(table_block(lines, 2))
    assert len(t2) == 10 + 8 + 8
    row = t2[(t2.benchmark == "MMMU-Pro") & (t2.model == "GPT-4o")].iloc[0]
    assert (row.trimmed_mean, row.baseline) == (57.8, 53.5)
    row = t2[(t2.benchmark == "MMStar") & (t2.model == "Molmo-7B-D-0924")].iloc[0]
    assert (row.trimmed_mean, row.baseline) == (53.2, 55.9)
    # Table 2 "Base" is the accuracy of prompt 1.1 (the baseline prompt of Fig. 3) in Tables 6-8.
    merged = t2.merge(acc[acc.prompt_id == "1.1"], on=["benchmark", "model"], how="left", validate="1:1")
    assert merged.accuracy.notna().all()
    assert (merged.accuracy - merged.baseline).abs().max() < 1e-9

    t9 = parse_table9(table_block(lines, 9))
    assert len(t9) == 16
    assert t9[(t9.model == "GPT-4o") & (t9.prompt_id == "2.7") & (t9.persona == "without")].accuracy.iat[0] == 59.2
    # the "with persona" numbers are the Table 8 numbers
    chk = t9[t9.persona == "with"].merge(star, on=["model", "prompt_id"])
    assert len(chk) == 8 and (chk.accuracy_x == chk.accuracy_y).all()

    t10 = parse_table10(table_block(lines, 10))
    assert len(t10) == 6 * 2 + 2
    assert t10[(t10.model == "InternVL2.5-8B") & (t10.evaluation_set == "subset")].trimmed_mean.iat[0] == 70.55
    chk = t10[t10.evaluation_set == "full"].merge(t2[t2.benchmark == "MVBench"], on=["benchmark", "model"])
    assert len(chk) == 6 and (chk.trimmed_mean_x == chk.trimmed_mean_y).all() and (chk.baseline_x == chk.baseline_y).all()

    return {
        "promptception_accuracy.csv": acc,
        "promptception_mmmupro_settings.csv": settings,
        "promptception_table2.csv": t2,
        "promptception_table9.csv": t9,
        "promptception_table10.csv": t10,
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
        df.to_csv(args.out / name, index=False, float_format="%.2f")
        print(f"wrote {args.out / name} ({len(df)} rows)")


if __name__ == "__main__":
    main()
