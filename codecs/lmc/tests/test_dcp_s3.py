"""lmc.dcp on object storage: LMCStorageWriter / LMCStorageReader with s3:// URLs against a real S3 endpoint
(moto's standalone server on 127.0.0.1, started by the fixture), reached through AWS_ENDPOINT_URL alone. Round
trips, chains whose oldest folders are deleted the way retention scripts do, lmc.dcp.prune on a URL, and writers
killed (SIGKILL) mid-save, in the new checkpoint's data and while re-coding the previous one."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("s3fs")
pytest.importorskip("moto")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from lmc.dcp import LMCStorageReader, LMCStorageWriter, is_lmc_checkpoint, prune  # noqa: E402
from s3server import BUCKET, s3_server  # noqa: E402,F401 - the fixture "s3"
from test_dcp import ERRORS, assert_same, blank, load, save, snapshot, train_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _fs():
    import s3fs
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs


def _chain(root, n):
    """Checkpoints step-1..step-n of a training run under the URL root, each saved against the one before."""
    m, opt, step = train_state()
    states = {}
    for i in range(1, n + 1):
        states[i] = snapshot(m, opt)
        save(states[i], f"{root}/step-{i}", reference=f"{root}/step-{i - 1}" if i > 1 else None)
        step()
    return states


def _meta(url):
    import json
    return json.loads(_fs().cat_file(f"{url.removeprefix('s3://')}/lmc-metadata.json"))


def test_round_trip_chain_and_rm_rf_retention_on_s3(s3):
    root = f"s3://{BUCKET}/dcp-chain"
    states = _chain(root, 4)
    assert is_lmc_checkpoint(f"{root}/step-4") and not is_lmc_checkpoint(f"{root}/step-9")
    assert LMCStorageReader.validate_checkpoint_id(f"{root}/step-4")
    assert LMCStorageWriter.validate_checkpoint_id(f"{root}/step-9")
    # the newest is coded alone; each older one against the next, by a path relative to it
    assert _meta(f"{root}/step-4")["reference"] is None
    ref = _meta(f"{root}/step-3")["reference"]
    assert ref["path"] == "../step-4" and ref["abspath"] == f"{root}/step-4"
    for i in range(1, 5):
        assert_same(states[i], load(states[i], f"{root}/step-{i}"))
    # keep_latest_k's way: the oldest folders deleted with no help of ours
    fs = _fs()
    fs.rm(f"{BUCKET}/dcp-chain/step-1", recursive=True)
    fs.rm(f"{BUCKET}/dcp-chain/step-2", recursive=True)
    for i in (3, 4):
        assert_same(states[i], load(states[i], f"{root}/step-{i}"))
    # the plain DCP reader, pointed at the URL, is told which reader to use
    with pytest.raises(ERRORS, match="LMCStorageReader"):
        dcp.load(blank(states[4]), checkpoint_id=f"{root}/step-4")


def test_prune_keeps_what_a_policy_keeps_on_s3(s3):
    root = f"s3://{BUCKET}/dcp-prune"
    states = _chain(root, 6)
    gone = prune(root, keep_last=1, keep_every=3)
    assert sorted(p.rsplit("/", 1)[1] for p in gone) == ["step-1", "step-2", "step-4", "step-5"]
    names = sorted(p.rsplit("/", 1)[1] for p in _fs().ls(f"{BUCKET}/dcp-prune"))
    assert names == ["step-3", "step-6"]
    for i in (3, 6):  # step-3 was coded against step-4 (deleted): re-coded against step-6 first
        assert_same(states[i], load(states[i], f"{root}/step-{i}"))
    assert _meta(f"{root}/step-3")["reference"]["path"] == "../step-6"


_CHILD = """
import sys, time, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed.checkpoint as dcp
import lmc.dcp as L
from lmc.dcp._recode import _Recoder
where, url, ref = sys.argv[1], sys.argv[2], sys.argv[3]
real_code, real_recode, n, r = L.LMCStorageWriter._code_tensor, _Recoder.recoded, [0], [0]
def stop():
    print("inside", flush=True)
    time.sleep(120)
def code(self, *a, **k):
    n[0] += 1
    if where == "data" and n[0] == 3:
        stop()
    return real_code(self, *a, **k)
def recode(self, *a, **k):
    r[0] += 1
    if where == "recode" and r[0] == 2:   # (its own count: workers interleave coding and re-coding)
        stop()
    return real_recode(self, *a, **k)
L.LMCStorageWriter._code_tensor, _Recoder.recoded = code, recode
torch.manual_seed(7)
sd = {"big%d" % i: torch.randn(3 << 20) for i in range(4)}  # 12 MiB each: multipart uploads under way
dcp.save(sd, storage_writer=L.LMCStorageWriter(url, reference=ref, background=False))  # (the re-coding in the save)
"""


@pytest.mark.parametrize("where", ["data", "recode"])
def test_killed_writer_leaves_the_previous_state_on_s3(s3, where):
    """SIGKILL in the middle of a save (while streaming the new checkpoint's data file, or the previous one's
    re-coded file): every complete checkpoint loads as it was; the interrupted one is not complete; saving it
    again works and leaves no stray object behind."""
    root = f"s3://{BUCKET}/dcp-kill-{where}"
    m, opt, step = train_state()
    s1 = snapshot(m, opt)
    save(s1, f"{root}/step-1")
    step()
    s2 = snapshot(m, opt)
    save(s2, f"{root}/step-2", reference=f"{root}/step-1")
    before = {p: _fs().cat_file(p) for p in _fs().find(f"{BUCKET}/dcp-kill-{where}")}
    # the killed save continues the chain from step-2 with a different state (its re-coding of step-2 fails
    # no check: only the kill stops it)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, where, f"{root}/step-3", f"{root}/step-2"],
                             env={**os.environ, **s3}, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "inside"
    finally:
        child.kill()
        child.wait()
    after = {p: _fs().cat_file(p) for p in _fs().find(f"{BUCKET}/dcp-kill-{where}")}
    assert {p: v for p, v in after.items() if p in before} == before  # nothing committed was touched
    assert not is_lmc_checkpoint(f"{root}/step-3")
    assert_same(s1, load(s1, f"{root}/step-1"))
    assert_same(s2, load(s2, f"{root}/step-2"))
    step()
    s3_ = snapshot(m, opt)
    save(s3_, f"{root}/step-3", reference=f"{root}/step-2")
    for i, s in ((1, s1), (2, s2), (3, s3_)):
        assert_same(s, load(s, f"{root}/step-{i}"))
    # each folder holds what its metadata names, the signpost and nothing else
    fs = _fs()
    for i in (1, 2, 3):
        meta = _meta(f"{root}/step-{i}")
        names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{BUCKET}/dcp-kill-{where}/step-{i}"))
        assert names == sorted({".metadata", "lmc-metadata.json"} | {it["file"] for it in meta["items"]}), names
