"""Sweeps through Hydra's submitit launcher, and one series split into shards (``source.shard=i/n``).

End to end, through the CLI in subprocesses, on a small Trainer folder built here: the unsplit grid; the same grid
as a real ``-m hydra/launcher=submitit_local`` multirun over ``source.shard=0/3,1/3,2/3``, merged by
``lmcbench-report``; a submitit_local sweep over the codecs, merged. Both merges give the unsplit run's records
(every column but the times) and its ratio tables. In-process: the partition, the shard option's errors, and
the merge's refusal of a missing, repeated or mixed shard. The end-to-end tests (about a minute on 2 cores, most
of it starting eight processes) and the one that trains the series are marked ``slow``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from lmcbench import cli
from lmcbench.errors import ConfigError, LmcbenchError
from lmcbench.report import load_records, render
from lmcbench.report import merge
from lmcbench.sources import get_source
from lmcbench.sources.shard import parse_shard, partition

from lmcbench_testlib import assert_one_line_error, cli_env, make_trainer_folder, run_cli

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the [cluster] extra (hydra-submitit-launcher)")

# the grid of the end-to-end runs: fp32 and its bf16 cast, a plain, a byte-grouped and a temporal pipeline
GRID = ["source=hf_trainer", "source.cast=[null,bf16]", "pipeline=[raw,bytegroup,delta]", "bench=quick",
        "bench.repeats=1", "report.figures=false"]
TIMING = ["compress_s", "decompress_s", "compress_cpu_s", "decompress_cpu_s", "compress_s_min", "compress_s_max",
          "decompress_s_min", "decompress_s_max", "transform_s", "untransform_s", "repeats", "run"]


def composed(overrides):
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def comparable_rows(df: pd.DataFrame, key) -> pd.DataFrame:
    """The rows without their times, sorted: what a split or a sweep must reproduce exactly."""
    df = df.drop(columns=[c for c in TIMING if c in df.columns])
    return df.sort_values(key).reset_index(drop=True)


RECORD_KEY = ["step", "tensor", "kind", "cast", "transform", "codec"]


def ratio_tables(report_md: str) -> dict:
    """``{section: {codec row: cells}}`` of each "Compression ratio" table of a report."""
    out, section, lines = {}, None, report_md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("Compression ratio") and section:
            rows = {}
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                rows[cells[0]] = cells[1:]
            out[section] = rows
    return out


def read_csvs(folder, name) -> pd.DataFrame:
    files = sorted(folder.rglob(name))
    assert files, f"no {name} under {folder}"
    return pd.concat([pd.read_csv(f, keep_default_na=False) for f in files], ignore_index=True)


# ------------------------------------------------------------------------------------------------------------
# end to end: the unsplit run, the sharded multirun and a codec sweep, all through the CLI
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    base = tmp_path_factory.mktemp("sweep")
    series = base / "series"
    make_trainer_folder(series, steps=(10, 20, 30))
    grid = GRID + [f"source.path={series}"]
    cache = base / "cache"
    out = {"base": base}
    p = run_cli(grid + ["codec=[zstd,lmc]", f"hydra.run.dir={base / 'whole'}"], base, cache, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out["whole"] = base / "whole"
    for name, sweep in (("shards", ["codec=[zstd,lmc]", "source.shard=0/3,1/3,2/3"]), ("codecs", ["codec=zstd,lmc"])):
        d = base / name
        p = run_cli(["-m", "hydra/launcher=submitit_local"] + grid + sweep + [f"hydra.sweep.dir={d}"], base, cache,
                    timeout=400)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        assert merge.main([str(d), "--no-figures"]) == 0  # lmcbench-report DIR
        out[name] = d
    return out


@pytest.mark.slow
def test_each_job_writes_a_run_folder(sweeps):
    d = sweeps["shards"]
    for i in range(3):
        job = d / str(i)
        for f in ("records.csv", "streams.csv", "xor.csv", "config.yaml", "environment.json", "report.md",
                  ".hydra/overrides.yaml", ".hydra/config.yaml"):
            assert (job / f).is_file(), job / f
        env = json.loads((job / "environment.json").read_text())
        assert env["shard"]["index"] == i and env["shard"]["count"] == 3
        assert env["shard"]["series_tensors"] == 36  # 6 parameters x (weight, exp_avg, exp_avg_sq) x (fp32, bf16)
        assert f"source.shard={i}/3" in env["job_overrides"]
        assert env["command"].startswith("lmcbench -m hydra/launcher=submitit_local")
        assert f"shard {i}/3 of a split series" in (job / "report.md").read_text()
    logs = sorted((d / ".submitit").rglob("*_log.out"))
    assert len(logs) == 3
    assert all("records: " in f.read_text() for f in logs)
    assert not (sweeps["base"] / "outputs").exists()  # hydra.job.chdir=false: nothing lands outside the sweep dir


@pytest.mark.slow
def test_shards_are_disjoint_tensor_subsets(sweeps):
    owners = {}
    for i in range(3):
        df = load_records(sweeps["shards"] / str(i))
        tensors = set(zip(df["tensor"], df["kind"], df["cast"]))
        assert tensors
        for t in tensors:
            assert t not in owners, f"{t} in shards {owners[t]} and {i}"
            owners[t] = i
        # every step of every tensor it holds: the delta had its reference
        assert (df.groupby(["tensor", "kind", "cast"])["step"].nunique() == 3).all()
    assert len(owners) == 36


@pytest.mark.slow
@pytest.mark.parametrize("sweep", ["shards", "codecs"])
def test_merged_records_equal_the_unsplit_run(sweeps, sweep):
    whole = comparable_rows(load_records(sweeps["whole"]), RECORD_KEY)
    merged = comparable_rows(load_records(sweeps[sweep]), RECORD_KEY)
    assert len(merged) == len(whole) == 3 * 36 * 3 * 2
    assert merged["verified"].all()
    pd.testing.assert_frame_equal(merged, whole)
    for name, key in (("streams.csv", ["step", "tensor", "kind", "dtype", "transform", "stream"]),
                      ("xor.csv", ["step", "tensor", "kind", "dtype", "lag"])):
        a = read_csvs(sweeps["whole"], name)
        b = read_csvs(sweeps[sweep], name)
        if sweep == "codecs":  # each codec's job wrote the codec-independent files again
            b = b.drop_duplicates()
        pd.testing.assert_frame_equal(comparable_rows(b, key), comparable_rows(a, key))


@pytest.mark.slow
@pytest.mark.parametrize("sweep", ["shards", "codecs"])
def test_merged_report_equals_the_unsplit_report(sweeps, sweep):
    whole = ratio_tables((sweeps["whole"] / "report.md").read_text())
    md = (sweeps[sweep] / "report.md").read_text()
    assert set(whole) == {"weight (float32)", "exp_avg (float32)", "exp_avg_sq (float32)", "weight (bfloat16)",
                          "exp_avg (bfloat16)", "exp_avg_sq (bfloat16)"}
    assert ratio_tables(md) == whole
    assert set(whole["weight (float32)"]) >= {"zstd-3", "lmc"}
    assert ("- merged 3 runs:" if sweep == "shards" else "- merged 2 runs:") in md
    if sweep == "shards":
        assert "- merged from 3 shards (`source.shard=0/3` ... `2/3`) of one series: 36 tensors" in md
    else:
        assert "shard" not in md


@pytest.mark.slow
def test_merge_refuses_the_whole_beside_its_shards(sweeps, capsys):
    assert merge.main([str(sweeps["whole"]), str(sweeps["shards"]), "--no-figures",
                       "-o", str(sweeps["base"] / "both")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "both whole" in err


# ------------------------------------------------------------------------------------------------------------
# the partition and the option
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_partition_is_disjoint_complete_balanced_and_deterministic(seed):
    rng = random.Random(seed)
    sizes = {f"t{k}": rng.choice([0, 4, 64, 4096, rng.randrange(1, 1 << 20)]) for k in range(rng.randrange(1, 60))}
    for n in range(1, len(sizes) + 1):
        parts = partition(sizes, n)
        assert len(parts) == n
        flat = [k for p in parts for k in p]
        assert sorted(flat) == sorted(sizes) and len(flat) == len(set(flat))
        assert all(parts), "every shard gets a tensor when there are at least as many tensors as shards"
        load = [sum(sizes[k] for k in p) for p in parts]
        assert max(load) - min(load) <= max(sizes.values())
        # each part keeps the keys' order; the assignment depends on the keys and sizes, not their order
        order = list(sizes)
        assert all(p == [k for k in order if k in set(p)] for p in parts)
        shuffled = dict(rng.sample(list(sizes.items()), len(sizes)))
        assert [set(p) for p in partition(shuffled, n)] == [set(p) for p in parts]


def test_partition_balances_by_bytes():
    sizes = {"big": 100, "a": 40, "b": 30, "c": 30, "d": 1}
    assert [set(p) for p in partition(sizes, 2)] == [{"big", "d"}, {"a", "b", "c"}]


@pytest.mark.parametrize("spec,want", [("0/4", (0, 4)), ("1/4", (1, 4)), ("2/4", (2, 4)), ("3/4", (3, 4)),
                                       (" 0 / 1 ", (0, 1)), (None, None), ("null", None), ("", None)])
def test_shard_spec(spec, want):
    assert parse_shard(spec) == want


@pytest.mark.parametrize("spec", ["4/4", "1/0", "a/b", "-1/2", "1/2/3", "2", "0/-1", "1.0/2"])
def test_shard_spec_errors(spec):
    with pytest.raises(ConfigError) as ei:
        parse_shard(spec)
    assert_one_line_error(ei, "source.shard", repr(spec))


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("shard") / "out"
    make_trainer_folder(root, steps=(10, 20, 30))
    return root


def keys(entries):
    return [(e.step, e.name, e.kind, e.cast) for e in entries]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 36])
def test_source_shards_union_is_the_selection(series, n):
    opts = {"type": "hf_trainer", "path": str(series), "cast": [None, "bf16"]}
    whole = get_source(opts).entries()
    got = []
    for i in range(n):
        src = get_source({**opts, "shard": f"{i}/{n}"})
        part = src.entries()
        assert part
        tensors = [e.key for e in part]
        # tensor-major, every step of a tensor in this shard, in step order
        for k in set(tensors):
            idx = [j for j, t in enumerate(tensors) if t == k]
            assert idx == list(range(idx[0], idx[0] + 3))
            assert [part[j].step for j in idx] == [10, 20, 30]
        assert src.sharding["index"] == i and src.sharding["count"] == n
        assert src.sharding["tensors"] == len(set(tensors)) and src.sharding["series_tensors"] == 36
        assert src.sharding["bytes"] == sum(e.nbytes for e in part)
        got += keys(part)
    assert sorted(got, key=str) == sorted(keys(whole), key=str) and len(got) == len(set(got))


def test_source_shard_errors(series):
    with pytest.raises(ConfigError) as ei:
        get_source({"type": "hf_trainer", "path": str(series), "shard": "1/0"})
    assert_one_line_error(ei, "source.shard", "'1/0'")
    with pytest.raises(ConfigError) as ei:
        get_source({"type": "hf_trainer", "path": str(series), "shard": "0/19"}).entries()
    assert_one_line_error(ei, "source.shard=0/19", "18 tensor")


def test_whole_checkpoint_tasks_refuse_a_shard(tmp_path):
    for preset in ("excp", "checkpoint_store"):
        cfg = composed([f"experiment={preset}", "source.shard=0/2", f"results_dir={tmp_path}"])
        with pytest.raises(ConfigError) as ei:
            cli.run_task(cfg, str(tmp_path / preset))
        assert_one_line_error(ei, "source.shard", "whole checkpoints")


# ------------------------------------------------------------------------------------------------------------
# the merge's checks, on shard runs made in-process
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shard_runs(series, tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    grid = ["source=hf_trainer", f"source.path={series}", "codec=[zstd]", "pipeline=[raw,delta]", "bench=quick",
            "report=none"]
    for name, extra in (("0", ["source.shard=0/3"]), ("1", ["source.shard=1/3"]), ("2", ["source.shard=2/3"]),
                        ("half0", ["source.shard=0/2"]), ("whole", [])):
        cli.run_task(composed(grid + extra), str(base / name))
    return base


def merged(base, runs, tmp_path):
    return render([base / r for r in runs], str(tmp_path), figures=False)


def test_merge_of_every_shard(shard_runs, tmp_path):
    md = open(merged(shard_runs, ["0", "1", "2"], tmp_path)).read()
    assert "merged from 3 shards (`source.shard=0/3` ... `2/3`) of one series: 18 tensors" in md
    whole = open(render(shard_runs / "whole", str(tmp_path / "w"), figures=False)).read()
    assert ratio_tables(md) == ratio_tables(whole)


@pytest.mark.parametrize("runs,needles", [
    (["0", "2"], ["shard(s) 1/3 missing", "have 2 of 3"]),
    (["0", "1", "2", "half0"], ["different numbers of shards (2, 3)"]),
    (["0", "1", "2", "whole"], ["both whole (run whole)"]),
])
def test_merge_refuses_an_incomplete_split(shard_runs, tmp_path, runs, needles):
    with pytest.raises(LmcbenchError) as ei:
        merged(shard_runs, runs, tmp_path)
    assert_one_line_error(ei, *needles)


def test_merge_refuses_a_shard_twice(shard_runs, tmp_path):
    shutil.copytree(shard_runs / "1", tmp_path / "1-again")
    with pytest.raises(LmcbenchError) as ei:
        render([shard_runs / "0", shard_runs / "1", shard_runs / "2", tmp_path / "1-again"], str(tmp_path / "o"),
               figures=False)
    assert_one_line_error(ei, "shard 1/3", "in 2 runs", "merge each shard once")


def test_merge_refuses_a_series_that_changed(shard_runs, tmp_path):
    for r in ("0", "1", "2"):
        shutil.copytree(shard_runs / r, tmp_path / r)
    env = json.loads((tmp_path / "2" / "environment.json").read_text())
    env["shard"]["series_tensors"] += 1
    (tmp_path / "2" / "environment.json").write_text(json.dumps(env))
    with pytest.raises(LmcbenchError) as ei:
        merged(tmp_path, ["0", "1", "2"], tmp_path / "o")
    assert_one_line_error(ei, "disagree on the series", "changed between the jobs")


def test_sweep_point_errors_before_anything_is_launched(tmp_path, series):
    p = run_cli(["-m", "hydra/launcher=submitit_local", "source=hf_trainer", f"source.path={series}", "codec=[zstd]",
                 "pipeline=[raw]", "source.shard=0/2,2/2", f"hydra.sweep.dir={tmp_path / 'sw'}"], tmp_path,
                tmp_path / "cache", timeout=120)
    assert p.returncode == 2
    err = p.stderr.strip()
    assert "\n" not in err and "source.shard" in err and "'2/2'" in err and "source.shard=2/2" in err, err
    assert not (tmp_path / "sw").exists()


# ------------------------------------------------------------------------------------------------------------
# the jobs of a sweep over the embedded series start together: one trains it, the others wait for it
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_concurrent_jobs_train_the_series_once(tmp_path):
    from lmcbench.tinygpt.series import Series

    from lmcbench_testlib import TINY_TRAIN

    series = Series.from_options(cache_dir=str(tmp_path), train=TINY_TRAIN)
    code = ("import sys; from lmcbench.tinygpt.series import ensure_series; "
            f"ensure_series({series.path!r}, {series.train_opts!r}); print('done')")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=cli_env(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert [o[0].strip() for o in outs] == ["done"] * 3
    assert sum(o[1].count("training the tinygpt series") for o in outs) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        os.path.basename(series.path)]
    steps = sorted(p.name for p in (tmp_path / os.path.basename(series.path)).iterdir() if p.is_dir())
    assert steps == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]


def test_sweep_precheck_leaves_hydra_interpolations_to_the_job(series, capsys):
    """A value that names the job (``${hydra:job.num}``) resolves only in the job: the sweep is not refused for
    it (its points are checked by their jobs), while the same sweep without it has every point checked."""
    args = ["-m", "source=hf_trainer", f"source.path={series}", "codec=[zstd]", "pipeline=[raw]",
            "source.kinds=[weight],[exp_avg]"]
    cli._precheck(args + ["results_dir=/nonexistent/r-${hydra:job.num}"])
    with pytest.raises(SystemExit) as ei:
        cli._precheck(args + ["results_dir=/nonexistent/r", "source.shard=0/2,1/2,5/2"])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'5/2'" in err and "source.kinds=[weight]" in err and "source.shard=5/2" in err, err
