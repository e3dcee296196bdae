"""lmc-archive on object storage: a real S3 endpoint (moto's standalone server on 127.0.0.1, started here, as
s3fs's own tests do), reached through AWS_ENDPOINT_URL alone."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from lmc.archive import Archive, ArchiveError  # noqa: E402

from s3server import BUCKET, s3_server  # noqa: E402,F401 - the fixture "s3"


def _run(root, steps=(1, 2, 3, 4)):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(96, 192), torch.nn.GELU(), torch.nn.Linear(192, 96))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    folders = []
    for step in range(1, max(steps) + 1):
        x = torch.randn(8, 96)
        ((m(x) - x) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step in steps:
            d = root / f"checkpoint-{step}"
            d.mkdir(parents=True)
            torch.save(m.state_dict(), d / "pytorch_model.bin")
            torch.save(opt.state_dict(), d / "optimizer.pt")
            (d / "trainer_state.json").write_text('{"global_step": %d}' % step)
            folders.append(d)
    return folders


def _files(tree):
    return {os.path.relpath(os.path.join(d, f), tree): open(os.path.join(d, f), "rb").read()
            for d, _, fs in os.walk(tree) for f in fs}


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "lmc.archive", *args], capture_output=True, text=True,
                          env={**os.environ, **env})


def test_cli_compress_ls_verify_restore_prune_on_s3(s3, tmp_path):
    folders = _run(tmp_path / "run")
    url = f"s3://{BUCKET}/cli/run.lmca"
    p = _cli("compress", str(tmp_path / "run"), url, "--keyframe-every", "3", env=s3)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("step ") == 4
    p = _cli("ls", url, env=s3)
    assert p.returncode == 0 and "total" in p.stdout
    p = _cli("verify", url, env=s3)
    assert p.returncode == 0 and "4 of 4 steps ok" in p.stdout
    p = _cli("restore", url, str(tmp_path / "out"), env=s3)
    assert p.returncode == 0, p.stderr
    for d in folders:
        assert _files(tmp_path / "out" / d.name) == _files(d)
    p = _cli("prune", url, "--keep-last", "2", env=s3)
    assert p.returncode == 0 and "pruned 2" in p.stdout
    import s3fs
    names = sorted(os.path.basename(n) for n in s3fs.S3FileSystem().ls(f"{BUCKET}/cli/run.lmca"))
    assert "lmc-archive.json" in names and len([n for n in names if n.startswith("seg-")]) == 2


def test_killed_writer_leaves_the_previous_state(s3, tmp_path):
    """A writer killed (SIGKILL) in the middle of an add on S3: the archive is what it was; the next
    add cleans up and goes on."""
    folders = _run(tmp_path / "run", steps=(1, 2, 3))
    url = f"s3://{BUCKET}/kill/run.lmca"
    a = Archive(url)
    for d in folders[:2]:
        a.add(d)
    before = [(e["step"], e["segment"]) for e in a.entries()]
    big = tmp_path / "big" / "checkpoint-9"
    big.mkdir(parents=True)
    for i in range(3):
        torch.save({"w": torch.randn(1 << 20)}, big / f"shard{i}.pt")
    # the child stops inside the add, after some sections were streamed, and says so; then it is killed
    code = f"""
import sys, time
from lmc.archive import Archive, _segments
orig, n = _segments.SegmentWriter.add_section, [0]
def slow(self, data):
    n[0] += 1
    if n[0] == 4:
        print("inside", flush=True)
        time.sleep(60)
    return orig(self, data)
_segments.SegmentWriter.add_section = slow
Archive({url!r}).add({str(big)!r})
"""
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **s3}, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "inside"
    child.kill()
    child.wait()
    assert [(e["step"], e["segment"]) for e in Archive(url).entries()] == before
    assert Archive(url).verify().ok
    a.add(folders[2])
    assert a.steps() == [1, 2, 3] and a.verify().ok
    a.restore(1, tmp_path / "r1")
    assert _files(tmp_path / "r1") == _files(folders[0])


def test_bad_urls_are_one_line(s3, tmp_path):
    p = _cli("ls", f"s3://{BUCKET}/nothing-here.lmca", env=s3)
    assert p.returncode == 2 and "no such archive" in p.stderr and p.stderr.count("\n") == 1
    p = _cli("ls", "nosuchproto://x/y", env=s3)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    with pytest.raises(ArchiveError):
        Archive(f"s3://{BUCKET}/nothing-here.lmca").restore(1, tmp_path / "o")
    assert not (tmp_path / "o").exists()
