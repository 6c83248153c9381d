"""README is the front door; the long documentation lives in ``docs/*.md``.

README stays short (at most 250 lines) and opens with the two commands for a fresh machine; every relative link in
README.md and docs/*.md points at a file that exists (and, for ``file.md#anchor``, at a heading of that file); every
docs page is reachable from README.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Pages that other work is writing at the same time: linked from README before they land. Remove an entry once its
# file is in the repository (it is then checked like every other page).

FRESH_MACHINE = ["bash scripts/install.sh && python -m mmfragile reproduce", "bash scripts/test.sh"]

FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")


def code_blocks(text: str) -> list[str]:
    return [b.split("\n", 1)[1].rsplit("```", 1)[0] for b in FENCE.findall(text)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *$", text, re.M)}


def broken_links(path: Path, repo: Path = REPO) -> list[str]:
    """``file:line: target (why)`` for each relative link of a Markdown file that resolves to nothing."""
    text = INLINE_CODE.sub("", FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text()))
    bad = []
    for i, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, data:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(repo)}:{i}: {target}"
            if not dest.exists():
                bad.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{where} (no heading with that anchor)")
    return bad


def markdown_pages() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]


def test_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "README.md is over 250 lines: move the section to docs/"
    first = code_blocks(readme)[0]
    assert readme.index("```") < readme.index("\n## "), "the fresh-machine commands come before the first section"
    assert [ln.split("#", 1)[0].strip() for ln in first.strip().splitlines()] == FRESH_MACHINE, first


def test_every_relative_link_resolves():
    bad = [b for page in markdown_pages() for b in broken_links(page)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_every_docs_page_is_linked_from_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall((REPO / "README.md").read_text())}
    orphans = [p.name for p in (REPO / "docs").glob("*.md") if p.resolve() not in linked]
    assert not orphans, f"docs pages README does not link: {orphans}"


@pytest.mark.parametrize("line, why", [
    ("see [the zoo](docs/zoo-missing.md)", "no such file"),
    ("![shot](figures/none.png)", "no such file"),
    ("see [speed](docs/page.md#no-such-heading)", "no heading with that anchor"),
])
def test_the_link_check_finds_what_it_must(tmp_path, line, why):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Which path `--mode auto` takes\n")
    page = tmp_path / "README.md"
    page.write_text(f"# t\n\n```bash\n[not](a-link.md)\n```\n`[nor](this.md)` {line}\n")
    assert [b.split(" (")[-1] for b in broken_links(page, tmp_path)] == [why + ")"]
    page.write_text("# t\n[ok](docs/page.md#which-path---mode-auto-takes) [web](https://example.org/x.md) [self](#t)\n"
                    "[elsewhere](docs/stores.md)\n")
    assert broken_links(page, tmp_path) == ["README.md:3: docs/stores.md (no such file)"]
