"""source=hf_hub: a Hub repository's revisions as a series, read through huggingface_hub from a cache folder the
tests build (offline), or downloaded from a local server that answers the Hub's HTTP API (loopback only), and
step-major iteration, which delete_after needs, measured exactly as tensor-major."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")

from lmcbench.bench.options import BenchOptions
from lmcbench.bench.runner import run
from lmcbench.codecs import get_codec
from lmcbench.errors import ConfigError, SourceError
from lmcbench.sources import get_source, hf_hub
from lmcbench.sources.hf_hub import cache_listing, delete_from_cache, read_files
from lmcbench.transforms import Pipeline

from lmcbench_testlib import assert_one_line_error, make_hf_cache, make_trainer_folder, run_cli, to_np

REPO_ID = "lmcbench-tests/tiny"
REVS = ["step100", "step200", "step300"]
QUICK = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False, xor_lags=[1, 2])
TIMING = {"compress_s", "decompress_s", "compress_cpu_s", "decompress_cpu_s", "compress_s_min", "compress_s_max",
          "decompress_s_min", "decompress_s_max", "transform_s", "untransform_s", "repeats"}


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """A Trainer output folder with checkpoints at steps 100, 200, 300 (safetensors weights, AdamW state, the
    RNG/scheduler/trainer files and a training_args.bin that would leave a marker if it were unpickled), each
    with the same config.json."""
    root = tmp_path_factory.mktemp("hub") / "run"
    data = make_trainer_folder(root, steps=(100, 200, 300), marker=root / "UNPICKLED")
    for s in (100, 200, 300):
        (root / f"checkpoint-{s}" / "config.json").write_text(json.dumps({"model_type": "tiny", "n_layer": 2}))
    return {"root": root, "data": data, "folders": {f"step{s}": root / f"checkpoint-{s}" for s in (100, 200, 300)}}


@pytest.fixture
def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read once, at import


def hub_source(cache, **kw):
    return get_source({"type": "hf_hub", "repo_id": REPO_ID, "revisions": REVS, "cache_dir": str(cache), **kw})


def pipelines():
    return {"raw": Pipeline.from_config("raw", []),
            "delta": Pipeline.from_config("delta", [{"id": "delta", "mode": "xor"}]),
            "delta_lag2": Pipeline.from_config("delta_lag2", [{"id": "delta", "mode": "xor", "lag": 2}])}


def measure(src, out: Path) -> dict:
    codecs = {"zstd": get_codec({"id": "zstd", "level": 3}), "lmc": get_codec({"id": "lmc", "threads": 1})}
    summary = run(src, pipelines(), codecs, QUICK, str(out), log=lambda m: None)
    return {"summary": summary, **{n: read_csv(out / f"{n}.csv") for n in ("records", "streams", "xor")}}


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def comparable(rows: list[dict]) -> list[tuple]:
    """The rows without their timings, in a fixed order."""
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in TIMING)) for r in rows)


def tree(folder: Path) -> dict:
    """Every file, link and folder under ``folder``: links by target, files by sha256."""
    out = {}
    for p in cache_listing(str(folder)):
        full = folder / p
        if p.endswith("/"):
            out[p] = "dir"
        elif full.is_symlink():
            out[p] = "-> " + os.readlink(full)
        else:
            out[p] = hashlib.sha256(full.read_bytes()).hexdigest()
    return out


def check_series(res: dict, data: dict, marker: Path):
    recs = res["records"]
    assert recs and res["summary"]["failed"] == 0
    assert all(r["verified"] == "True" for r in recs)
    assert {r["kind"] for r in recs} == {"weight", "exp_avg", "exp_avg_sq"}
    assert {int(r["step"]) for r in recs} == {100, 200, 300}
    assert {r["codec"] for r in recs} == {"zstd", "lmc"}
    # the temporal pipelines' references: the previous revision, two back for lag 2
    delta = {(int(r["step"]), r["ref_step"]) for r in recs if r["transform"] == "delta"}
    assert delta == {(100, ""), (200, "100"), (300, "200")}
    lag2 = {(int(r["step"]), r["ref_step"]) for r in recs if r["transform"] == "delta_lag2"}
    assert lag2 == {(100, ""), (200, ""), (300, "100")}
    names = {r["tensor"] for r in recs}
    assert names == set(data[100]["weights"])  # moments named after their parameters
    for step in (100, 200, 300):  # each revision's tensors measured at their size
        sizes = {(r["tensor"], r["kind"]): int(r["orig_bytes"]) for r in recs if int(r["step"]) == step}
        for n, t in data[step]["weights"].items():
            assert sizes[n, "weight"] == t.numel() * t.element_size()
    assert not marker.exists(), "training_args.bin was unpickled"


# --------------------------------------------------------------------------------------- an offline cache
def test_offline_cache_series_weights_and_moments(series, offline, tmp_path):
    cache = tmp_path / "hub"
    make_hf_cache(cache, REPO_ID, series["folders"])
    before = tree(cache)
    src = hub_source(cache)
    # the tensors are the trained ones, step by step
    es = {(e.step, e.name, e.kind): e for e in src.entries()}
    for step in (100, 200, 300):
        w = src.load(es[step, "fc1.weight", "weight"]).array
        assert np.array_equal(w, to_np(series["data"][step]["weights"]["fc1.weight"]))
        slot = series["data"][step]["param_groups"][0]["param_names"].index("fc2.weight")
        m = src.load(es[step, "fc2.weight", "exp_avg_sq"]).array
        assert np.array_equal(m, to_np(series["data"][step]["opt"][slot]["exp_avg_sq"]))
    res = measure(src, tmp_path / "out")
    check_series(res, series["data"], series["root"] / "UNPICKLED")
    assert tree(cache) == before  # read, never written


def test_step_major_and_tensor_major_give_the_same_records(series, tmp_path):
    """The same series measured tensor by tensor and checkpoint by checkpoint: the same records, streams and
    XOR rows (timings aside), the lag-2 delta included."""
    src_t = get_source({"type": "hf_trainer", "path": str(series["root"])})
    src_s = get_source({"type": "hf_trainer", "path": str(series["root"])})
    src_s.step_major = True
    es = src_s.entries()
    assert [e.step for e in es] == sorted(e.step for e in es) and es[0].name != es[1].name  # step by step
    a, b = measure(src_t, tmp_path / "t"), measure(src_s, tmp_path / "s")
    check_series(a, series["data"], series["root"] / "UNPICKLED")
    for name in ("records", "streams", "xor"):
        assert a[name] and comparable(a[name]) == comparable(b[name]), name
    assert {int(r["lag"]) for r in a["xor"]} == {1, 2}
    # step-major rows really came in another order
    assert [r["step"] for r in a["records"]] != [r["step"] for r in b["records"]]


def test_delete_after_on_a_cache_it_did_not_fill_deletes_nothing(series, offline, tmp_path):
    cache = tmp_path / "hub"
    make_hf_cache(cache, REPO_ID, series["folders"])
    before = tree(cache)
    a = measure(hub_source(cache), tmp_path / "a")
    src = hub_source(cache, delete_after=True)
    assert src.step_major
    b = measure(src, tmp_path / "b")
    check_series(b, series["data"], series["root"] / "UNPICKLED")
    assert comparable(a["records"]) == comparable(b["records"])
    assert tree(cache) == before


def test_offline_errors_are_one_line(series, offline, tmp_path):
    cache = tmp_path / "hub"
    make_hf_cache(cache, REPO_ID, series["folders"])
    with pytest.raises(SourceError) as ei:
        hub_source(cache, revisions=["step100", "step999"]).entries()
    assert_one_line_error(ei, REPO_ID, "step999", "not in the cache", "HF_HUB_OFFLINE")
    with pytest.raises(SourceError) as ei:
        hub_source(cache, repo_id="nobody/nothing").entries()
    assert_one_line_error(ei, "nobody/nothing", "step100")
    with pytest.raises(SourceError) as ei:
        hub_source(cache, repo_id=None)
    assert_one_line_error(ei, "source.repo_id")
    for revs in (None, []):
        with pytest.raises(SourceError) as ei:
            hub_source(cache, revisions=revs)
        assert_one_line_error(ei, "source.revisions")
    with pytest.raises(SourceError) as ei:
        hub_source(cache, revisions=["step100", "main"])
    assert_one_line_error(ei, f"{REPO_ID}@main", "no step in the revision name", "step_regex")
    with pytest.raises(SourceError) as ei:
        hub_source(cache, revisions=["step100", "v2-step100"])
    assert_one_line_error(ei, "both step 100")
    with pytest.raises(ConfigError) as ei:
        hub_source(cache, repo_id="not a repo id")
    assert_one_line_error(ei, "source.repo_id")
    with pytest.raises(ConfigError) as ei:
        hub_source(cache, repo_type="bucket")
    assert_one_line_error(ei, "source.repo_type")
    with pytest.raises(SourceError) as ei:  # a step selection outside the revisions
        hub_source(cache, steps=[100, 400]).entries()
    assert_one_line_error(ei, "[400]")


def test_step_selection_fetches_only_the_selected_revisions(series, offline, tmp_path):
    cache = tmp_path / "hub"
    make_hf_cache(cache, REPO_ID, {"step100": series["folders"]["step100"], "step300": series["folders"]["step300"]})
    # step200 is not in the cache: selecting around it never asks for it
    es = hub_source(cache, steps=[100, 300], kinds=["weight"]).entries()
    assert {e.step for e in es} == {100, 300} and {e.kind for e in es} == {"weight"}


def test_delete_after_needs_the_same_tensors_in_every_revision(series, offline, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    odd = tmp_path / "odd"
    shutil.copytree(series["folders"]["step300"], odd)
    weights = load_file(str(odd / "model.safetensors"))
    del weights["fc2.bias"]
    save_file(weights, str(odd / "model.safetensors"))
    cache = tmp_path / "hub"
    make_hf_cache(cache, REPO_ID, {**series["folders"], "step300": odd})
    with pytest.raises(SourceError) as ei:
        measure(hub_source(cache, delete_after=True), tmp_path / "out")
    assert_one_line_error(ei, f"{REPO_ID}@step300", "step100", "fc2.bias")
    assert (cache / f"models--{REPO_ID.replace('/', '--')}" / "refs" / "step300").exists()


# ------------------------------------------------------------------------------- the cache's bookkeeping
def test_read_files_prefers_what_is_read():
    assert read_files(["model.safetensors", "pytorch_model.bin", "optimizer.pt", "config.json"]) == \
        ["model.safetensors", "optimizer.pt", "config.json"]
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert read_files(shards + ["pytorch_model.bin", "optimizer.pt"]) == shards + ["optimizer.pt"]
    assert read_files(["model.safetensors"] + shards) == ["model.safetensors"]
    assert read_files(["pytorch_model.bin", "config.json"]) == ["pytorch_model.bin", "config.json"]


def test_delete_from_cache_keeps_blobs_a_kept_snapshot_links(tmp_path):
    """Only the given paths go, and of them not a blob that a snapshot left in place still links to."""
    folder = tmp_path / "models--o--n"
    (folder / "blobs").mkdir(parents=True)
    (folder / "snapshots" / "old").mkdir(parents=True)
    (folder / "blobs" / "shared").write_bytes(b"s" * 10)
    os.symlink("../../blobs/shared", folder / "snapshots" / "old" / "config.json")
    before = cache_listing(str(folder))
    (folder / "snapshots" / "new").mkdir()
    (folder / "blobs" / "mine").write_bytes(b"m" * 100)
    (folder / "blobs" / "shared2").write_bytes(b"t" * 7)
    os.symlink("../../blobs/mine", folder / "snapshots" / "new" / "model.safetensors")
    os.symlink("../../blobs/shared2", folder / "snapshots" / "new" / "config.json")
    os.symlink("../../blobs/shared2", folder / "snapshots" / "old" / "extra.json")  # a snapshot not ours links it
    (folder / "refs").mkdir()
    (folder / "refs" / "step2").write_text("new")
    added = cache_listing(str(folder)) - before - {"snapshots/old/extra.json"}
    assert delete_from_cache(str(folder), added) == 100 + 3  # the blob only it used and the ref
    assert cache_listing(str(folder)) == before | {"snapshots/old/extra.json", "blobs/shared2"}
    assert (folder / "blobs" / "shared").read_bytes() == b"s" * 10


# ------------------------------------------------------------------------- real downloads from a local Hub
def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LocalHub:
    """One model repository served on 127.0.0.1 the way the Hub's HTTP API serves it to huggingface_hub:
    ``/api/models/<repo>/revision/<rev>`` (the commit), ``/api/models/<repo>/tree/<commit>`` (the files, the
    large ones as LFS with their sha256) and ``/<repo>/resolve/<rev>/<file>`` (HEAD: commit, ETag and size;
    GET: the bytes). Unknown repositories, revisions and files get the Hub's 404s with their ``X-Error-Code``.
    Every file GET is logged (revision name, file) with the blobs ``watch`` (a cache folder) holds then."""

    def __init__(self, repo_id: str, revisions: dict):
        self.repo_id, self.refs, self.files = repo_id, {}, {}
        for rev, folder in revisions.items():
            files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*"))
                     if p.is_file()}
            commit = hashlib.sha1(json.dumps([rev, sorted((k, git_blob_sha1(v)) for k, v in files.items())])
                                  .encode()).hexdigest()
            self.refs[rev] = commit
            self.files[commit] = files
        self.gets: list[tuple[str, str, set]] = []
        self.watch: Path | None = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub.answer(self, head=True)

            def do_GET(self):
                hub.answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def lfs(name: str) -> bool:
        return name.endswith((".safetensors", ".pt", ".bin", ".pth"))

    def etag(self, name: str, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest() if self.lfs(name) else git_blob_sha1(data)

    def commit(self, rev: str):
        return rev if rev in self.files else self.refs.get(rev)

    def answer(self, h, head: bool):
        path = h.path.split("?", 1)[0]
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo, action, rev = "/".join(parts[2:4]), parts[4], parts[5]
            if repo != self.repo_id:
                return self.send(h, 404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}')
            commit = self.commit(rev)
            if commit is None:
                return self.send(h, 404, {"X-Error-Code": "RevisionNotFound"}, b'{"error": "Invalid rev id"}')
            files = self.files[commit]
            if action == "revision":
                body = {"id": repo, "sha": commit, "siblings": [{"rfilename": n} for n in files]}
            else:  # tree
                body = [{"type": "file", "oid": git_blob_sha1(d), "size": len(d), "path": n,
                         **({"lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 134}}
                            if self.lfs(n) else {})} for n, d in files.items()]
            return self.send(h, 200, {"Content-Type": "application/json"}, json.dumps(body).encode())
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if repo != self.repo_id:
                return self.send(h, 404, {"X-Error-Code": "RepoNotFound"}, b"")
            commit = self.commit(rev)
            if commit is None:
                return self.send(h, 404, {"X-Error-Code": "RevisionNotFound"}, b"")
            data = self.files[commit].get(name)
            if data is None:
                return self.send(h, 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, b"")
            if not head:
                blobs = {p.name for p in (self.watch / "blobs").iterdir()} if self.watch and \
                    (self.watch / "blobs").is_dir() else set()
                self.gets.append(({c: r for r, c in self.refs.items()}[commit], name, blobs))
            return self.send(h, 200, {"X-Repo-Commit": commit, "ETag": f'"{self.etag(name, data)}"',
                                      "Content-Type": "application/octet-stream"}, data, head=head)
        return self.send(h, 404, {}, b"")

    @staticmethod
    def send(h, status: int, headers: dict, body: bytes, head: bool = False):
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)


@pytest.fixture
def local_hub(series, tmp_path):
    """The series on a local Hub; each revision also holds a pytorch_model.bin beside its safetensors."""
    import shutil

    import torch

    folders = {}
    for rev, folder in series["folders"].items():
        shutil.copytree(folder, tmp_path / "repo" / rev)
        step = int(rev.removeprefix("step"))
        torch.save(series["data"][step]["weights"], tmp_path / "repo" / rev / "pytorch_model.bin")
        folders[rev] = tmp_path / "repo" / rev
    hub = LocalHub(REPO_ID, folders)
    yield hub
    hub.close()


def test_delete_after_deletes_only_what_the_run_downloaded(series, local_hub, tmp_path, monkeypatch):
    from huggingface_hub import snapshot_download

    cache = tmp_path / "hub"
    folder = cache / f"models--{REPO_ID.replace('/', '--')}"
    # step100 was downloaded before the run (as a user would have it), with every file
    snapshot_download(REPO_ID, revision="step100", cache_dir=str(cache), endpoint=local_hub.url)
    before = tree(folder)
    assert any(p.startswith("snapshots/") and p.endswith("training_args.bin") for p in before)
    local_hub.gets.clear()
    local_hub.watch = folder
    mapped_when_deleted = []

    def deleting(where, paths):
        freed = delete_from_cache(where, paths)
        maps = Path("/proc/self/maps")
        mapped_when_deleted.append([ln for ln in maps.read_text().splitlines() if str(folder) in ln
                                    and "(deleted)" in ln] if maps.exists() else [])
        return freed

    monkeypatch.setattr(hf_hub, "delete_from_cache", deleting)
    src = hub_source(cache, endpoint=local_hub.url, delete_after=True)
    res = measure(src, tmp_path / "out")
    check_series(res, series["data"], series["root"] / "UNPICKLED")
    # the cache is as it was: step100 untouched, nothing of step200 and step300 left (blobs, links, refs, trees)
    assert tree(folder) == before
    # only the files read were downloaded; config.json's blob, the same in every revision, was in the cache
    got = sorted((rev, name) for rev, name, _ in local_hub.gets)
    assert got == [(r, n) for r in ("step200", "step300") for n in ("model.safetensors", "optimizer.pt")]
    # one revision on disk at a time: step200's blobs were gone before step300's files were requested
    step200 = {local_hub.etag(n, d) for n, d in local_hub.files[local_hub.refs["step200"]].items()
               if n in ("model.safetensors", "optimizer.pt")}
    step100 = {p.name for p in (folder / "blobs").iterdir()}
    for rev, name, blobs in local_hub.gets:
        assert blobs >= step100  # the watch sees the cache
        if rev == "step300":
            assert not blobs & step200, name
    # ... and gone from the disk, not only from the folder: no deleted file still mapped when it was deleted
    assert mapped_when_deleted == [[], []]


def test_download_without_delete_keeps_the_revisions(series, local_hub, tmp_path):
    cache = tmp_path / "hub"
    folder = cache / f"models--{REPO_ID.replace('/', '--')}"
    res = measure(hub_source(cache, endpoint=local_hub.url), tmp_path / "out")
    check_series(res, series["data"], series["root"] / "UNPICKLED")
    names = {name for _, name, _ in local_hub.gets}
    assert names == {"model.safetensors", "optimizer.pt", "config.json"}  # never the .bin, the pickles, the RNG
    for rev in REVS:
        snap = folder / "snapshots" / local_hub.refs[rev]
        assert sorted(p.name for p in snap.iterdir()) == ["config.json", "model.safetensors", "optimizer.pt"]


def test_hub_errors_are_one_line(series, local_hub, tmp_path):
    cache = tmp_path / "hub"
    with pytest.raises(SourceError) as ei:
        hub_source(cache, endpoint=local_hub.url, revisions=["step100", "step999"]).entries()
    assert_one_line_error(ei, REPO_ID, "'step999'", "not found on the Hub")
    with pytest.raises(SourceError) as ei:
        hub_source(cache, endpoint=local_hub.url, repo_id="nobody/nothing").entries()
    assert_one_line_error(ei, "nobody/nothing", "repository not found")
    with pytest.raises(SourceError) as ei:
        hub_source(cache, endpoint=local_hub.url, allow_patterns=["*.gguf"]).entries()
    assert_one_line_error(ei, f"{REPO_ID}@step100", "allow_patterns")


# -------------------------------------------------------------------------------------------------- the CLI
def test_cli_offline(series, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    make_hf_cache(cache, REPO_ID, series["folders"])
    args = ["source=hf_hub", f"source.repo_id={REPO_ID}", "source.revisions=[step100,step200,step300]",
            f"source.cache_dir={cache}", "source.delete_after=true", "codec=[zstd]", "pipeline=[raw,delta]",
            "bench=quick", "report=none", f"hydra.run.dir={tmp_path / 'out'}"]
    env_cache = tmp_path / "lmcbench-cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = run_cli(args, tmp_path, env_cache)
    bad = run_cli(["source=hf_hub", "codec=[zstd]", "pipeline=[raw]"], tmp_path, env_cache)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = read_csv(tmp_path / "out" / "records.csv")
    assert {int(r["step"]) for r in recs} == {100, 200, 300} and all(r["verified"] == "True" for r in recs)
    assert "hf_hub: lmcbench-tests/tiny@step300" in p.stderr
    assert bad.returncode == 2
    err = bad.stderr.strip().splitlines()
    assert len(err) == 1 and "source.repo_id" in err[0], bad.stderr
