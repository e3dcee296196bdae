"""Archive format 3: older archives still read (a frozen version 2 archive made by lmc 0.3.5), the parallel
path writes the same bytes at every thread count, the one integrity layer catches damage, restored files get
their mode and mtime back, and a source file truncated while it is read is one line (no SIGBUS)."""
import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from lmc.archive import Archive, ArchiveError  # noqa: E402
from make_frozen_archive import digests as _digests  # noqa: E402
from test_archive import make_series  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _manifest(path):
    with open(os.path.join(path, "lmc-archive.json")) as f:
        return json.load(f)["manifest"]


def _index(a, step):
    with a._view() as v:
        return v.index(step)


@pytest.fixture
def frozen(tmp_path):
    src = os.path.join(DATA, "archive_v2")
    dst = tmp_path / "v2"
    shutil.copytree(src, dst)
    with open(os.path.join(DATA, "archive_v2.json")) as f:
        want = {int(s): d for s, d in json.load(f)["steps"].items()}
    return dst, want


def test_frozen_version2_archive_restores_and_verifies(frozen, tmp_path):
    path, want = frozen
    a = Archive(path)
    assert _manifest(path)["version"] == 2 and a.steps() == sorted(want)
    assert any(not e["keyframe"] for e in a.entries())  # it holds steps coded against the next
    for s in a.steps():
        a.restore(s, tmp_path / f"r{s}")
        assert _digests(tmp_path / f"r{s}") == want[s]
    assert a.verify().ok


def test_frozen_version2_archive_takes_version3_steps(frozen, tmp_path):
    """A new step is written as version 3; the version 2 step re-coded against it keeps its version 2 index
    (CRC-32 sections, SHA-256 checksums); prune re-codes a version 2 step the same way; every step restores."""
    path, want = frozen
    new = make_series(tmp_path / "more", steps=(2, 4, 6, 8, 10), hidden=32, vocab=64)[-1]
    a = Archive(path, keyframe_every=3)
    a.add(new)
    assert _manifest(path)["version"] == 3
    assert _index(a, 10)["version"] == 3
    last_v2 = _index(a, 8)
    assert "version" not in last_v2 and all(len(p["sec"]) == 3 for p in last_v2["files"][1]["parts"]
                                            if p["t"] == "tensor")
    assert a.verify().ok
    for s in (2, 4, 6, 8):
        a.restore(s, tmp_path / f"r{s}")
        assert _digests(tmp_path / f"r{s}") == want[s]
    a.restore(10, tmp_path / "r10")
    assert _digests(tmp_path / "r10") == _digests(new)
    a.prune(keep_every=4)  # keeps 4 and 8 (and 10); a kept step coded against a dropped one is re-coded
    assert a.steps() == [4, 8, 10] and a.verify().ok
    for s in (4, 8):
        shutil.rmtree(tmp_path / f"r{s}")
        a.restore(s, tmp_path / f"r{s}")
        assert _digests(tmp_path / f"r{s}") == want[s]


def test_same_bytes_at_every_thread_count(tmp_path):
    folders = make_series(tmp_path / "run", steps=(2, 4, 6))
    segs = {}
    for threads in (1, 3):
        a = Archive(tmp_path / f"a{threads}", keyframe_every=10, threads=threads)
        for f in folders:
            a.add(f)
        segs[threads] = []
        for e in a.entries():
            with open(tmp_path / f"a{threads}" / e["segment"], "rb") as fh:
                segs[threads].append(fh.read())
        assert a.verify().ok
    assert segs[1] == segs[3]


def test_every_piece_is_checked_once_end_to_end(tmp_path):
    """Version 3 keeps no section CRC and no file SHA-256: a flipped byte in a verbatim chunk or in a tensor's
    blob is caught by the piece's xxh3-128 (or the codec's own checks) on restore and by verify."""
    folder = make_series(tmp_path / "run", steps=(2,))[0]
    for what in ("chunk", "tensor"):
        a = Archive(tmp_path / f"a-{what}")
        a.add(folder)
        idx = _index(a, 2)
        fe = next(f for f in idx["files"] if f["path"] == "model.safetensors")
        assert "sha256" not in fe and all(len(c["sec"]) == 2 for p in fe["parts"] for c in p.get("chunks", ()))
        if what == "chunk":
            sec = next(p for p in fe["parts"] if p["t"] == "raw")["chunks"][0]["sec"]
        else:
            sec = max((p for p in fe["parts"] if p["t"] == "tensor"), key=lambda p: p["n"])["sec"]
        seg = tmp_path / f"a-{what}" / a.entries()[0]["segment"]
        b = bytearray(seg.read_bytes())
        b[sec[0] + sec[1] // 2] ^= 0x10
        seg.write_bytes(bytes(b))
        with pytest.raises(ArchiveError):
            a.restore(2, tmp_path / f"out-{what}")
        assert not (tmp_path / f"out-{what}").exists()
        res = a.verify()
        assert not res.ok and 2 in res.damaged


def test_restore_gives_back_mode_and_mtime(tmp_path):
    folder = make_series(tmp_path / "run", steps=(2,))[0]
    p = os.path.join(folder, "optimizer.pt")
    os.chmod(p, 0o600)
    os.utime(p, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    q = os.path.join(folder, "trainer_state.json")
    os.chmod(q, 0o640)
    a = Archive(tmp_path / "a")
    a.add(folder)
    a.restore(2, tmp_path / "out")
    for src in (p, q):
        got = os.stat(tmp_path / "out" / os.path.basename(src))
        assert oct(got.st_mode & 0o7777) == oct(os.stat(src).st_mode & 0o7777)
        assert got.st_mtime_ns == os.stat(src).st_mtime_ns


def test_source_truncated_while_added_is_one_line(tmp_path, monkeypatch):
    """The file is cut after its layout was read and before its tensors are: a clean ArchiveError (the old
    reader mapped the file and died of SIGBUS), and the archive keeps what it had."""
    folders = make_series(tmp_path / "run", steps=(2, 4))
    a = Archive(tmp_path / "a")
    a.add(folders[0])
    before = _digests(tmp_path / "a")
    from lmc.archive import _add
    real = _add.parse_safetensors
    victim = os.path.join(folders[1], "model.safetensors")

    def parse_then_cut(f, size):
        got = real(f, size)
        if getattr(f, "name", None) == victim:
            os.truncate(victim, size // 2)
        return got

    monkeypatch.setattr(_add, "parse_safetensors", parse_then_cut)
    with pytest.raises(ArchiveError, match="changed while being read"):
        a.add(folders[1])
    assert _digests(tmp_path / "a") == before and a.steps() == [2]


def _segment_bytes(a, step):
    e = next(e for e in a.entries() if e["step"] == step)
    with open(os.path.join(a.path, e["segment"]), "rb") as f:
        return f.read()


def test_background_recode_gives_the_same_archive(tmp_path):
    """add(background=True) returns once the new step is committed alone; the previous step's re-code
    runs behind and commits the same bytes a foreground add writes."""
    folders = make_series(tmp_path / "run", steps=(2, 4, 6))
    fg, bg = Archive(tmp_path / "fg"), Archive(tmp_path / "bg")
    for f in folders:
        fg.add(f)
        bg.add(f, background=True)
        assert os.path.basename(f) in [e["name"] for e in bg.entries()]  # committed before the re-code ends
    bg.wait()
    assert [(e["step"], e["depends_on"]) for e in bg.entries()] == [(2, 4), (4, 6), (6, None)]
    assert not any("recode" in e for e in bg.entries())
    for s in (2, 4, 6):
        assert _segment_bytes(fg, s) == _segment_bytes(bg, s)
    assert bg.verify().ok


def test_background_recode_that_fails_leaves_a_loadable_archive(tmp_path, monkeypatch):
    folders = make_series(tmp_path / "run", steps=(2, 4, 6))
    a = Archive(tmp_path / "a")
    a.add(folders[0])
    from lmc.archive import _recoder

    def boom(self, next_step):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(_recoder._NextRecoder, "finish", boom)
        a.add(folders[1], background=True)
        with pytest.raises(OSError, match="No space left"):
            a.wait()
    es = {e["step"]: e for e in a.entries()}
    assert es[2]["recode"] == 4 and es[2]["depends_on"] is None and es[4]["depends_on"] is None
    assert not [n for n in os.listdir(a.path) if n.startswith(".tmp-")]
    for s, f in zip((2, 4), folders):
        a.restore(s, tmp_path / f"r{s}")
        assert _digests(tmp_path / f"r{s}") == _digests(f)
    a.add(folders[2])  # the next add re-codes step 2 against 4 first (folded into the save)
    assert [(e["step"], e["depends_on"]) for e in a.entries()] == [(2, 4), (4, 6), (6, None)]
    assert not any("recode" in e for e in a.entries()) and a.verify().ok


def test_process_killed_during_background_recode(tmp_path):
    """The process ends (os._exit: no thread is waited for) right after a background add returns: the new
    step is there and every step restores; the next add completes the re-code."""
    import subprocess
    import sys
    folders = make_series(tmp_path / "run", steps=(2, 4))
    a = Archive(tmp_path / "a")
    a.add(folders[0])
    code = ("import os, sys; from lmc.archive import Archive; "
            f"Archive({str(tmp_path / 'a')!r}).add({folders[1]!r}, background=True); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    a = Archive(tmp_path / "a")
    assert a.steps() == [2, 4]
    for s, f in zip((2, 4), folders):
        a.restore(s, tmp_path / f"r{s}")
        assert _digests(tmp_path / f"r{s}") == _digests(f)
    assert a.verify().ok
    a.add(folders[1], step=5)
    assert a.entries()[0]["depends_on"] == 4 and not any("recode" in e for e in a.entries())


def test_the_pool_keeps_order_and_its_memory_budget():
    """Results come back in submission order; the bytes in flight never pass the budget unless one piece alone
    is larger; an error cancels what has not started and is raised once."""
    import threading
    import time
    from lmc.archive._pipeline import Ordered

    lock = threading.Lock()
    now, peak, got = [0], [0], []

    def job(i, cost):
        with lock:
            now[0] += cost
            peak[0] = max(peak[0], now[0])
        time.sleep(0.002 * (i % 3))
        with lock:
            now[0] -= cost
        return i

    costs = [10, 30, 50, 10, 120, 5, 5, 60, 40, 10] * 3
    with Ordered(3, budget=100) as pool:
        for i, c in enumerate(costs):
            pool.submit(lambda i=i, c=c: job(i, c), got.append, cost=c)
    assert got == list(range(len(costs)))
    assert peak[0] <= 120  # (the 120-byte piece ran alone)
    ran = []

    def bad(i):
        ran.append(i)
        if i == 2:
            raise ValueError("piece 2")
        time.sleep(0.01)
        return i

    with pytest.raises(ValueError, match="piece 2"):
        with Ordered(2) as pool:
            for i in range(50):
                pool.submit(lambda i=i: bad(i))
    assert len(ran) < 50


def test_the_unordered_pool_is_not_held_by_a_slow_piece():
    """in_order=False (a restore's pieces): while one worker runs a slow piece, the others go on with the pieces
    behind it; in order they stop once the window is full behind the slow one. Every piece runs once, results
    come back (in any order), the budget holds and an error is raised."""
    import threading
    from lmc.archive._pipeline import Ordered

    def run(in_order):
        lock = threading.Lock()
        now, peak, got, others = [0], [0], [], [0]
        all_others = threading.Event()
        seen = []

        def job(i, cost):
            with lock:
                now[0] += cost
                peak[0] = max(peak[0], now[0])
            if i == 0:  # the slow piece: until every other piece has run, or 1 s
                all_others.wait(1.0)
                seen.append(others[0])
            else:
                with lock:
                    others[0] += 1
                    if others[0] == 39:
                        all_others.set()
            with lock:
                now[0] -= cost
            return i

        with Ordered(2, budget=100, in_order=in_order) as pool:
            for i in range(40):
                pool.submit(lambda i=i: job(i, 10), got.append, cost=10)
        assert sorted(got) == list(range(40)) and peak[0] <= 100
        return seen[0]

    assert run(in_order=True) <= 3  # (the window: two pieces per worker, the slow one among them)
    assert run(in_order=False) == 39  # the other worker ran every other piece meanwhile
    with pytest.raises(ValueError, match="piece 5"):
        with Ordered(2, in_order=False) as pool:
            for i in range(20):
                pool.submit(lambda i=i: (_ for _ in ()).throw(ValueError(f"piece {i}")) if i == 5 else i)


def test_next_add_after_a_failed_background_recode_warns_and_goes_on(tmp_path, monkeypatch):
    """The caller never called wait(): the next add says the re-code failed, re-codes that step first and adds."""
    folders = make_series(tmp_path / "run", steps=(2, 4, 6))
    a = Archive(tmp_path / "a")
    a.add(folders[0])
    from lmc.archive import _recoder
    real = _recoder._NextRecoder.finish
    calls = []

    def fail_once(self, next_step):
        calls.append(next_step)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(self, next_step)

    monkeypatch.setattr(_recoder._NextRecoder, "finish", fail_once)
    a.add(folders[1], background=True)
    with pytest.warns(UserWarning, match="background re-code failed"):
        a.add(folders[2])
    assert [(e["step"], e["depends_on"]) for e in a.entries()] == [(2, 4), (4, 6), (6, None)]
    assert a.verify().ok
