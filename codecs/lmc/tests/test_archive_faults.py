"""lmc.archive: faults a skeptical tester found (symbolic links, step range, prune durations,
compress's exit status, repair's keyframe_every and its trust in a manifest, over-reported loss,
an S3 endpoint that dies mid-upload)."""
import contextlib
import io
import json
import os
import shutil

import numpy as np
import pytest

from lmc.archive import Archive, ArchiveError, main
from test_archive_damage import make_run, write_st


def cli(*args):
    """(rc, stdout, stderr) of lmc-archive in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def one_line_error(rc, err):
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmc-archive: error: "), err
    assert "Traceback" not in err


def files_of(root):
    out = {}
    for d, _, names in os.walk(root, followlinks=True):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


# ---------------------------------------------------------------- 4: symbolic links in a step folder

def _step_with_shared_tokenizer(tmp_path):
    run = tmp_path / "run"
    shared = run / "shared_tok"
    shared.mkdir(parents=True)
    (shared / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    (shared / "sub").mkdir()
    (shared / "sub" / "merges.txt").write_text("a b\n")
    ck = run / "checkpoint-9"
    ck.mkdir()
    write_st(str(ck / "model.safetensors"), {"w": np.arange(4096, dtype=np.float32)})
    os.symlink("../shared_tok", ck / "tokenizer")
    return ck


def test_symlinked_folder_is_archived(tmp_path):
    ck = _step_with_shared_tokenizer(tmp_path)
    arc = tmp_path / "arc"
    rc, out, err = cli("add", arc, ck)
    assert rc == 0, err
    rc, out, _ = cli("ls", arc, "--opaque")
    assert "tokenizer/tokenizer.json" in out and "tokenizer/sub/merges.txt" in out
    Archive(arc).restore(9, tmp_path / "out")
    assert files_of(tmp_path / "out") == files_of(ck)  # (files_of follows the link)
    assert os.path.isfile(tmp_path / "out" / "tokenizer" / "sub" / "merges.txt")


def test_shared_folder_linked_twice_is_not_a_loop(tmp_path):
    ck = _step_with_shared_tokenizer(tmp_path)
    os.symlink("../shared_tok", ck / "tokenizer2")
    Archive(tmp_path / "arc").add(ck)
    Archive(tmp_path / "arc").restore(9, tmp_path / "out")
    assert files_of(tmp_path / "out") == files_of(ck)


@pytest.mark.parametrize("case", ["dangling_dir", "dangling_file", "loop_self", "loop_parent", "loop_pair"])
def test_bad_symlinks_are_one_line_errors(tmp_path, case):
    ck = _step_with_shared_tokenizer(tmp_path)
    if case == "dangling_dir":
        os.symlink("../no_such_folder", ck / "extra")
        name = "extra"
    elif case == "dangling_file":
        os.symlink("missing.json", ck / "config.json")
        name = "config.json"
    elif case == "loop_self":
        os.symlink(".", ck / "again")
        name = "again"
    elif case == "loop_parent":
        os.symlink("../../checkpoint-9", tmp_path / "run" / "shared_tok" / "up")
        name = "up"
    else:
        os.symlink("b", ck / "a")
        os.symlink("a", ck / "b")
        name = "checkpoint-9/"
    arc = tmp_path / "arc"
    with pytest.raises(ArchiveError, match="symbolic link") as ei:
        Archive(arc).add(ck)
    assert name in str(ei.value) and "\n" not in str(ei.value)
    assert not arc.exists()  # nothing written
    rc, _, err = cli("add", arc, ck)
    one_line_error(rc, err)
    assert "symbolic link" in err and not arc.exists()


# ---------------------------------------------------------------- 5: prune --keep-within needs a unit

@pytest.fixture
def run8(tmp_path):
    folders = make_run(str(tmp_path / "run"), nsteps=8, n=2000, ntensors=1)
    for i, d in enumerate(folders):  # written a day apart
        t = 1_700_000_000 + i * 86400
        for n in os.listdir(d):
            os.utime(os.path.join(d, n), (t, t))
        os.utime(d, (t, t))
    arc = tmp_path / "arc"
    a = Archive(arc, keyframe_every=4)
    for d in folders:
        a.add(d)
    return a, arc, folders


def test_keep_within_needs_a_unit_and_must_be_positive(run8):
    a, arc, _ = run8
    before = a.steps()
    for bad in ("7", "0", "0d", "-1d", "7x", "", "nand", "infd"):
        rc, _, err = cli("prune", arc, f"--keep-within={bad}")
        one_line_error(rc, err)
        assert a.steps() == before, bad
    rc, _, err = cli("prune", arc, "--keep-within", "7")
    assert "unit" in err and "7d" in err
    rc, _, err = cli("prune", arc, "--keep-last", "0")
    one_line_error(rc, err)
    for v in (0, -5, float("nan")):
        with pytest.raises(ArchiveError, match="keep_within"):
            a.prune(keep_within=v)
    assert a.steps() == before
    rc, out, err = cli("prune", arc, "--keep-within", "2d")  # the latest and the two days before it
    assert rc == 0, err
    assert a.steps() == before[-3:]
    rc, out, err = cli("prune", arc, "--keep-within", "36h")
    assert rc == 0 and a.steps() == before[-2:]


# ---------------------------------------------------------------- 6: the step range

def test_step_out_of_range(tmp_path):
    folders = make_run(str(tmp_path / "run"), nsteps=1, n=1000, ntensors=1)
    arc = tmp_path / "arc"
    for bad in (10 ** 12, 99999999999999999, -1):
        with pytest.raises(ArchiveError, match="out of range"):
            Archive(arc).add(folders[0], bad)
        rc, _, err = cli("add", arc, folders[0], "--step", str(bad))
        one_line_error(rc, err)
        assert "out of range" in err and "manifest" not in err
    assert not arc.exists()
    big = tmp_path / "run" / f"checkpoint-{10 ** 12}"
    shutil.copytree(folders[0], big)
    with pytest.raises(ArchiveError, match="out of range"):
        Archive(arc).add(big)
    assert Archive(arc).add(folders[0], 10 ** 12 - 1) == 10 ** 12 - 1
    Archive(arc).restore(10 ** 12 - 1, tmp_path / "out")
    assert files_of(tmp_path / "out") == files_of(folders[0])


# ---------------------------------------------------------------- 7: compress with skipped folders

def test_compress_exits_nonzero_when_a_folder_is_skipped(tmp_path):
    folders = make_run(str(tmp_path / "run"), nsteps=4, n=1000, ntensors=1)
    arc = tmp_path / "arc"
    Archive(arc).add(folders[2])  # step 30: 10 and 20 are older
    rc, out, err = cli("compress", tmp_path / "run", arc)
    assert rc == 1
    assert "step 10: skipped" in out and "step 20: skipped" in out and "step 40:" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "2 step folder(s) not archived" in lines[0] and "10, 20" in lines[0]
    assert Archive(arc).steps() == [30, 40]  # the rest was processed
    rc, out, err = cli("compress", tmp_path / "run", arc)  # still two it cannot take
    assert rc == 1
    shutil.rmtree(folders[0])
    shutil.rmtree(folders[1])
    rc, out, err = cli("compress", tmp_path / "run", arc)
    assert rc == 0 and not err and out.count("already in the archive") == 2


# ---------------------------------------------------------------- 1: repair keeps keyframe_every

def _groups(a):
    """Sizes of the groups of steps whose chains end at one keyframe, oldest first."""
    from lmc.archive._graph import _roots
    from lmc.archive._manifest import read_manifest
    roots = _roots(read_manifest(a.path))
    return [sum(1 for r in roots.values() if r == k) for k in sorted(set(roots.values()))]


def test_repair_keeps_keyframe_every(tmp_path):
    folders = make_run(str(tmp_path / "run"), nsteps=9, n=2000, ntensors=1)
    arc = tmp_path / "arc"
    a = Archive(arc, keyframe_every=4)
    for d in folders[:6]:
        a.add(d)
    assert _groups(a) == [4, 2]
    os.unlink(arc / "lmc-archive.json")
    rc, out, err = cli("repair", arc)
    assert rc == 0, out + err
    assert "keyframe_every" not in out  # recorded: nothing to say
    assert Archive(arc).stored_keyframe_every() == 4
    for d in folders[6:]:
        Archive(arc).add(d)
    assert _groups(a) == [4, 4, 1]
    assert Archive(arc).verify().ok


def test_repair_infers_keyframe_every_from_older_segments(tmp_path, monkeypatch):
    """Segments written before keyframe_every was recorded: repair infers it from the chains and says so."""
    import lmc.archive._segments as st
    orig = st.SegmentWriter.commit

    def commit_without(self, index):
        index = dict(index)
        index.pop("keyframe_every", None)
        return orig(self, index)

    folders = make_run(str(tmp_path / "run"), nsteps=7, n=2000, ntensors=1)
    arc = tmp_path / "arc"
    monkeypatch.setattr(st.SegmentWriter, "commit", commit_without)
    a = Archive(arc, keyframe_every=3)
    for d in folders[:5]:
        a.add(d)
    monkeypatch.undo()
    assert _groups(a) == [3, 2]
    os.unlink(arc / "lmc-archive.json")
    steps, bad, res = Archive(arc).repair()
    assert steps == [10, 20, 30, 40, 50] and not bad and res.ok
    assert Archive(arc).stored_keyframe_every() == 3
    assert any("inferred" in n for n in res.notes)
    # the newest segment records it again; an older one without it is passed over
    Archive(arc).add(folders[5])
    os.unlink(arc / "lmc-archive.json")
    rc, out, err = cli("repair", arc)
    assert rc == 0 and "keyframe_every" not in out
    assert Archive(arc).stored_keyframe_every() == 3


def test_repair_keyframe_every_from_an_older_segment(tmp_path, monkeypatch):
    import lmc.archive._segments as st
    folders = make_run(str(tmp_path / "run"), nsteps=4, n=2000, ntensors=1)
    arc = tmp_path / "arc"
    a = Archive(arc, keyframe_every=5)
    for d in folders[:3]:
        a.add(d)
    orig = st.SegmentWriter.commit
    monkeypatch.setattr(st.SegmentWriter, "commit",
                        lambda self, index: orig(self, {k: v for k, v in index.items() if k != "keyframe_every"}))
    a.add(folders[3])
    monkeypatch.undo()
    os.unlink(arc / "lmc-archive.json")
    steps, bad, res = Archive(arc).repair()
    assert Archive(arc).stored_keyframe_every() == 5
    assert any("from step 20's segment" in n for n in res.notes), res.notes  # (30 was re-coded by that add)


def test_index_keyframe_every_is_checked():
    from lmc.archive._index import check_index
    idx = {"step": 3, "prev": None, "keyframe": True, "files": []}
    check_index(idx, 3)  # optional
    check_index({**idx, "keyframe_every": 7}, 3)
    for bad in (0, -1, "7", 7.0, True, 1 << 21, None):
        with pytest.raises(ArchiveError, match="keyframe_every"):
            check_index({**idx, "keyframe_every": bad}, 3)


# ---------------------------------------------------------------- 2: repair checks a manifest against its segments

def _swap_segments(arc, s1, s2):
    from lmc.archive._manifest import read_manifest, write_manifest
    m = read_manifest(str(arc))
    es = {e["step"]: e for e in m["steps"]}
    for f in ("segment", "size", "index_crc"):
        es[s1][f], es[s2][f] = es[s2][f], es[s1][f]
    write_manifest(str(arc), m)  # a valid checksum over wrong entries


def test_repair_rebuilds_a_manifest_its_segments_contradict(tmp_path):
    folders = make_run(str(tmp_path / "run"), nsteps=5, n=2000, ntensors=2)
    arc = tmp_path / "arc"
    a = Archive(arc, keyframe_every=3)
    for d in folders:
        a.add(d)
    with open(arc / "lmc-archive.json", "rb") as f:
        good = f.read()
    _swap_segments(arc, 20, 30)
    with open(arc / "lmc-archive.json", "rb") as f:
        wrong = f.read()
    segs = sorted(n for n in os.listdir(arc) if n.endswith(".lmca"))
    assert not Archive(arc).verify().ok
    rc, out, err = cli("repair", arc)
    assert rc == 0, out + err
    assert "manifest disagrees with its segments" in out and "damaged-lmc-archive.json" in out
    assert "0 lost" in out
    with open(arc / "damaged-lmc-archive.json", "rb") as f:
        assert f.read() == wrong  # kept
    with open(arc / "lmc-archive.json", "rb") as f:
        assert f.read() == good  # the same manifest, rebuilt
    assert sorted(n for n in os.listdir(arc) if n.endswith(".lmca")) == segs  # no data deleted
    assert Archive(arc).verify().ok
    for s, d in zip((10, 20, 30, 40, 50), folders):
        Archive(arc).restore(s, tmp_path / f"o{s}")
        assert files_of(tmp_path / f"o{s}") == files_of(d)
    # a second wrong manifest is kept beside the first
    _swap_segments(arc, 40, 50)
    steps, bad, res = Archive(arc).repair()
    assert res.ok and any("damaged-lmc-archive-2.json" in n for n in res.notes)
    assert os.path.exists(arc / "damaged-lmc-archive.json")
    # a manifest that agrees is left as it is
    steps, bad, res = Archive(arc).repair()
    assert res.ok and not res.notes and steps == [10, 20, 30, 40, 50]


def test_repair_keeps_an_unreadable_manifest(tmp_path):
    folders = make_run(str(tmp_path / "run"), nsteps=2, n=2000, ntensors=1)
    arc = tmp_path / "arc"
    for d in folders:
        Archive(arc, keyframe_every=4).add(d)
    with open(arc / "lmc-archive.json", "r+b") as f:
        f.seek(30)
        f.write(b"#")
    with open(arc / "lmc-archive.json", "rb") as f:
        bad = f.read()
    rc, out, err = cli("repair", arc)
    assert rc == 0, out + err
    assert "kept as damaged-lmc-archive.json" in out
    with open(arc / "damaged-lmc-archive.json", "rb") as f:
        assert f.read() == bad
    assert Archive(arc).steps() == [10, 20] and Archive(arc).stored_keyframe_every() == 4


def test_repair_twice_after_a_lost_reference_step(tmp_path):
    """A rebuilt manifest whose step lost its reference step (its index still names it) agrees with its
    segments: a second repair only verifies."""
    folders = make_run(str(tmp_path / "run"), nsteps=3, n=2000, ntensors=1)
    arc = tmp_path / "arc"
    for d in folders:
        Archive(arc, keyframe_every=3).add(d)
    seg20 = next(e["segment"] for e in Archive(arc).entries() if e["step"] == 20)
    os.unlink(arc / seg20)
    os.unlink(arc / "lmc-archive.json")
    steps, bad, res = Archive(arc).repair()
    assert steps == [10, 30] and res.unrestorable == [10]
    steps, bad, res = Archive(arc).repair()
    assert steps == [10, 30] and not res.notes and res.unrestorable == [10]
    assert not os.path.exists(arc / "damaged-lmc-archive.json")


def test_repair_keyframe_flag_disagreement(tmp_path):
    from lmc.archive._manifest import read_manifest, write_manifest
    folders = make_run(str(tmp_path / "run"), nsteps=3, n=2000, ntensors=1)
    arc = tmp_path / "arc"
    for d in folders:
        Archive(arc).add(d)
    m = read_manifest(str(arc))
    m["steps"][0]["depends_on"] = m["steps"][0]["prev"] = None  # step 10 is coded against 20
    m["steps"][0]["keyframe"] = True
    write_manifest(str(arc), m)
    steps, bad, res = Archive(arc).repair()
    assert res.ok and any("step 10: the manifest's keyframe or dependency" in n for n in res.notes)
    assert Archive(arc).entries()[0]["depends_on"] == 20


# ---------------------------------------------------------------- 3: what is really lost

def _flip_in(arc, step, path, which="data"):
    """Flip one byte inside a section of `path` in step's segment: a bytes file's chunk ("data") or
    one of its tensors ("tensor")."""
    from lmc.archive._index import all_sections
    from lmc.archive._manifest import read_manifest
    from lmc.archive._segments import SegmentReader
    e = next(e for e in read_manifest(str(arc))["steps"] if e["step"] == step)
    r = SegmentReader(str(arc), e)
    try:
        fe = next(fe for fe in r.index["files"] if fe["path"] == path)
    finally:
        r.close()
    sec = next(sec for what, sec, _c in all_sections(fe) if what.startswith(which))
    with open(os.path.join(arc, e["segment"]), "r+b") as f:
        f.seek(sec[0] + sec[1] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x5A]))


@pytest.fixture
def chain(tmp_path):
    folders = make_run(str(tmp_path / "run"), nsteps=3, n=4000, ntensors=2)
    for i, d in enumerate(folders):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"hidden": 64, "layers": 2, "note": "x" * 200, "i": i}, f)
    arc = tmp_path / "arc"
    a = Archive(arc, keyframe_every=3)
    for d in folders:
        a.add(d)
    es = a.entries()
    assert [e["depends_on"] for e in es] == [20, 30, None]  # 10 -> 20 -> 30 (the keyframe)
    return a, arc, folders


def test_damaged_bytes_file_of_a_keyframe_loses_only_that_step(chain, tmp_path):
    a, arc, folders = chain
    _flip_in(arc, 30, "config.json")
    res = a.verify()
    assert list(res.damaged) == [30] and "config.json" in res.damaged[30]
    assert res.dependents == {30: []} and res.unrestorable == [30]
    rc, out, _ = cli("verify", arc)
    assert rc == 1 and "step 30: DAMAGED" in out and "config.json" in out
    assert "step 10: ok" in out and "step 20: ok" in out and "depend" not in out.split("verify:")[0]
    for s, d in ((10, folders[0]), (20, folders[1])):  # its dependents restore byte-identical
        a.restore(s, tmp_path / f"o{s}")
        assert files_of(tmp_path / f"o{s}") == files_of(d)
    with pytest.raises(ArchiveError, match="config.json"):
        a.restore(30, tmp_path / "o30")
    os.unlink(arc / "lmc-archive.json")
    rc, out, _ = cli("repair", arc)
    assert "step 30: LOST" in out and "step 20: LOST" not in out and "2 step(s) restorable, 1 lost" in out


def test_damaged_bytes_file_in_the_middle_of_a_chain(chain, tmp_path):
    a, arc, folders = chain
    _flip_in(arc, 20, "trainer_state.json")
    res = a.verify()
    assert list(res.damaged) == [20] and res.unrestorable == [20]
    a.restore(10, tmp_path / "o10")
    assert files_of(tmp_path / "o10") == files_of(folders[0])


def test_damaged_tensor_of_a_keyframe_loses_its_dependents(chain):
    a, arc, _ = chain
    _flip_in(arc, 30, "model.safetensors", "tensor")
    res = a.verify()
    assert list(res.damaged) == [30] and res.dependents == {30: [10, 20]}
    assert res.unrestorable == [10, 20, 30]
    rc, out, _ = cli("verify", arc)
    assert "steps that depend on step 30 (cannot be restored): 10, 20" in out


def test_damaged_tensor_in_the_middle_of_a_chain(chain):
    a, arc, _ = chain
    _flip_in(arc, 20, "model.safetensors", "tensor")
    res = a.verify()
    assert list(res.damaged) == [20] and res.dependents == {20: [10]} and res.unrestorable == [10, 20]


# ---------------------------------------------------------------- 8: an S3 endpoint that dies mid-upload

_CHILD = r"""
import faulthandler, os, sys, time
faulthandler.dump_traceback_later(float(os.environ.get("HANG_S", "600")), exit=True)  # a hang: where
import fsspec
fsspec.config.conf["s3"] = {"default_block_size": 5 << 20}  # (parts of 5 MiB: a small multipart upload)
import lmc.archive._segments as st
from lmc.archive import main
flag = os.environ.get("PAUSE_DIR")
if flag:
    orig = st.SegmentWriter.add_section
    def add_section(self, data):
        ref = orig(self, data)
        if self.pos > (11 << 19) and not os.path.exists(os.path.join(flag, "started")):
            open(os.path.join(flag, "started"), "w").close()  # a part is uploaded: stop the endpoint now
            while not os.path.exists(os.path.join(flag, "go")):
                time.sleep(0.05)
        return ref
    st.SegmentWriter.add_section = add_section
sys.exit(main(sys.argv[1:]))
"""


def test_add_to_s3_fails_fast_when_the_endpoint_dies(tmp_path):
    import socket
    import subprocess
    import sys
    import time
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("AWS_MAX_ATTEMPTS", None)
    env.pop("AWS_RETRY_MODE", None)
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    rng = np.random.default_rng(0)
    for s in (1, 2):
        d = tmp_path / "run" / f"checkpoint-{s}"
        d.mkdir(parents=True)
        n = 20_000 if s == 1 else 3 << 18  # step 2: six tensors of 3 MiB, a segment of several parts
        write_st(str(d / "model.safetensors"),
                 {f"w{i}": rng.standard_normal(n).astype(np.float32) for i in range(1 if s == 1 else 6)})
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    stopped = False
    try:
        s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
        s3.create_bucket(Bucket="lmc-faults")
        arc = "s3://lmc-faults/run.lmca"
        p = subprocess.run([sys.executable, str(child), "add", arc, str(tmp_path / "run" / "checkpoint-1")],
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr

        def objects():
            return {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket="lmc-faults").get("Contents", [])}
        before = objects()
        flag = tmp_path / "flag"
        flag.mkdir()
        proc = subprocess.Popen([sys.executable, str(child), "add", arc, str(tmp_path / "run" / "checkpoint-2")],
                                env={**env, "PAUSE_DIR": str(flag), "HANG_S": "75"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 300
            while not (flag / "started").exists():
                assert proc.poll() is None, proc.communicate()
                assert time.time() < deadline
                time.sleep(0.05)
            server.stop()
            stopped = True
            t0 = time.time()
            (flag / "go").touch()
            out, err = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        took = time.time() - t0
        assert proc.returncode not in (0, None)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lmc-archive: error: "), err
        assert took < 90
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()  # (moto's state lives in this process: the bucket is as the dead endpoint left it)
        stopped = False
        assert objects() == before
        p = subprocess.run([sys.executable, "-m", "lmc.archive", "verify", arc], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "1 of 1 steps ok" in p.stdout, p.stdout + p.stderr
    finally:
        if not stopped:
            server.stop()
