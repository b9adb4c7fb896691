"""README.md: short, the two commands CI and a newcomer run, and every relative link resolving.

Links into docs/ are checked here down to the heading they name (GitHub's and MkDocs' heading ids);
links between the pages of docs/ are checked by the strict site build (tests/docs/test_site.py).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _heading_ids(markdown: str) -> set[str]:
    """The ids of a page's headings: an explicit ``{#id}``, else lower case, punctuation dropped, spaces as
    dashes (the rule GitHub and MkDocs' toc extension share for these headings)."""
    ids = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        explicit = re.search(r"\{#([\w-]+)\}\s*$", title)
        if explicit:
            ids.add(explicit.group(1))
            continue
        ids.add(re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-"))
    return ids


def _broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _heading_ids(linked.read_text()):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_relative_link_of_the_readme_resolves():
    assert not _broken_links(README), "\n".join(_broken_links(README))


def test_the_link_check_sees_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A heading, with punctuation\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/page.md) [ok](docs/page.md#a-heading-with-punctuation) [web](https://example.org)\n"
                    "[gone](docs/gone.md) [gone](docs/page.md#another-heading)\n")
    assert [line.split(":")[0] for line in _broken_links(page)] == ["docs/gone.md", "docs/page.md#another-heading"]


def test_the_readme_fits_on_a_screen_or_a_few():
    assert len(README.read_text().splitlines()) <= 300


def test_the_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    text = README.read_text()
    assert "bash deploy/demo.sh" in text and "bash deploy/test.sh" in text
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd ", "export "))]
    assert ci[-1] in text, f".ci/run runs {ci[-1]!r}, which the README does not give"
