"""Every relative link in the README and docs/ points at a file of the repository, and at a heading there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def links(text: str) -> list[str]:
    """The targets of a markdown page's links and images, outside code."""
    return LINK.findall(CODE.sub("", FENCE.sub("", text)))


def anchors(text: str) -> set[str]:
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces as hyphens, -N on repeats."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken(page: Path, root: Path = REPO) -> list[str]:
    """Why each relative link of the page does not resolve (empty when every one does)."""
    problems = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... are not files of ours
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if path.startswith("/") or not where.is_relative_to(root):
            problems.append(f"{target}: leaves the repository")
        elif not where.exists():
            problems.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where.read_text()):
            problems.append(f"{target}: no heading #{anchor} in {where.relative_to(root)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = broken(page)
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)


def test_a_broken_link_a_missing_heading_and_a_way_out_are_all_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Title\n\n[ok](other.md) [ok](#title) [ok](other.md#other) [gone](nowhere.md) [anchor](other.md#nope)\n"
        "[out](../../etc/passwd) [abs](/etc/passwd) [web](https://example.com) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n"
    )
    assert broken(page, tmp_path) == [
        "nowhere.md: no such file",
        "other.md#nope: no heading #nope in docs/other.md",
        "../../etc/passwd: leaves the repository",
        "/etc/passwd: leaves the repository",
    ]


def test_headings_get_githubs_ids() -> None:
    text = "# Fleet scale (simulated)\n## The R1-R42 matrix\n### `PlatformSettings`\n## Notes\n## Notes\n"
    assert anchors(text) == {
        "fleet-scale-simulated",
        "the-r1-r42-matrix",
        "platformsettings",
        "notes",
        "notes-1",
    }
