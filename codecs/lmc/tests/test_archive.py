"""lmc.archive on a real Trainer-like checkpoint series (torch + safetensors)."""
import hashlib
import json
import os
import pickle
import random
import subprocess
import sys
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from helpers import assert_same as same_obj  # noqa: E402
from lmc.archive import Archive, ArchiveError  # noqa: E402

FILES_PLAIN = ("trainer_state.json", "scheduler.pt", "rng_state.pth", "training_args.bin",
               "extra.pt")


class Opaque:
    """Stands for a pickled object weights_only=True refuses (training_args.bin)."""

    def __init__(self, payload):
        self.payload = payload


def make_series(root, steps=(2, 4, 6, 8, 10), *, sharded=False, bf16=False, hidden=64,
                vocab=256, seed=0):
    """Train a small model with AdamW and save HF-Trainer-like checkpoint folders."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, hidden), torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
        torch.nn.Linear(4 * hidden, hidden), torch.nn.LayerNorm(hidden),
        torch.nn.Linear(hidden, vocab))
    if bf16:
        model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
    g = torch.Generator().manual_seed(seed + 1)
    folders = []
    for step in range(1, max(steps) + 1):
        x = torch.randint(0, vocab, (16, 8), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x).float().reshape(-1, vocab),
                                                 torch.roll(x, 1, 1).reshape(-1))
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        if step not in steps:
            continue
        d = os.path.join(root, f"checkpoint-{step}")
        os.makedirs(d)
        sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if sharded:
            keys = list(sd)
            shards = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
            wmap = {}
            for i, ks in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                st.save_file({k: sd[k] for k in ks}, os.path.join(d, name), metadata={"format": "pt"})
                wmap.update({k: name for k in ks})
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": sum(v.nbytes for v in sd.values())},
                           "weight_map": wmap}, f, indent=2)
        else:
            st.save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
        torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
        torch.save({"python": random.getstate(), "cpu": torch.get_rng_state()},
                   os.path.join(d, "rng_state.pth"))
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            json.dump({"global_step": step, "log_history": [{"loss": float(loss.detach())}]}, f, indent=2)
        with open(os.path.join(d, "training_args.bin"), "wb") as f:
            pickle.dump({"lr": 3e-3, "output_dir": root}, f)
        torch.save({"obj": Opaque(os.urandom(70000)), "w": torch.zeros(3)},
                   os.path.join(d, "extra.pt"))
        folders.append(d)
    return folders


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


TORCH_STRUCTURED = ("optimizer.pt",)


def assert_same_folder(orig, restored):
    files = sorted(os.path.relpath(os.path.join(d, f), orig)
                   for d, _, fs in os.walk(orig) for f in fs)
    got = sorted(os.path.relpath(os.path.join(d, f), restored)
                 for d, _, fs in os.walk(restored) for f in fs)
    assert files == got
    for rel in files:
        a, b = os.path.join(orig, rel), os.path.join(restored, rel)
        if os.path.basename(rel) in TORCH_STRUCTURED:
            same_obj(torch.load(a, weights_only=True), torch.load(b, weights_only=True))
        else:
            assert sha(a) == sha(b), rel


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(*args, check=True):
    """lmc-archive in this process (main(argv))."""
    import contextlib
    import io
    from lmc.archive import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    p = _Result(rc, out.getvalue(), err.getvalue())
    if check and rc:
        raise AssertionError(p.stdout + p.stderr)
    return p


def cli_subprocess(*args, check=True):
    """python -m lmc.archive in a subprocess."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "lmc.archive", *args], capture_output=True,
                       text=True, env=env)
    if check and p.returncode:
        raise AssertionError(p.stdout + p.stderr)
    return p


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("run"))
    return root, make_series(root, steps=(2, 4, 6, 8, 10, 12, 14))


def test_roundtrip_every_step_and_smaller_than_zlib(series, tmp_path):
    root, folders = series
    a = Archive(tmp_path / "a.lmca", keyframe_every=3)
    for d in folders:
        a.add(d)
    assert a.steps() == [2, 4, 6, 8, 10, 12, 14]
    es = a.entries()
    for e, d in zip(es, folders):
        zl = 0
        for f in os.listdir(d):
            with open(os.path.join(d, f), "rb") as fh:
                zl += len(zlib.compress(fh.read(), 6))
        assert e["size"] < zl, (e, zl)
    # each step is coded against the next one (the latest alone: it restores at keyframe
    # speed); keyframe spacing bounds the chain
    assert [e["keyframe"] for e in es] == [False, False, True, False, False, True, True]
    assert max(e["depth"] for e in es) == 2
    assert [e["depends_on"] for e in es] == [4, 6, None, 10, 12, None, None]
    for s, d in zip(a.steps(), folders):
        out = tmp_path / f"r{s}"
        a.restore(s, out)
        assert_same_folder(d, out)
    res = a.verify()
    assert res.ok and res.steps == a.steps()
    # what each file became
    with a._view() as v:
        kinds = {fe["path"]: fe["kind"] for fe in v.index(4)["files"]}
        refs = [t["ref"] for fe in v.index(4)["files"]
                for t in fe.get("parts", []) + fe.get("tensors", []) if "xxh" in t]
    assert kinds["model.safetensors"] == "safetensors" and kinds["optimizer.pt"] == "torchzip"
    assert kinds["extra.pt"] == "bytes" and kinds["training_args.bin"] == "bytes"
    # every tensor coded against its reference, but where format 10's zero mask (which codes alone) came out
    # smaller: only a tensor of 4096 bytes or more, a sixteenth of it zeros (the embedding's moments: tokens no
    # batch held yet)
    sd = torch.load(os.path.join(folders[1], "optimizer.pt"), weights_only=True)["state"]
    rich = [t for st in sd.values() for t in st.values() if t.numel() * t.element_size() >= 4096
            and int((t == 0).sum()) * 16 >= t.numel()]
    assert refs and len(refs) - sum(refs) <= len(rich)


def test_restored_optimizer_loads_weights_only(series, tmp_path):
    root, folders = series
    a = Archive(tmp_path / "a", keyframe_every=2)
    a.add(folders[0])
    a.add(folders[1], reference_folder=None)  # decode the reference from the archive
    a.restore(4, tmp_path / "out")
    o = torch.load(tmp_path / "out" / "optimizer.pt", weights_only=True)
    same_obj(torch.load(os.path.join(folders[1], "optimizer.pt"), weights_only=True), o)
    assert isinstance(o["state"][0]["step"], torch.Tensor) and o["state"][0]["step"].dim() == 0
    assert isinstance(o["param_groups"][0]["betas"], tuple)


def test_cli_compress_restore_ls_verify_prune(series, tmp_path):
    root, folders = series
    arc = str(tmp_path / "arc")
    p = cli("compress", root, arc, "--keyframe-every", "4")
    assert "step 14" in p.stdout
    p = cli("compress", root, arc)  # all present: skipped
    assert p.stdout.count("already in the archive") == 7
    p = cli("ls", arc)
    assert "keyframe" in p.stdout and "delta" in p.stdout and "total" in p.stdout
    p = cli("verify", arc)
    assert "verify: 7 of 7 steps ok" in p.stdout
    cli("restore", arc, str(tmp_path / "out"), "--step", "6", "10")
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-10", "checkpoint-6"]
    assert_same_folder(folders[2], tmp_path / "out" / "checkpoint-6")
    cli("restore", arc, str(tmp_path / "last"), "--last")
    assert os.listdir(tmp_path / "last") == ["checkpoint-14"]
    # prune: steps 12 (coded against 14) and 14 kept: nothing to re-code
    segs = {e["step"]: e["segment"] for e in Archive(arc).entries()}
    p = cli("prune", arc, "--keep-last", "2")
    assert "pruned 5" in p.stdout
    a = Archive(arc)
    assert a.steps() == [12, 14]
    e = a.entries()
    assert e[0]["depends_on"] == 14 and e[1]["keyframe"] and e[1]["depends_on"] is None
    assert [x["segment"] for x in e] == [segs[12], segs[14]]
    assert len([n for n in os.listdir(arc) if n.endswith(".lmca")]) == 2
    for s, d in ((12, folders[5]), (14, folders[6])):
        a.restore(s, tmp_path / f"p{s}")
        assert_same_folder(d, tmp_path / f"p{s}")
    assert a.verify().ok
    # adding continues the chain after a prune: 14 is re-coded against 16
    p = cli("add", arc, str(tmp_path / "p14"), "--step", "16")
    assert "step 16" in p.stdout
    e = Archive(arc).entries()
    assert [x["depends_on"] for x in e] == [14, 16, None]


def test_add_errors(series, tmp_path):
    root, folders = series
    a = Archive(tmp_path / "a")
    a.add(folders[1])
    with pytest.raises(ArchiveError, match="already"):
        a.add(folders[1])
    with pytest.raises(ArchiveError, match="older"):
        a.add(folders[0])
    with pytest.raises(ArchiveError, match="cannot tell the step"):
        a.add(tmp_path)
    p = cli_subprocess("restore", str(tmp_path / "nope"), str(tmp_path / "o"), check=False)
    assert p.returncode == 2 and p.stderr.startswith("lmc-archive: error: ")
    assert len(p.stderr.strip().splitlines()) == 1
    with pytest.raises(ArchiveError, match="not an empty directory"):
        os.makedirs(tmp_path / "full")
        open(tmp_path / "full" / "x", "w").close()
        a.restore(4, tmp_path / "full")


@pytest.mark.parametrize("kind", ["sharded_bf16"])
def test_sharded_bf16(tmp_path, kind):
    root = str(tmp_path / "run")
    folders = make_series(root, steps=(1, 2, 3), sharded=True, bf16=True)
    a = Archive(tmp_path / "a")
    for d in folders:
        a.add(d)
    with a._view() as v:
        fe = {f["path"]: f for f in v.index(2)["files"]}  # (3, the latest, is coded alone)
    assert "model.safetensors.index.json" in fe and fe["model.safetensors.index.json"]["kind"] == "bytes"
    ts = [p for p in fe["model-00001-of-00002.safetensors"]["parts"] if p["t"] == "tensor"]
    assert ts and all(p["dtype"] == "BF16" and p["np"] == "bfloat16" and p["ref"] for p in ts)
    for s, d in zip((1, 2, 3), folders):
        a.restore(s, tmp_path / f"r{s}")
        assert_same_folder(d, tmp_path / f"r{s}")


def test_safetensors_odd_layouts(tmp_path):
    """Padding between tensors, trailing bytes, unknown dtypes, shape change,
    hostile headers: restored byte for byte (hostile ones kept as bytes)."""
    import struct
    rng = np.random.default_rng(0)

    def write(path, tensors, pad=b"", tail=b"", extra_hdr=None):
        hdr, data = {"__metadata__": {"k": "v"}}, b""
        for name, dt, shape, raw in tensors:
            data += pad
            hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        if extra_hdr:
            hdr.update(extra_hdr)
        h = json.dumps(hdr).encode() + b"   "
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data + tail)

    d1, d2 = tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"
    os.makedirs(d1), os.makedirs(d2)
    w = rng.standard_normal(3000).astype(np.float32)
    w2 = w.copy()
    w2[::7] += 1e-3
    i64 = np.arange(100, dtype=np.int64).tobytes()
    write(d1 / "a.safetensors", [("w", "F32", [3000], w.tobytes()), ("i", "I64", [100], i64),
                                 ("b", "BOOL", [5], bytes([0, 1, 2, 1, 0])),
                                 ("x", "F4", [7], b"\x01\x02\x03\x04"), ("z", "F32", [0], b"")],
          pad=b"\xff" * 3, tail=b"trailing")
    write(d2 / "a.safetensors", [("w", "F32", [3000], w2.tobytes()), ("i", "I64", [10, 10], i64)],
          pad=b"\x00" * 8)
    for d in (d1, d2):
        # hostile: out-of-range offsets, overlap, bad header length
        write(d / "bad1.safetensors", [("w", "F32", [4], b"\0" * 16)],
              extra_hdr={"v": {"dtype": "F32", "shape": [4], "data_offsets": [0, 10**9]}})
        write(d / "bad2.safetensors", [("w", "F32", [4], b"\0" * 16)],
              extra_hdr={"v": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})
        with open(d / "bad3.safetensors", "wb") as f:
            f.write(struct.pack("<Q", 2**63) + b"{}")
        open(d / "empty.safetensors", "wb").close()
        os.makedirs(d / "sub" / "deeper")
        with open(d / "sub" / "deeper" / "n.txt", "wb") as f:
            f.write(b"hello " * 100)
    a = Archive(tmp_path / "a")
    a.add(d1)
    a.add(d2)
    with a._view() as v:
        fe = {f["path"]: f for f in v.index(1)["files"]}  # (coded against step 2)
        assert fe["a.safetensors"]["kind"] == "safetensors"
        assert all(fe[f"bad{i}.safetensors"]["kind"] == "bytes" for i in (1, 2, 3))
        parts = {p["key"]: p for p in fe["a.safetensors"]["parts"] if p["t"] == "tensor"}
        assert parts["w"]["ref"] and not parts["i"]["ref"]  # i changed shape: coded alone
    for s, d in ((1, d1), (2, d2)):
        a.restore(s, tmp_path / f"r{s}")
        assert_same_folder(d, tmp_path / f"r{s}")


def test_tensors_are_coded_with_their_rows(tmp_path):
    """A safetensors matrix goes into the archive with its shape (lmc's predicted-exponent mode sees its rows:
    an Adam second moment is coded as version 3); restored byte for byte, also when the next step refers to it."""
    import lmc
    from safetensors.numpy import save_file
    from make_vectors import second_moment
    v = second_moment(np.float32, 256, 192, 7, steps=40)
    folders = []
    for s in (1, 2):
        d = tmp_path / "run" / f"checkpoint-{s}"
        os.makedirs(d)
        save_file({"v": (v * (1 + 0.01 * s)).astype(np.float32)}, str(d / "model.safetensors"))
        folders.append(str(d))
    a = Archive(tmp_path / "a")
    for d in folders:
        a.add(d)
    with a._view() as vw:
        fe = {f["path"]: f for f in vw.index(2)["files"]}["model.safetensors"]
        t = next(p for p in fe["parts"] if p["t"] == "tensor")
        blob = vw.reader(2).read(t["sec"], "v")
    assert not t["ref"] and lmc.info(blob)["shape"] == (256, 192) and lmc.info(blob)["chunk_modes"].get("predicted")
    for s, d in zip((1, 2), folders):
        a.restore(s, tmp_path / f"r{s}")
        assert_same_folder(d, tmp_path / f"r{s}")
