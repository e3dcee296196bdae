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
