"""A non-editable install: a wheel built from this checkout, installed into a folder of its own (``pip install
--target``), runs ``lmcbench``, ``lmcbench experiment=<name>`` and ``lmcbench-report`` from a working directory
outside the repository, with lmcbench, its configuration and its renderers imported from the installed copy
(never from the checkout, which the editable install's finder would otherwise serve)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from lmcbench_testlib import REPO, cli_env, tiny_overrides

IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel (built from a copy of the package's files, so that nothing is written into the checkout) and
    the folder it is installed in."""
    pytest.importorskip("pip", reason="builds and installs the wheel with pip")
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    for d in ("lmcbench", "conf", "experiments"):
        shutil.copytree(REPO / d, src / d, ignore=IGNORE)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(base / "dist"), str(src)],
                   check=True, capture_output=True, text=True, timeout=180)
    wheel = next((base / "dist").glob("lmcbench-*.whl"))
    target = base / "site"
    subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], check=True,
                   capture_output=True, text=True, timeout=180)
    work = base / "work"  # the working directory: outside the repository
    work.mkdir()
    env = cli_env(base / "cache")
    env["PYTHONPATH"] = str(target)  # ahead of site-packages, where the editable install's finder lives
    return {"wheel": wheel, "target": target, "work": work, "env": env}


def run(installed, *args, timeout=300):
    p = subprocess.run([*args], cwd=installed["work"], env=installed["env"], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_the_wheel_holds_every_package_config_and_renderer(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    want = {f"lmcbench/{p.relative_to(REPO / 'lmcbench').as_posix()}" for p in (REPO / "lmcbench").rglob("*.py")
            if "__pycache__" not in p.parts}
    want |= {f"lmcbench/conf/{p.relative_to(REPO / 'conf').as_posix()}" for p in (REPO / "conf").rglob("*.yaml")}
    want |= {f"lmcbench/experiments/{p.name}" for p in (REPO / "experiments").glob("*.py")}
    assert want - names == set(), "a package missing from [tool.setuptools] packages in pyproject.toml?"
    assert "lmcbench/conf/config.yaml" in names and "lmcbench/experiments/delta_gap.py" in names
    assert "lmcbench/tinygpt/corpus-v1.txt.xz" in names  # the pinned corpus (package data)


def test_installed_copy_is_the_one_imported(installed):
    code = ("import lmcbench, lmcbench.cli, lmcbench.paths as p, lmcbench.experiments.delta_gap as d, importlib; "
            "c = importlib.import_module('lmcbench.tinygpt.corpus'); c.corpus(1); "
            "print(lmcbench.__file__); print(p.CONF_DIR); print(d.__file__); print(c.FILE); print(p.SOURCE_TREE)")
    out = run(installed, sys.executable, "-c", code).stdout.split()
    target = str(installed["target"])
    assert all(o.startswith(target) for o in out[:4]), out  # the corpus read (and its hash checked) from there
    assert out[4] == "None"  # no checkout: results go to ./results


@pytest.mark.slow
def test_installed_lmcbench_runs_an_experiment_and_merges_reports(installed):
    bin_dir, work = installed["target"] / "bin", installed["work"]
    where = run(installed, str(bin_dir / "lmcbench"), "--info", "searchpath").stdout
    assert str(installed["target"] / "lmcbench" / "conf") in where and str(REPO) not in where
    tiny = tiny_overrides() + ["source.steps=[10,20,30]", "bench=quick"]
    run(installed, str(bin_dir / "lmcbench"), *tiny, "codec=[zstd]", "pipeline=[raw,bytegroup]",
        "hydra.run.dir=run")
    assert (work / "run" / "records.csv").exists() and (work / "run" / "report.md").exists()
    p = run(installed, str(bin_dir / "lmcbench"), *tiny, "experiment=delta_gap", "bench.xor_lags=[1]",
            "hydra.run.dir=delta_gap_run")
    report = work / "results" / "delta_gap" / "report.md"  # results_dir: null, outside a checkout: ./results
    assert report.exists() and str(report) in p.stdout
    assert not (installed["target"] / "results").exists()
    p = run(installed, str(bin_dir / "lmcbench-report"), "run", "delta_gap_run", "-o", "merged", "--no-figures")
    assert (work / "merged" / "report.md").exists() and "merged" in p.stdout
