#!/usr/bin/env python
"""Build the Promptception prompt catalog (61 prompt types + baseline) from the seed text.

Reads ``$MMFRAGILE_SEEDS/promptception.txt`` (or ``--seed``) and writes
``src/mmfragile/resources/promptception_catalog.json`` (or ``--out``).

Sources in the seed:

* Appendix A, Table 5 - the complete list of 61 prompts (supercategory, category, type id and
  name, the prompt rendered around the MMMU-Pro example question "What design element best
  describes the visuals?" with options A. Composition / B. Perspective / C. Balance / D. Shape).
* Table 1 - the "Modification" column, i.e. what each of the 15 categories varies, and the
  capitalisation of the category names.
* Sec. 4.2.1 - the intent lists (Positive / Neutral / Negative prompts).
* Sec. 3 - "the prompts are appended after the question and answer choices, following the
  structure of the baseline prompt (Figure 3), except for Categories 2 and 3".

How the text becomes templates (every step is literal; the non-obvious ones are listed):

* The example question becomes ``<QUESTION>`` (``<QUESTION_UPPER>`` in 4.3, which upper-cases it;
  ``<QUESTION_JSON>`` - a JSON string literal - in 2.9). The four example options become one
  ``<OPTIONS>`` line; the option label style is recorded in ``option_format`` ("dot" ``A. x``,
  "paren" ``(A) x`` for 1.2, "option" ``Option A: x`` for 1.3, "inline" ``A. x B. y`` for 2.6,
  "json" for 2.9, whose options are JSON string items ``"A. x",``).
* The seed prints 2.1/2.2 as ``Question:What...`` (lost space) and 2.2 with ``Options:`` on the
  question's line. Table 1 prints 2.2 as ``Question: ...`` + newline + ``Options:``; we follow
  Table 1 (space after the colon, ``Options:`` on its own line).
* 5.1's example question reads "...the image? <image>" (a copy of Table 1's image example);
  the ``<image>`` token is an image placeholder, not prompt text: it becomes ``<QUESTION>``
  like every other prompt (images are passed to the model separately).
* Modality wording. The paper colour-codes image-specific (blue) and video-specific (orange)
  parts; the seed text has no colours but keeps ``image(s)/video`` where both are printed.
  ``image(s)/video`` and the remaining image-only mentions ``image(s)`` (5.2, 7.3, 9.2, the
  proprietary half of 10.2) become ``<VISUAL>`` ("image(s)" for image / multi-image
  benchmarks, "video" for video); 9.2's "based on images" becomes "based on <VISUALS>"
  ("images" / "the video"); 10.2's open-source half, printed with "the video and question",
  also becomes ``<VISUAL>``.
* Open-source / proprietary answer-format variants: the seed prints them as
  ``<green text>/<purple text>`` (Appendix A: green = open-source, purple = proprietary), e.g.
  "Respond only with: '$LETTER' of the best answer choice./Respond in the following format:
  'Answer: $LETTER' ...". The green half starts at "Respond only with" / "respond only with" /
  "Choose the $LETTER" and ends at the full stop before the slash; the purple half runs to the
  end of the line (a closing JSON quote in 2.9 is kept outside both).
* 7.6 adds three options (Not sure / Evidence not sufficient / I'll answer later) printed as
  E., F., G. after the four example options; they become ``<EXTRA_OPTIONS>`` and the texts go
  to ``extra_options`` - the renderer letters them after the question's last option.
* 11.4 and 11.5 are video-specific (Sec. 4.2.2: "We designed two video-specific prompts, 11.4
  and 11.5"; they are absent from the MMStar and MMMU-Pro tables 7-8): ``modalities = ["video"]``.
* The baseline prompt (Fig. 3, an image in the paper) is "<question>\\n<options>\\nAnswer with
  the option letter from the given choices directly." - identical to 1.1: Table 4 quotes this
  text as 1.1, and Table 2's "Base" accuracy equals the 1.1 row of Tables 6-8 for every model
  and benchmark. It is stored under id "baseline" with category 0 and no intent.
* Names: PDF hyphenation is undone ("Co- mplexity" -> "Complexity", "Observation- Driven" ->
  "Observation-Driven"); the paper's own spelling is kept otherwise ("Mispelled Word").
  Quotes and apostrophes are kept exactly as the seed prints them.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from mmfragile.paths import seed_missing, seed_path

REPO = Path(__file__).resolve().parents[1]
SEED_NAME = "promptception.txt"
DEFAULT_SEED = seed_path(SEED_NAME)  # None unless $MMFRAGILE_SEEDS holds it
DEFAULT_OUT = REPO / "src" / "mmfragile" / "resources" / "promptception_catalog.json"

EXAMPLE_Q = "What design element best describes the visuals?"
EXAMPLE_Q_51 = "What design element best describes the image? <image>"
EXAMPLE_OPTS = ["Composition", "Perspective", "Balance", "Shape"]
LETTERS4 = "ABCD"
OPTION_STYLES = {
    "dot": [f"{L}. {o}" for L, o in zip(LETTERS4, EXAMPLE_OPTS)],
    "paren": [f"({L}) {o}" for L, o in zip(LETTERS4, EXAMPLE_OPTS)],
    "option": [f"Option {L}: {o}" for L, o in zip(LETTERS4, EXAMPLE_OPTS)],
    "json": [f'"{L}. {o}",' for L, o in zip(LETTERS4[:3], EXAMPLE_OPTS[:3])] + ['"D. Shape"'],
}
INLINE_OPTS = " ".join(f"{L}. {o}" for L, o in zip(LETTERS4, EXAMPLE_OPTS))
EXTRA_OPTION_LETTERS = ("E", "F", "G")  # 7.6 as printed for 4-option questions

BASELINE_INSTRUCTION = "Answer with the option letter from the given choices directly."

VARIANT_RE = re.compile(
    r"^(?P<pre>.*?)(?P<open>(?:Respond only with|respond only with|Choose the \$LETTER).*?\.)"
    r"\s?/(?P<prop>[A-Za-z].*?)(?P<post>\"?)$"
)


class SeedError(RuntimeError):
    pass


def _section(text: str, start: str, end: str) -> list[str]:
    lines = text.splitlines()
    try:
        i = next(k for k, l in enumerate(lines) if l.startswith(start))
        j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(end))
    except StopIteration as e:
        raise SeedError(f"seed section {start!r} .. {end!r} not found") from e
    return lines[i + 1 : j]


def _clean_name(s: str) -> str:
    s = s.strip()
    s = re.sub(r"(\w)- ([a-z])", r"\1\2", s)  # "Co- mplexity" -> "Complexity"
    s = re.sub(r"(\w)- ([A-Z])", r"\1-\2", s)  # "Observation- Driven" -> "Observation-Driven"
    return s


def parse_table5(text: str) -> list[dict]:
    """Rows of Table 5: id, name, supercategory, category, raw prompt lines."""
    block = _section(text, "Super Category\tCategory\tType\tPrompt", "Appendix B ")
    rows: list[dict] = []
    sup = cat = None
    for line in block:
        if not line.strip():
            continue
        f = line.rstrip().split("\t")
        if len(f) != 4:
            raise SeedError(f"Table 5: unexpected line {line!r}")
        s, c, t, p = f
        if s.strip():
            sup = re.sub(r"^Super_Category\d+:\s*", "", s.strip())
        if c.strip():
            cat = re.sub(r"^Category \d+:\s*", "", c.strip())
        if t.strip():
            m = re.match(r"^(?:Type\s*)?(\d+\.\d+):\s*(.*)$", t.strip())
            if not m:
                raise SeedError(f"Table 5: cannot read type label {t!r}")
            rows.append({"prompt_id": m.group(1), "name": _clean_name(m.group(2)),
                         "supercategory_name": sup, "category_name_t5": cat, "lines": []})
        rows[-1]["lines"].append(p.strip())
    return rows


def parse_table1_descriptions(text: str, t5_names: dict[int, str]) -> dict[int, tuple[str, str]]:
    """Category number -> (name as Table 1 capitalises it, "Modification" text)."""
    block = " ".join(_section(text, "3 Prompts", "Table 1: Overview"))
    block = re.sub(r"\s+", " ", block)
    out = {}
    for n, t5 in t5_names.items():
        m = re.search(rf"(?<![\d.]){n}: (.*?) (?:Type|Task) {n}\.\d", block)
        if not m:
            raise SeedError(f"Table 1: category {n} not found")
        seg = m.group(1)
        if not seg.lower().startswith(t5.lower()):
            raise SeedError(f"Table 1: category {n} reads {seg!r}, expected the name {t5!r} first")
        out[n] = (seg[: len(t5)], seg[len(t5):].strip())
    return out


def parse_intents(text: str, ids: list[str]) -> dict[str, str]:
    """Sec. 4.2.1 lists -> {prompt_id: intent}."""
    def expand(spec: str) -> list[str]:
        got = []
        for part in [p.strip() for p in spec.split(",") if p.strip()]:
            if "-" in part:
                a, b = part.split("-")
                ca, ia = map(int, a.split("."))
                cb, ib = map(int, b.split("."))
                if ca != cb:
                    raise SeedError(f"intent range across categories: {part}")
                got += [f"{ca}.{i}" for i in range(ia, ib + 1)]
            else:
                got.append(part)
        return got

    out: dict[str, str] = {}
    for intent in ("Positive", "Neutral", "Negative"):
        m = re.search(rf"^{intent} Prompts: (.+)$", text, flags=re.M)
        if not m:
            raise SeedError(f"Sec. 4.2.1: '{intent} Prompts:' list not found")
        for pid in expand(m.group(1)):
            if pid not in ids:
                raise SeedError(f"Sec. 4.2.1 lists unknown prompt {pid}")
            if pid in out:
                raise SeedError(f"Sec. 4.2.1 lists {pid} twice")
            out[pid] = intent.lower()
    missing = [i for i in ids if i not in out]
    if missing:
        raise SeedError(f"Sec. 4.2.1 gives no intent for {missing}")
    return out


def to_template(pid: str, raw: list[str]) -> dict:
    """Turn Table 5's example rendering into open/proprietary templates with markers."""
    lines: list[str] = []
    for l in raw:
        l = l.replace(f'"{EXAMPLE_Q}"', "<QUESTION_JSON>")
        l = l.replace(EXAMPLE_Q_51, "<QUESTION>").replace(EXAMPLE_Q, "<QUESTION>")
        l = l.replace(EXAMPLE_Q.upper(), "<QUESTION_UPPER>")
        l = l.replace("Question:<QUESTION>", "Question: <QUESTION>")
        if l == "Question: <QUESTION> Options:":  # 2.2, laid out as in Table 1
            lines += ["Question: <QUESTION>", "Options:"]
            continue
        lines.append(l)

    # options block
    fmt = None
    for style, block in OPTION_STYLES.items():
        for i in range(len(lines) - 3):
            if lines[i : i + 4] == block:
                if fmt is not None:
                    raise SeedError(f"{pid}: two option blocks")
                fmt = style
                lines[i : i + 4] = ["<OPTIONS_JSON>" if style == "json" else "<OPTIONS>"]
                break
    if fmt is None:
        hits = [k for k, l in enumerate(lines) if INLINE_OPTS in l]
        if len(hits) != 1:
            raise SeedError(f"{pid}: no option block found")
        lines[hits[0]] = lines[hits[0]].replace(INLINE_OPTS, "<OPTIONS_INLINE>")
        fmt = "inline"

    # modality wording
    has_modality = False
    for k, l in enumerate(lines):
        new = l.replace("image(s)/video", "<VISUAL>").replace("image(s)", "<VISUAL>")
        new = new.replace("based on images", "based on <VISUALS>")
        has_modality |= new != l
        lines[k] = new

    # 7.6's added options
    extra: list[str] = []
    idx = [k for k, l in enumerate(lines)
           if re.match(rf"^[{''.join(EXTRA_OPTION_LETTERS)}]\. ", l)]
    if idx:
        if [lines[k][0] for k in idx] != list(EXTRA_OPTION_LETTERS) or idx != list(range(idx[0], idx[0] + 3)):
            raise SeedError(f"{pid}: unexpected extra options {[lines[k] for k in idx]}")
        extra = [lines[k][3:] for k in idx]
        lines[idx[0] : idx[-1] + 1] = ["<EXTRA_OPTIONS>"]

    # open-source / proprietary variants
    open_lines, prop_lines = [], []
    has_variant = False
    for l in lines:
        m = VARIANT_RE.match(l)
        if m:
            has_variant = True
            o = m.group("open")
            if pid == "10.2":  # open half printed with the video wording
                o = o.replace("the video and question", "the <VISUAL> and question")
                has_modality = True
            open_lines.append(m.group("pre") + o + m.group("post"))
            prop_lines.append(m.group("pre") + m.group("prop").rstrip() + m.group("post"))
        else:
            open_lines.append(l)
            prop_lines.append(l)
    for ls in (open_lines, prop_lines):
        if sum("<QUESTION" in l for l in ls) != 1:
            raise SeedError(f"{pid}: question marker count != 1: {ls}")
    return {"template_open": "\n".join(open_lines), "template_proprietary": "\n".join(prop_lines),
            "option_format": fmt, "extra_options": extra,
            "has_model_variant": has_variant, "has_modality_variant": has_modality}


def placement_of(pid: str, template: str) -> str:
    """Sec. 3: appended after question + choices, except categories 2 (structured: the prompt
    wraps the question and options) and 3 (3.1 prompt first, 3.2 prompt between question and
    options). Checked against the template layout."""
    ls = template.split("\n")
    cat = int(pid.split(".")[0])
    if cat == 2:
        if ls[:2] == ["<QUESTION>", "<OPTIONS>"]:
            raise SeedError(f"{pid}: category 2 prompt laid out like the baseline")
        return "structured"
    if pid == "3.1":
        if not (len(ls) == 3 and ls[1:] == ["<QUESTION>", "<OPTIONS>"]):
            raise SeedError(f"3.1: expected instruction, question, options; got {ls}")
        return "before"
    if pid == "3.2":
        if not (len(ls) == 3 and ls[0] == "<QUESTION>" and ls[2] == "<OPTIONS>"):
            raise SeedError(f"3.2: expected question, instruction, options; got {ls}")
        return "middle"
    if not (ls[0].startswith("<QUESTION") and ls[1] == "<OPTIONS>" and len(ls) > 2):
        raise SeedError(f"{pid}: expected question, options, then the prompt; got {ls[:3]}")
    return "after"


def build(seed: Path) -> dict:
    text = seed.read_text(encoding="utf-8")
    rows = parse_table5(text)
    ids = [r["prompt_id"] for r in rows]
    if len(ids) != 61 or len(set(ids)) != 61:
        raise SeedError(f"Table 5: expected 61 distinct prompt types, got {len(ids)}")
    cat_t5 = {}
    for r in rows:
        cat_t5.setdefault(int(r["prompt_id"].split(".")[0]), r["category_name_t5"])
    t1 = parse_table1_descriptions(text, cat_t5)
    intents = parse_intents(text, ids)
    sup_names: list[str] = []
    for r in rows:
        if r["supercategory_name"] not in sup_names:
            sup_names.append(r["supercategory_name"])

    prompts = []
    for r in rows:
        pid = r["prompt_id"]
        cat = int(pid.split(".")[0])
        t = to_template(pid, r["lines"])
        prompts.append({
            "prompt_id": pid,
            "name": r["name"],
            "category": cat,
            "category_name": t1[cat][0],
            "category_description": t1[cat][1],
            "supercategory": sup_names.index(r["supercategory_name"]) + 1,
            "supercategory_name": r["supercategory_name"],
            "intent": intents[pid],
            "placement": placement_of(pid, t["template_open"]),
            "modalities": ["video"] if pid in ("11.4", "11.5") else ["image", "multi-image", "video"],
            **t,
        })

    one_one = next(p for p in prompts if p["prompt_id"] == "1.1")
    base_tpl = f"<QUESTION>\n<OPTIONS>\n{BASELINE_INSTRUCTION}"
    if one_one["template_open"] != base_tpl or one_one["template_proprietary"] != base_tpl:
        raise SeedError("1.1 is not the baseline layout; Fig. 3 reading needs revisiting")
    baseline = {
        "prompt_id": "baseline", "name": "Baseline Prompt", "category": 0, "category_name": "Baseline",
        "category_description": "The simplest prompt for the MCQA task (Fig. 3).",
        "supercategory": 0, "supercategory_name": "Baseline", "intent": None, "placement": "after",
        "modalities": ["image", "multi-image", "video"], "template_open": base_tpl,
        "template_proprietary": base_tpl, "option_format": "dot", "extra_options": [],
        "has_model_variant": False, "has_modality_variant": False,
    }
    return {
        "source": "Promptception (seed promptception.txt): Appendix A Table 5, Table 1, Sec. 3, Sec. 4.2.1",
        "generated_by": "scripts/extract_promptception_catalog.py",
        "markers": {
            "<QUESTION>": "question text", "<QUESTION_UPPER>": "question text upper-cased (4.3)",
            "<QUESTION_JSON>": "question as a JSON string literal (2.9)",
            "<OPTIONS>": "one option per line, label style from option_format",
            "<OPTIONS_INLINE>": "options on one line separated by spaces (2.6)",
            "<OPTIONS_JSON>": "options as JSON string items, one per line (2.9)",
            "<EXTRA_OPTIONS>": "extra_options lettered after the question's last option (7.6)",
            "<VISUAL>": "'image(s)' for image / multi-image, 'video' for video",
            "<VISUALS>": "'images' for image / multi-image, 'the video' for video (9.2)",
        },
        "prompts": [baseline] + prompts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=Path, default=DEFAULT_SEED)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    if a.seed is None:
        ap.error(seed_missing(SEED_NAME) + " (or pass --seed PATH)")
    cat = build(a.seed)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(cat, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    n = len(cat["prompts"]) - 1
    print(f"wrote {a.out} ({n} prompt types + baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
