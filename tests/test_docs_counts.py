"""Every number in README.md, CONTRIBUTING.md and docs/*.md that counts a registry - prompt formats, Promptception
prompts and categories, judge perturbations, model families, studies, backends, the zoo's judges - equals the size
of that registry. Each claim is a pattern of its sentence (the number as digits or as a word); the sentence must
still be there, and every number it matches must equal the registry's count."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen".split())}
N = r"(\d+|" + "|".join(WORDS) + r")"   # a count, as digits or as a word


def formats() -> int:
    from mmfragile.studies.format_bias.prompts import all_formats

    return len(all_formats())


def prompts() -> int:
    from mmfragile.studies.promptception.prompts import prompt_ids

    return len(prompt_ids(include_baseline=False))


def _catalog():
    from mmfragile.studies.promptception.prompts import load_catalog

    return load_catalog(include_baseline=False)


def categories() -> int:
    return _catalog()["category"].nunique()


def supercategories() -> int:
    return _catalog()["supercategory"].nunique()


def follower(group: str) -> int:
    from mmfragile.models.zoo import FOLLOWER_CATEGORIES

    return len(FOLLOWER_CATEGORIES[group])


def follower_prompts(group: str) -> int:
    """Prompts of the follower's trained / held-out categories, the base prompt 1.1 left out (group_intervals)."""
    from mmfragile.models.zoo import FOLLOWER_CATEGORIES
    from mmfragile.studies.promptception.metrics import BASELINE_PROMPT

    cat = _catalog()
    return int((cat["category"].isin(FOLLOWER_CATEGORIES[group]) & (cat["prompt_id"] != BASELINE_PROMPT)).sum())


def perturbations(dimension: str | None = None) -> int:
    from mmfragile.studies.judgebias.perturbations import PERTURBATION_INFO, PERTURBATIONS

    return sum(1 for p in PERTURBATIONS if dimension in (None, PERTURBATION_INFO[p]["dimension"]))


def perturbations_but(*names: str) -> int:
    """The perturbations left when ``names`` (each one of the registry's) are left out."""
    from mmfragile.studies.judgebias.perturbations import PERTURBATIONS

    assert set(names) <= set(PERTURBATIONS), names
    return perturbations() - len(names)


def families() -> int:
    from mmfragile.models.tiny import FAMILIES

    return len(FAMILIES)


def engine_exact_families() -> int:
    from mmfragile.models.adapters import ADAPTERS
    from mmfragile.models.tiny import FAMILIES

    return sum(1 for f in FAMILIES if ADAPTERS[f].engine_refusal is None)


def real_processor_families() -> int:
    from mmfragile.models.tiny import REAL_PROCESSOR_FAMILIES

    return len(REAL_PROCESSOR_FAMILIES)


def studies() -> int:
    from mmfragile.study import BUILTIN

    return len(BUILTIN)


def backends() -> int:
    from mmfragile.models.spec import BACKENDS

    return len(BACKENDS)


def zoo(role: str) -> int:
    from mmfragile.models.zoo import ZOO_SPECS

    return sum(1 for s in ZOO_SPECS if s.role == role)


#: (page, sentence pattern with one group per count, the registry count of each group)
CLAIMS = [
    ("README.md", rf"\({N} formats\), circular evaluation", [formats]),
    ("README.md", rf"{N} instruction prompts in {N} categories / {N} supercategories",
     [prompts, categories, supercategories]),
    ("README.md", rf"\| {N} perturbations of query / image / response", [perturbations]),
    ("README.md", rf"trained on {N} of Promptception's {N} prompt categories",
     [lambda: follower("trained"), categories]),
    ("README.md", rf"on \d+ of the {N} formats", [formats]),
    ("README.md", rf"across {N} families, exact on {N} of {N} families",
     [real_processor_families, engine_exact_families, families]),
    ("docs/tests.md", rf"the conformance suite: {N} families x every check", [families]),
    ("docs/default-profile.md", rf"a prompt follower, {N} judges", [lambda: zoo("judge")]),
    ("docs/default-profile.md", rf"each benchmark of the {N} studies", [studies]),
    ("docs/judge-data.md", rf"image items take the {N}\s+image perturbations and text-only items take Unnecessary-Image",
     [lambda: perturbations_but("unnecessary_image")]),
    ("docs/judge-data.md", rf"runs {N} perturbations: `detail_description` and\s+`unnecessary_image` are left out",
     [lambda: perturbations_but("detail_description", "unnecessary_image")]),
    ("docs/findings.md", rf"all {N} formats \+ the standard one", [formats]),
    ("docs/findings.md", rf"on \d+ of the {N} formats", [formats]),
    ("docs/findings.md", rf"trimmed mean \(10 %, {N} prompts\)", [prompts]),
    ("docs/findings.md", rf"trained categories \({N} prompts\)", [lambda: follower_prompts("trained")]),
    ("docs/findings.md", rf"held-out categories \({N} prompts\)", [lambda: follower_prompts("held_out")]),
    ("docs/findings.md", rf"{N} perturbations, 2 seeded sampled runs", [perturbations]),
    ("docs/findings.md", rf"the {N} robustness perturbations", [lambda: perturbations("robustness")]),
    ("docs/usage.md", rf"\({N} formats \+ standard\) x circular shifts", [formats]),
    ("docs/usage.md", rf"questions x {N} prompts", [prompts]),
    ("docs/usage.md", rf"{N} judges x {N} perturbations", [lambda: zoo("judge"), perturbations]),
    ("docs/budget.md", rf"{N} formats x every circular shift per question, Promptception {N} prompts",
     [formats, prompts]),
    ("docs/harnesses.md", rf"\({N} formats \+ `standard`\)", [formats]),
    ("docs/speed.md", rf"\({N} formats \+ standard x \d+ (?:circular )?shifts", [formats]),
    ("docs/speed.md", rf"gives {N} families' tiny checkpoints their image processor", [real_processor_families]),
    ("docs/speed.md", rf"evaluations per format\) x {N} formats", [formats]),
    ("docs/vllm.md", rf"\({N} formats \+ standard\)", [formats]),
    ("docs/zoo.md", rf"Promptception prompts of \*\*{N} categories\*\*", [lambda: follower("trained")]),
    ("docs/zoo.md", rf"in the {N} held-out categories", [lambda: follower("held_out")]),
]


def count(text: str) -> int:
    return int(text) if text.isdigit() else WORDS[text.lower()]


def matches(page: str, pattern: str) -> list[re.Match]:
    return list(re.finditer(pattern, (REPO / page).read_text(), re.I))


@pytest.mark.parametrize("page, pattern, registry", CLAIMS, ids=[f"{p}: {s[:40]}" for p, s, _ in CLAIMS])
def test_a_count_in_the_docs_equals_its_registry(page, pattern, registry):
    found = matches(page, pattern)
    assert found, f"{page}: no sentence matches {pattern!r} any more: update the claim here with the page"
    expected = [r() for r in registry]
    for m in found:
        line = (REPO / page).read_text()[:m.start()].count("\n") + 1
        assert [count(g) for g in m.groups()] == expected, f"{page}:{line}: {m.group(0)!r} - the registries say {expected}"


def test_docs_name_as_many_backends_as_the_registry_has():
    """docs/usage.md names the backends rather than counting them: one name per entry of BACKENDS."""
    m = re.search(r"one adapter per family, the (.+?) backends", (REPO / "docs/usage.md").read_text(), re.S)
    assert m, "docs/usage.md: the sentence naming the backends is gone"
    assert len(m.group(1).split(" / ")) == backends(), m.group(0)


def test_the_fourth_study_is_as_short_as_contributing_says():
    m = re.search(r"`tests/option_order_study.py` is a whole\s+study in under (\d+) lines", (REPO / "CONTRIBUTING.md").read_text())
    assert m, "CONTRIBUTING.md: the sentence on tests/option_order_study.py is gone"
    assert len((REPO / "tests/option_order_study.py").read_text().splitlines()) < int(m.group(1))


def test_a_count_reads_words_and_digits():
    m = re.search(rf"{N} of {N} families", "exact on twelve of 13 families")
    assert [count(g) for g in m.groups()] == [12, 13]
