"""The documentation site (mkdocs.yml, docs/, and ARCHITECTURE.md as a page through docs/_hooks/) builds with
``mkdocs build --strict``: every page is in the navigation, and every link between pages and every anchor resolves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # NO_MKDOCS_2_WARNING: the theme's banner about MkDocs 2.0, printed on every build, says nothing about the site
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))


def test_the_site_builds_strictly(tmp_path):
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-5000:]}"
    assert (tmp_path / "site" / "reference" / "query-file" / "index.html").exists()


def test_a_broken_link_an_unknown_anchor_or_a_page_left_out_fails_the_build(tmp_path):
    """The strictness the first test relies on: each kind of rot, on a copy of the site, fails its build."""
    rots = {
        "link": ("docs/index.md", "\n[gone](concepts/no-such-page.md)\n"),
        "anchor": ("docs/index.md", "\n[gone](privacy/index.md#no-such-heading)\n"),
        "page": ("docs/orphan.md", "# A page no navigation lists\n"),
        # ARCHITECTURE.md at the top is a page of the site too (docs/_hooks/architecture_page.py)
        "architecture link": ("ARCHITECTURE.md", "\n[gone](docs/privacy/no-such-page.md)\n"),
    }
    for rot, (page, text) in [("none", (None, None)), *rots.items()]:
        copy = tmp_path / rot.replace(" ", "-")
        shutil.copytree(ROOT / "docs", copy / "docs")
        for name in ("mkdocs.yml", "ARCHITECTURE.md"):
            shutil.copy(ROOT / name, copy / name)
        if page is not None:
            with (copy / page).open("a") as handle:
                handle.write(text)
        done = _build(copy / "mkdocs.yml", copy / "site")
        if page is None:  # the copy itself builds, so each failure below is its rot's
            assert done.returncode == 0, f"an untouched copy of the site failed to build:\n{done.stderr[-5000:]}"
        else:
            assert done.returncode != 0, f"a {rot} that rots did not fail the build"


def test_the_configuration_page_names_every_environment_setting():
    from stream_dp.config import settings_env_names

    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    missing = sorted(name for name in settings_env_names() if f"`{name}`" not in page)
    assert not missing, f"docs/reference/configuration.md does not name {missing}"
