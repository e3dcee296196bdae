"""source=deepspeed over DeepSpeed ZeRO checkpoint series, two ways.

- Built by the tests with torch.save in DeepSpeed's layout (``deepspeed_layout.py``): a 2-rank ZeRO-2 series of
  three steps, a model with two param groups, bf16 module weights, fp32 master partitions and Adam moments, end
  padding in one group and parameters split across ranks. These run everywhere.
- Written by DeepSpeed itself on the CPU (``deepspeed_train.py``: two gloo processes, ZeRO-2 and ZeRO-3, bf16; and a
  GPT-NeoX-style pipeline module with an ``args`` Namespace in its client state), checked against DeepSpeed's own
  per-parameter API. Skipped when DeepSpeed is not installed (it is in the ``test`` extra).

Every tensor comes back bit-exact under the parameter's name with its kind; the runner gives verified rows for
every kind; sizes that do not add up give ``group<g>.offset<k>`` (ZeRO-3: ``group<g>.rank<r>``) names; bad files, a
missing rank and a
file needing a foreign class are one clear line, and the latter loads only with ``source.trust_pickle=true``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from lmcbench.errors import ConfigError, SourceError
from lmcbench.sources import get_source

from deepspeed_layout import GROUPS, OPTIM_FILE, STEPS, build, load_built, save_built, straddling
from lmcbench_testlib import BF16, Exploding, assert_one_line_error, same_bits, to_np

KINDS4 = {"weight", "master_weight", "exp_avg", "exp_avg_sq"}
HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def src(path, **kw):
    return get_source({"type": "deepspeed", "path": str(path), **kw})


def one_line(fn, *needles) -> str:
    """``fn()`` raises a one-line SourceError holding each of ``needles``."""
    with pytest.raises(SourceError) as ei:
        fn()
    return assert_one_line_error(ei, *needles)


def loaded(s) -> dict:
    return {(e.step, e.name, e.kind): s.load(e).array for e in s.entries()}


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds") / "run"
    return root, build(root)


# ------------------------------------------------------------------------------------------ test-built series
def test_every_tensor_named_and_bit_exact(series):
    root, truth = series
    assert straddling() and set(GROUPS[0]) & set(straddling())  # parameters split across the two ranks' files
    s = src(root)
    es = s.entries()
    assert sorted({e.step for e in es}) == list(STEPS)
    for step in STEPS:
        assert {(e.name, e.kind) for e in es if e.step == step} == set(truth[step])
    assert {e.kind for e in es} == KINDS4
    names = set(dict(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                                         torch.nn.Linear(16, 3)).state_dict()))
    for kind in KINDS4:
        assert {e.name for e in es if e.kind == kind} == names
    for e in es:
        want = truth[e.step][(e.name, e.kind)]
        assert same_bits(s.load(e).array, want), (e.step, e.name, e.kind)
        assert e.dtype == (BF16 if e.kind == "weight" else np.float32)
    for i in range(0, len(es), len(STEPS)):  # tensor-major
        assert len({e.key for e in es[i:i + len(STEPS)]}) == 1 and [e.step for e in es[i:i + len(STEPS)]] == list(STEPS)
    # the bf16 weights are the master weights cast, as DeepSpeed copies them back
    w, mw = s.load(es[0]).array, truth[es[0].step][(es[0].name, "master_weight")]
    assert same_bits(w, mw.astype(BF16))


def test_bench_run_gives_verified_rows_for_every_kind(series, tmp_path):
    from lmcbench.bench.runner import BenchOptions, run
    from lmcbench.codecs import get_codec
    from lmcbench.report import render
    from lmcbench.transforms import Pipeline

    root, _ = series
    pipes = {"raw": Pipeline("raw", []), "delta": Pipeline.from_config("delta", [{"id": "delta"}])}
    codecs = {"zstd": get_codec({"id": "zstd"}), "lmc": get_codec({"id": "lmc"})}
    opts = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False)
    run(src(root), pipes, codecs, opts, str(tmp_path / "r"), log=lambda m: None)
    with open(tmp_path / "r" / "records.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["verified"] == "True" for r in rows), [r["error"] for r in rows if r["error"]][:3]
    assert {r["kind"] for r in rows} == KINDS4
    assert {r["step"] for r in rows} == {str(s) for s in STEPS}
    assert {(r["tensor"], r["kind"]) for r in rows} >= {("0.weight", k) for k in KINDS4}
    assert any(r["transform"] == "delta" and r["ref_step"] == "10" and r["kind"] == "master_weight" for r in rows)
    report = Path(render([str(tmp_path / "r")], str(tmp_path / "rep")))
    assert "## master_weight (float32)" in report.read_text()


def test_selection_single_folder_glob_and_latest_ignored(series, tmp_path):
    root, truth = series
    assert (root / "latest").is_file()
    es = src(root, steps=[20], kinds=["master_weight"]).entries()
    assert {e.step for e in es} == {20} and {e.kind for e in es} == {"master_weight"} and len(es) == 6
    es = src(root / "global_step30").entries()
    assert {e.step for e in es} == {30} and len(es) == len(truth[30])
    es = src(root / "global_step*", include=r"^2\.").entries()
    assert {e.step for e in es} == set(STEPS) and {e.name for e in es} == {"2.weight", "2.bias"}
    with pytest.raises(ConfigError):
        src(root, trust_pickle="yes")


@pytest.mark.parametrize("shapes", ["wrong", "missing"])
def test_sizes_that_do_not_add_up_get_group_offset_names(tmp_path, shapes):
    truth = build(tmp_path / "run", steps=(10,), shapes=shapes)[10]
    s = src(tmp_path / "run")
    got = loaded(s)
    d = tmp_path / "run" / "global_step10"
    flat = {}
    for r in range(2):
        osd = load_built(d / OPTIM_FILE.format(r=r))["optimizer_state_dict"]
        flat[r] = osd
    # group 0 still adds up when only group 1's shapes are off; group 1 (and, without param_shapes, both) is
    # left as the ranks' slices under group/offset names, exactly as stored
    named_groups = {0} if shapes == "wrong" else set()
    for g in range(2):
        if g in named_groups:
            for n in GROUPS[g]:
                assert same_bits(got[(10, n, "master_weight")], truth[(n, "master_weight")])
            continue
        start = 0
        for r in range(2):
            part = flat[r]["single_partition_of_fp32_groups"][g]
            assert same_bits(got[(10, f"group{g}.offset{start}", "master_weight")], to_np(part))
            st = flat[r]["base_optimizer_state"]["state"][g]
            for k in ("exp_avg", "exp_avg_sq"):
                assert same_bits(got[(10, f"group{g}.offset{start}", k)], to_np(st[k]))
            start += part.numel()
        assert not any(n in GROUPS[g] for (_, n, k) in got if k != "weight")
    assert {n for (_, n, k) in got if k == "weight"} == {n for n, k in truth if k == "weight"}


def test_slice_mappings_that_disagree_are_not_trusted(tmp_path):
    build(tmp_path / "run", steps=(10,))
    p = tmp_path / "run" / "global_step10" / OPTIM_FILE.format(r=1)
    obj = load_built(p)
    fm = obj["optimizer_state_dict"]["param_slice_mappings"][0]
    fm[next(iter(fm))].start += 1
    save_built(obj, p)
    names = {n for (_, n, k) in loaded(src(tmp_path / "run")) if k == "master_weight"}
    assert names == {"group0.offset0", "group0.offset88", *GROUPS[1]}


def test_pipeline_layer_files(tmp_path):
    truth = build(tmp_path / "run", steps=(10, 20), pipeline=True)
    got = loaded(src(tmp_path / "run"))
    assert set(got) == {(s, n, k) for s, t in truth.items() for n, k in t}
    assert all(same_bits(a, truth[s][(n, k)]) for (s, n, k), a in got.items())


@pytest.mark.parametrize("shapes", ["ok", "flat"])
def test_legacy_zero1_sub_partitions(tmp_path, shapes):
    """DeepSpeed < 0.4 / DeeperSpeed (Pythia): sub-partitions laid out interval-major; one param_shapes dict over
    both groups does not say which parameter is in which group, so the slices keep group/offset names."""
    truth = build(tmp_path / "run", steps=(10, 20), legacy=True, shapes=shapes)
    got = loaded(src(tmp_path / "run"))
    weights = {(s, n, k) for s, t in truth.items() for n, k in t if k == "weight"}
    assert weights <= set(got) and all(same_bits(got[x], truth[x[0]][x[1:]]) for x in weights)
    assert {got[x].dtype for x in weights} == {np.dtype(np.float16)}
    if shapes == "ok":
        assert set(got) == {(s, n, k) for s, t in truth.items() for n, k in t}
        assert all(same_bits(a, truth[s][(n, k)]) for (s, n, k), a in got.items())
        return
    d = tmp_path / "run" / "global_step20"
    osd = [load_built(d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")["optimizer_state_dict"] for r in range(2)]
    for g in range(2):
        order = [(i, r) for i in range(2) for r in range(2)]
        start = 0
        for i, r in order:
            part = osd[r]["local_sub_partitions_of_fp32_groups"][g][i]
            assert same_bits(got[(20, f"group{g}.offset{start}", "master_weight")], to_np(part))
            assert same_bits(got[(20, f"group{g}.offset{start}", "exp_avg")],
                             to_np(osd[r]["base_optimizer_state"][g][i]["exp_avg"]))
            start += part.numel()


# ------------------------------------------------------------------------------------------------- errors
def test_bad_files_and_missing_ranks_are_one_line(tmp_path, series):
    root, _ = series
    one_line(lambda: get_source({"type": "deepspeed"}), "source.path")
    one_line(lambda: src(tmp_path / "nope").entries(), "no such folder")
    (tmp_path / "empty").mkdir()
    one_line(lambda: src(tmp_path / "empty").entries(), "no DeepSpeed checkpoint folders")
    run = tmp_path / "run"
    shutil.copytree(root, run)
    (run / "global_step40").mkdir()  # an interrupted save
    one_line(lambda: src(run).entries(), "global_step40", "not a complete DeepSpeed checkpoint")
    shutil.rmtree(run / "global_step40")
    # a missing rank file
    os.remove(run / "global_step20" / OPTIM_FILE.format(r=1))
    one_line(lambda: src(run).entries(), "global_step20", "missing [1]", "partition_count [2]")
    shutil.rmtree(run / "global_step20")
    # truncated files: the optimizer's, the model's
    p = run / "global_step10" / OPTIM_FILE.format(r=0)
    p.write_bytes(p.read_bytes()[:1000])
    one_line(lambda: src(run).entries(), OPTIM_FILE.format(r=0), "truncated or corrupt")
    shutil.rmtree(run / "global_step10")
    p = run / "global_step30" / "mp_rank_00_model_states.pt"
    p.write_bytes(b"garbage" * 10)
    one_line(lambda: src(run).entries(), "mp_rank_00_model_states.pt", "not a")
    # a file that is not an optimizer file
    shutil.copy(root / "global_step30" / "mp_rank_00_model_states.pt", p)
    torch.save({"x": torch.zeros(3)}, run / "global_step30" / OPTIM_FILE.format(r=1))
    one_line(lambda: src(run).entries(), OPTIM_FILE.format(r=1), "no optimizer_state_dict")


def _zero3_layout(d, world=2, shapes=({"a.weight": (5, 3), "b.weight": (4,)}, {"c.bias": (3,)}), pad=0):
    """A ZeRO-3 folder as DeepSpeed lays it out: each parameter cut into ceil(n / world) slices per rank."""
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    full = {n: {k: torch.randn(math.prod(s), generator=g) for k in ("master_weight", "exp_avg", "exp_avg_sq")}
            for grp in shapes for n, s in grp.items()}
    for r in range(world):
        flats, states = [], {}
        for gi, grp in enumerate(shapes):
            parts = {k: [] for k in ("master_weight", "exp_avg", "exp_avg_sq")}
            for n, s in grp.items():
                q = -(-math.prod(s) // world)
                for k in parts:
                    t = torch.nn.functional.pad(full[n][k], (0, q * world - math.prod(s)))
                    parts[k].append(t[r * q:(r + 1) * q])
            cat = {k: torch.cat(v + [torch.zeros(pad)]) for k, v in parts.items()}
            flats.append(cat["master_weight"])
            states[gi] = {"exp_avg": cat["exp_avg"], "exp_avg_sq": cat["exp_avg_sq"], "step": torch.tensor(3.0)}
        torch.save({"module": {n: torch.empty(0) for grp in shapes for n in grp} | {"buf": torch.ones(2)},
                    "buffer_names": ["buf"], "param_shapes": [{n: torch.Size(s) for n, s in grp.items()}
                                                              for grp in shapes]},
                   d / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {"zero_stage": 3, "partition_count": world, "fp32_flat_groups": flats,
                                             "optimizer_state_dict": {"state": states, "param_groups": []}}},
                   d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return {(n, k): t.reshape(s) for grp in shapes for n, s in grp.items() for k, t in full[n].items()}


@pytest.mark.parametrize("world,pad", [(2, 0), (3, 4)])
def test_zero3_layout_named_and_bit_exact(tmp_path, world, pad):
    want = _zero3_layout(tmp_path / "run" / "global_step5", world=world, pad=pad)
    got = loaded(src(tmp_path / "run"))
    assert set(got) == {(5, n, k) for n, k in want} | {(5, "buf", "other")}
    assert all(same_bits(got[(5, n, k)], to_np(t)) for (n, k), t in want.items())


def test_zero3_errors_and_sizes_that_do_not_add_up(tmp_path):
    _zero3_layout(tmp_path / "run" / "global_step5")
    (tmp_path / "run" / "global_step5" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    one_line(lambda: src(tmp_path / "run").entries(), "ZeRO-3 optimizer states", "missing")
    # param_shapes that claim more than the buffers hold: rank buffers under group/rank names, never a guess
    _zero3_layout(tmp_path / "r2" / "global_step5", shapes=({"a.weight": (5, 3)},))
    p = tmp_path / "r2" / "global_step5" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    obj = torch.load(p, weights_only=True)
    obj["param_shapes"] = [{"a.weight": torch.Size((50, 3))}]
    torch.save(obj, p)
    names = {e.name for e in src(tmp_path / "r2").entries()}
    assert names == {"group0.rank0", "group0.rank1", "buf"}


def test_foreign_classes_are_refused_unless_trusted(tmp_path):
    marker = tmp_path / "UNPICKLED"
    truth = build(tmp_path / "run", steps=(10, 20), client_state={"args": argparse.Namespace(hidden_size=16)})
    one_line(lambda: src(tmp_path / "run").entries(), "mp_rank_00_model_states.pt", "refused", "argparse.Namespace",
             "source.trust_pickle=true")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = loaded(src(tmp_path / "run", trust_pickle=True))
    warned = [str(w.message) for w in caught if "trust_pickle" in str(w.message)]
    assert len(warned) == 1 and "argparse.Namespace" in warned[0]  # once, for two steps' refused files
    assert set(got) == {(s, n, k) for s, t in truth.items() for n, k in t}
    assert all(same_bits(a, truth[s][(n, k)]) for (s, n, k), a in got.items())
    # a file whose unpickling would run code: refused, and nothing ran
    build(tmp_path / "evil", steps=(10,), client_state={"args": Exploding(marker)})
    one_line(lambda: src(tmp_path / "evil").entries(), "refused", "pathlib")
    assert not marker.exists()
    load_built(tmp_path / "evil" / "global_step10" / "mp_rank_00_model_states.pt")  # the pickle is real:
    assert marker.exists()  # unpickling it would have run code


# -------------------------------------------------------------------------------------- real DeepSpeed, CPU
def _write_real(tmp_path_factory, mode) -> Path:
    if not HAVE_DEEPSPEED:
        pytest.skip("deepspeed is not installed (pip install -e '.[test]' installs it)")
    out = tmp_path_factory.mktemp(f"real_{mode}") / "run"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "deepspeed_train.py"), str(out), mode],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _check_against_deepspeed(out: Path, **kw):
    truth = torch.load(out / "truth.pt", weights_only=True)
    want = {(s, n, k): to_np(t) for s, d in truth.items() for n, kk in d.items() for k, t in kk.items()}
    s = src(out, **kw)
    got = loaded(s)
    assert set(got) == set(want)
    bad = [k for k in want if not same_bits(got[k], want[k])]
    assert not bad, bad[:5]
    return s


@pytest.fixture(scope="module")
def real_zero2(tmp_path_factory):
    return _write_real(tmp_path_factory, "zero2")


def test_real_deepspeed_zero2_two_ranks(real_zero2, tmp_path):
    from lmcbench.bench.runner import BenchOptions, run
    from lmcbench.codecs import get_codec
    from lmcbench.transforms import Pipeline

    names = sorted(os.listdir(real_zero2 / "global_step3"))
    assert names == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"]
    s = _check_against_deepspeed(real_zero2)  # no trust needed: DeepSpeed's own classes are read as records
    assert {e.kind for e in s.entries()} == KINDS4
    run(s, {"raw": Pipeline("raw", [])}, {"zstd": get_codec({"id": "zstd"}), "lmc": get_codec({"id": "lmc"})},
        BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False), str(tmp_path / "r"), log=lambda m: None)
    with open(tmp_path / "r" / "records.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["verified"] == "True" for r in rows) and {r["kind"] for r in rows} == KINDS4


def test_real_deepspeed_zero3_two_ranks(tmp_path_factory):
    out = _write_real(tmp_path_factory, "zero3")
    names = sorted(os.listdir(out / "global_step3"))
    assert names == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                     "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"]
    s = _check_against_deepspeed(out)  # every parameter's master weight and moments, as DeepSpeed's API gives them
    assert {e.kind for e in s.entries()} == {"master_weight", "exp_avg", "exp_avg_sq"}


def test_real_deepspeed_pipeline_with_args_namespace(tmp_path_factory):
    out = _write_real(tmp_path_factory, "pipeline")
    assert any(n.startswith("layer_") for n in os.listdir(out / "global_step2"))
    one_line(lambda: src(out).entries(), "mp_rank_00_model_states.pt", "argparse.Namespace",
             "source.trust_pickle=true")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = _check_against_deepspeed(out, trust_pickle=True)
    assert {e.name for e in s.entries() if e.kind == "weight"} >= {"0.lin.weight", "2.norm.bias", "3.weight"}
