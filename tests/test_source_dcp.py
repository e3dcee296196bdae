"""source=dcp over real PyTorch Distributed Checkpoint folders written here with dcp.save: plain
FileSystemWriter, FileSystemWriter with the ZStandard stream extension, and LMC (lmc.dcp, each step against the
previous one). Every tensor comes back bit-exact with its kind, name and step; a bench run over each gives
verified rows; selection, globs, step regexes, and every error path are one clear line; the plain metadata
pickle is read without arbitrary unpickling."""

from __future__ import annotations

import csv
import os
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from lmcbench.errors import SourceError
from lmcbench.sources import get_source

from lmcbench_testlib import BF16, assert_one_line_error, to_np

STEPS = (10, 20, 30)
FORMATS = ("plain", "zstd", "lmc")


def src(path, **kw):
    return get_source({"type": "dcp", "path": str(path), **kw})


def writer(fmt, path, prev):
    if fmt == "plain":
        return dcp.FileSystemWriter(path)
    if fmt == "zstd":
        from torch.distributed.checkpoint._extension import ZStandard

        if not ZStandard.is_available():
            pytest.skip("DCP's ZStandard extension needs zstandard")
        return dcp.FileSystemWriter(path, _extensions=[ZStandard()])
    from lmc.dcp import LMCStorageWriter

    return LMCStorageWriter(path, reference=prev, threads=1)


def write_series(root: Path, fmt: str, marker: Path | None = None) -> dict:
    """``step-<N>/`` DCP folders of a small model + AdamW (get_state_dict), a bf16 tensor, an integer buffer and
    a Python object; returns ``step -> {(name, kind): array}``: what the source must yield."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(32, 8)
    truth, prev, step = {}, None, 0
    for s in STEPS:
        while step < s:
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
            step += 5
        msd, osd = get_state_dict(m, opt)
        sd = {"model": msd, "optim": osd,
              "extra": {"bf16": m[0].weight.detach().bfloat16(), "count": torch.arange(5) * s, "note": f"s{s}"}}
        path = root / f"step-{s}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(sd, storage_writer=writer(fmt, path, prev))
        prev = path
        t = {(k, "weight"): to_np(v).copy() for k, v in msd.items()}  # copies: training goes on in place
        for p, st in osd["state"].items():
            t[(p, "exp_avg")] = to_np(st["exp_avg"]).copy()
            t[(p, "exp_avg_sq")] = to_np(st["exp_avg_sq"]).copy()
        t[("extra.bf16", "weight")] = to_np(sd["extra"]["bf16"]).copy()
        t[("extra.count", "other")] = to_np(sd["extra"]["count"]).copy()
        truth[s] = t
    if fmt == "lmc":
        import lmc.dcp

        lmc.dcp.wait()  # (one process: the last reference is re-coded behind its save)
    return truth


@pytest.fixture(scope="module", params=FORMATS)
def series(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"dcp_{request.param}") / "run"
    return request.param, root, write_series(root, request.param)


def test_every_tensor_bit_exact_with_kinds_and_steps(series):
    fmt, root, truth = series
    s = src(root)
    es = s.entries()
    assert sorted({e.step for e in es}) == list(STEPS)
    for step in STEPS:
        assert {(e.name, e.kind) for e in es if e.step == step} == set(truth[step])
    assert {e.kind for e in es} == {"weight", "exp_avg", "exp_avg_sq", "other"}
    assert {e.name for e in es if e.kind == "exp_avg"} == {e.name for e in es if e.kind == "weight"} - {"extra.bf16"}
    for i in range(0, len(es), len(STEPS)):  # tensor-major: all steps of a tensor together, in step order
        assert len({e.key for e in es[i:i + len(STEPS)]}) == 1 and [e.step for e in es[i:i + len(STEPS)]] == list(STEPS)
    for e in es:
        rec = s.load(e)
        want = truth[e.step][(e.name, e.kind)]
        assert rec.array.dtype == want.dtype and rec.array.shape == want.shape
        assert rec.array.tobytes() == want.tobytes(), (fmt, e.step, e.name, e.kind)
        assert rec.step == e.step and rec.kind == e.kind
    bf = [e for e in es if e.name == "extra.bf16"]
    assert bf and all(e.dtype == BF16 for e in bf)
    a = [s.load(e).array for e in es if e.name == "0.weight" and e.kind == "exp_avg"]
    assert len(a) == 3 and not np.array_equal(a[0], a[2])


def test_bench_run_gives_verified_rows(series, tmp_path):
    from lmcbench.bench.runner import BenchOptions, run
    from lmcbench.codecs import get_codec
    from lmcbench.transforms import Pipeline

    fmt, root, _ = series
    pipes = {"raw": Pipeline("raw", []), "delta": Pipeline.from_config("delta", [{"id": "delta"}])}
    codecs = {"zstd": get_codec({"id": "zstd"}), "lmc": get_codec({"id": "lmc"})}
    opts = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False)
    run(src(root, steps=[10, 20], include=r"^(0\.weight|extra\.)"), pipes, codecs, opts, str(tmp_path / "r"),
        log=lambda m: None)
    with open(tmp_path / "r" / "records.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["verified"] == "True" for r in rows), [r["error"] for r in rows][:3]
    assert {r["kind"] for r in rows} == {"weight", "exp_avg", "exp_avg_sq", "other"}
    assert {r["step"] for r in rows} == {"10", "20"}
    assert any(r["transform"] == "delta" and r["ref_step"] == "10" for r in rows)


def test_selection_single_folder_glob_and_step_regex(series, tmp_path):
    fmt, root, truth = series
    es = src(root, steps=[20], kinds=["exp_avg_sq"]).entries()
    assert {e.step for e in es} == {20} and {e.kind for e in es} == {"exp_avg_sq"}
    assert len(es) == sum(1 for k in truth[20] if k[1] == "exp_avg_sq")
    es = src(root / "step-30").entries()
    assert {e.step for e in es} == {30} and len(es) == len(truth[30])
    es = src(root / "step-*", include=r"^2\.").entries()
    assert {e.step for e in es} == set(STEPS) and {e.name for e in es} == {"2.weight", "2.bias"}
    if fmt != "lmc":  # LMC steps name their reference by relative path: renamed folders would lose it
        other = tmp_path / "renamed"
        shutil.copytree(root, other)
        for s in STEPS:
            (other / f"step-{s}").rename(other / f"v2_ckpt{s}_final")
        es = src(other, step_regex=r"ckpt(\d+)").entries()
        assert sorted({e.step for e in es}) == list(STEPS)
        with pytest.raises(SourceError) as ei:
            src(other, step_regex=r"v(\d+)").entries()
        assert_one_line_error(ei, "both step 2")


def test_lmc_series_is_delta_coded_and_smaller(tmp_path_factory):
    import json

    root = tmp_path_factory.mktemp("lmcsize") / "run"
    write_series(root, "lmc")
    md = json.loads((root / "step-20" / "lmc-metadata.json").read_text())
    assert md["reference"]["path"] == "../step-30" and any(i["ref"] for i in md["items"])  # against the next one


# ---------------------------------------------------------------------------------------------------- errors
@pytest.fixture(scope="module")
def plain_series(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp_err") / "run"
    return root, write_series(root, "plain")


def test_errors(tmp_path, plain_series):
    root, _ = plain_series
    with pytest.raises(SourceError) as ei:
        src(tmp_path / "nope").entries()
    assert_one_line_error(ei, "no such folder")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError) as ei:
        src(tmp_path / "empty").entries()
    assert_one_line_error(ei, "no DCP checkpoint folders")
    with pytest.raises(SourceError) as ei:
        get_source({"type": "dcp"})
    assert_one_line_error(ei, "source.path")
    # an interrupted save (no metadata) among complete ones is named, not skipped
    run = tmp_path / "run"
    shutil.copytree(root, run)
    os.remove(run / "step-20" / ".metadata")
    with pytest.raises(SourceError) as ei:
        src(run).entries()
    assert_one_line_error(ei, "step-20", "not a complete DCP checkpoint")
    with pytest.raises(SourceError) as ei:
        src(run / "step-*").entries()
    assert_one_line_error(ei, "step-20", "not a complete DCP checkpoint folder")
    # a truncated data file: one line naming the folder and the tensor
    shutil.rmtree(run / "step-20")
    (run / "step-10" / "__0_0.distcp").write_bytes((run / "step-10" / "__0_0.distcp").read_bytes()[:100])
    s = src(run, steps=[10], include=r"^2\.weight$", kinds=["weight"])
    (e,) = s.entries()
    with pytest.raises(SourceError) as ei:
        s.load(e)
    assert_one_line_error(ei, "step-10", "2.weight")
    # garbage metadata
    (run / "step-30" / ".metadata").write_bytes(b"garbage")
    with pytest.raises(SourceError) as ei:
        src(run / "step-30").entries()
    assert_one_line_error(ei, ".metadata", "not readable DCP metadata")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_metadata_pickle_is_never_unpickled_arbitrarily(tmp_path, plain_series):
    root, _ = plain_series
    ck = tmp_path / "step-10"
    shutil.copytree(root / "step-10", ck)
    marker = tmp_path / "UNPICKLED"
    (ck / ".metadata").write_bytes(pickle.dumps(_Evil(str(marker))))
    with pytest.raises(SourceError) as ei:
        src(ck).entries()
    assert_one_line_error(ei, "refused")
    assert not marker.exists()
    pickle.loads((ck / ".metadata").read_bytes())  # the pickle is real: unpickling it would have run code
    assert marker.exists()


def test_corrupt_lmc_file_is_one_line(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmcbad") / "run"
    write_series(root, "lmc")
    import json

    md = json.loads((root / "step-30" / "lmc-metadata.json").read_text())
    it = next(i for i in md["items"] if i["fqn"] == "model.2.weight")
    p = root / "step-30" / it["file"]
    data = bytearray(p.read_bytes())
    data[it["pos"] + it["length"] // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    s = src(root, steps=[10], include=r"^2\.weight$", kinds=["weight"])  # step 10 decodes through step 30
    (e,) = s.entries()
    with pytest.raises(SourceError) as ei:
        s.load(e)
    assert_one_line_error(ei, "step-10", "2.weight", "step-30")
    shutil.rmtree(root / "step-20")  # a missing reference: one clear line
    with pytest.raises(SourceError) as ei:
        s.load(e)
    assert_one_line_error(ei, "reference checkpoint", "missing")
