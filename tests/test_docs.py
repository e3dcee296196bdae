"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing anchor, an API name that
mkdocstrings cannot find or a page left out of the build fails here (and so in CI), not on the published site."""

from __future__ import annotations

import os
import subprocess
import sys

from lmcbench_testlib import REPO


def _env() -> dict:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONWARNINGS="ignore")
    # the checkout's packages first, as in an editable install (docs/hooks.py imports both)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "codecs" / "lmc"), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(site)], cwd=str(REPO), env=_env(), capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    warnings = [ln for ln in out.splitlines() if ln.startswith(("WARNING", "ERROR"))]
    assert p.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + "\n".join(warnings or [out[-4000:]])
    # the generated and included pages are there, and hold what they are generated from
    for page in ("index.html", "reference/config/index.html", "reference/cli/index.html",
                 "reference/api-lmc/index.html", "reference/archive-format/index.html",
                 "reference/dcp-layout/index.html", "reference/lmc-format/index.html", "results/index.html",
                 "changelog/lmc/index.html", "changelog/lmcbench/index.html", "results/default/report/index.html",
                 "results/default/ratio_vs_step.png"):
        assert (site / page).is_file(), page
    config = (site / "reference/config/index.html").read_text()
    for group in sorted(d.name for d in (REPO / "conf").iterdir() if d.is_dir() and not d.name.startswith("_")):
        for f in (REPO / "conf" / group).glob("*.yaml"):
            assert f"conf/{group}/{f.name}" in config, f"conf/{group}/{f.name} is not in the configuration reference"
    cli = (site / "reference/cli/index.html").read_text()
    for prog in ("lmcbench-report", "lmcbench-excp compress", "lmc-archive prune", "Configuration groups"):
        assert prog in cli, prog
    api = (site / "reference/api-lmc/index.html").read_text()
    assert "LMCStorageWriter" in api and "prefer" in api


def test_readme_links_resolve():
    """The READMEs are read on a forge, outside the site: their relative links must point to files that exist."""
    import re

    for readme in (REPO / "README.md", REPO / "codecs" / "lmc" / "README.md", REPO / "CHANGELOG.md",
                   REPO / "codecs" / "lmc" / "CHANGELOG.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", readme.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = (readme.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{readme.relative_to(REPO)}: the link {target} points to nothing"
