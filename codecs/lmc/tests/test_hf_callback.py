"""lmc.hf.LMCArchiveCallback: unit tests with fake Trainer events, and a real
transformers.Trainer run (tiny GPT-2)."""
import os
import shutil
import threading
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lmc.archive import Archive  # noqa: E402
from lmc.hf import LMCArchiveCallback  # noqa: E402
from test_archive import assert_same_folder, make_series  # noqa: E402


def _ev(out, step, main=True):
    return (types.SimpleNamespace(output_dir=out),
            types.SimpleNamespace(global_step=step, is_world_process_zero=main), None)


def test_callback_archives_in_background(tmp_path):
    run = str(tmp_path / "run")
    folders = make_series(run, steps=(2, 4, 6))
    keep = str(tmp_path / "keep")
    shutil.copytree(run, keep)
    cb = LMCArchiveCallback(tmp_path / "arc", keyframe_every=2, delete_raw=True, max_queue=1)
    for s in (2, 4, 6):
        cb.on_save(*_ev(run, s))
        cb.on_step_end(*_ev(run, s))
    cb.on_train_end(*_ev(run, 6))
    a = Archive(tmp_path / "arc")
    assert a.steps() == [2, 4, 6] and cb.archived == [2, 4, 6]
    assert not any(os.path.exists(f) for f in folders)  # delete_raw
    for s in (2, 4, 6):
        a.restore(s, tmp_path / f"r{s}")
        assert_same_folder(os.path.join(keep, f"checkpoint-{s}"), tmp_path / f"r{s}")
    # not the main process: nothing happens
    cb2 = LMCArchiveCallback(tmp_path / "arc2")
    cb2.on_save(*_ev(keep, 2, main=False))
    cb2.on_train_end(*_ev(keep, 2, main=False))
    assert not os.path.exists(tmp_path / "arc2")


def test_worker_error_is_reraised_and_queue_blocks(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    make_series(run, steps=(2, 4))
    cb = LMCArchiveCallback(tmp_path / "arc", max_queue=1)
    gate = threading.Event()
    calls = []

    def slow_add(folder, step=None, **kw):
        calls.append(step)
        gate.wait(30)
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(cb.archive, "add", slow_add)
    cb.on_save(*_ev(run, 2))        # taken by the worker, which blocks
    while not calls:
        threading.Event().wait(0.01)
    cb.on_save(*_ev(run, 4))        # fills the queue (size 1)
    t = threading.Thread(target=cb.on_save, args=_ev(run, 4))
    t.start()
    t.join(0.3)
    assert t.is_alive()             # a third save blocks while the queue is full
    gate.set()
    t.join(30)
    with pytest.raises(RuntimeError, match="simulated"):
        cb.on_train_end(*_ev(run, 4))
    assert calls == [2]             # after an error nothing more is archived


def _tiny_gpt2():
    """A tiny GPT-2 and its training data, seeded."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=0, eos_token_id=0)
    g = torch.Generator().manual_seed(0)
    return GPT2LMHeadModel(cfg), [{"input_ids": x, "labels": x} for x in torch.randint(0, 128, (64, 16), generator=g)]


@pytest.mark.slow
def test_real_trainer_run(tmp_path):
    from transformers import Trainer, TrainingArguments
    model, data = _tiny_gpt2()
    out = str(tmp_path / "out")
    args = TrainingArguments(output_dir=out, max_steps=6, save_steps=2, per_device_train_batch_size=8,
                             learning_rate=1e-3, logging_steps=2, report_to=[], use_cpu=True,
                             dataloader_num_workers=0, seed=0)
    cb = LMCArchiveCallback(tmp_path / "arc.lmca", keyframe_every=2)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    a = Archive(tmp_path / "arc.lmca")
    assert a.steps() == [2, 4, 6]
    assert [e["depends_on"] for e in a.entries()] == [4, None, None]  # 2 coded against 4; 6, the latest, alone
    assert a.verify().ok
    for s in a.steps():
        raw = os.path.join(out, f"checkpoint-{s}")
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(os.listdir(raw))
        a.restore(s, tmp_path / "r" / f"checkpoint-{s}")
        assert_same_folder(raw, tmp_path / "r" / f"checkpoint-{s}")


def _gated_add(cb, monkeypatch):
    """Make the worker's Archive.add wait for a gate (then run the real add); returns (gate, started)."""
    gate, started = threading.Event(), threading.Event()
    real_add = cb.archive.add

    def add(folder, step=None, **kw):
        started.set()
        assert gate.wait(30)
        return real_add(folder, step, **kw)

    monkeypatch.setattr(cb.archive, "add", add)
    return gate, started


def test_folder_rotated_away_while_queued_is_still_archived(tmp_path, monkeypatch):
    # the Trainer's save_total_limit deletes checkpoint-<old> when it saves the next one, which may be before
    # the worker has read it: the staged hard links keep the files
    run = str(tmp_path / "run")
    make_series(run, steps=(2, 4))
    keep = str(tmp_path / "keep")
    shutil.copytree(run, keep)
    cb = LMCArchiveCallback(tmp_path / "arc", keyframe_every=4)
    gate, started = _gated_add(cb, monkeypatch)
    cb.on_save(*_ev(run, 2))
    assert started.wait(30)
    shutil.rmtree(os.path.join(run, "checkpoint-2"))  # rotation, while the worker is inside add()
    cb.on_save(*_ev(run, 4))
    shutil.rmtree(os.path.join(run, "checkpoint-4"))  # and this one before the worker even started it
    gate.set()
    cb.on_train_end(*_ev(run, 4))
    a = Archive(tmp_path / "arc")
    assert a.steps() == [2, 4] and a.verify().ok
    assert [e["depends_on"] for e in a.entries()] == [4, None]  # step 2 coded against step 4, the latest alone
    for s in (2, 4):
        a.restore(s, tmp_path / f"r{s}")
        assert_same_folder(os.path.join(keep, f"checkpoint-{s}"), tmp_path / f"r{s}")
    assert not os.path.exists(os.path.join(run, ".lmc-archive-staging"))  # staging cleaned up


def test_without_hard_links_the_next_save_waits_for_the_worker(tmp_path, monkeypatch):
    import errno

    import lmc.hf as hf
    run = str(tmp_path / "run")
    make_series(run, steps=(2,))
    cb = LMCArchiveCallback(tmp_path / "arc")

    def no_link(src, dst):
        raise OSError(errno.EXDEV, "cross-device link (simulated)")

    monkeypatch.setattr(hf.os, "link", no_link)
    gate, started = _gated_add(cb, monkeypatch)
    cb.on_save(*_ev(run, 2))
    assert started.wait(30)
    assert not os.path.exists(os.path.join(run, ".lmc-archive-staging"))  # nothing half-linked left
    args, state, _ = _ev(run, 3)
    cb.on_step_end(args, state, types.SimpleNamespace(should_save=False))  # no save next: returns at once
    t = threading.Thread(target=cb.on_step_end, args=(args, state, types.SimpleNamespace(should_save=True)))
    t.start()
    t.join(0.3)
    assert t.is_alive()  # a save (and a rotation) comes next: waits until the worker has read the folder
    gate.set()
    t.join(30)
    assert not t.is_alive() and cb.archived == [2]
    cb.on_train_end(*_ev(run, 3))
    assert Archive(tmp_path / "arc").steps() == [2]


def test_failed_archive_keeps_the_staged_copy(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    make_series(run, steps=(2,))
    cb = LMCArchiveCallback(tmp_path / "arc")

    def fail(folder, step=None, **kw):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(cb.archive, "add", fail)
    cb.on_save(*_ev(run, 2))
    shutil.rmtree(os.path.join(run, "checkpoint-2"))  # rotated away: the staged links are the only copy
    with pytest.raises(RuntimeError, match=r"simulated.*kept in .*\.lmc-archive-staging") as ei:
        cb.on_train_end(*_ev(run, 2))
    kept = str(ei.value).rsplit("kept in ", 1)[1].rstrip(")")
    assert os.path.dirname(kept) == os.path.join(run, ".lmc-archive-staging")
    assert {"model.safetensors", "optimizer.pt"} <= set(os.listdir(kept))


@pytest.mark.slow
def test_real_trainer_run_with_save_total_limit(tmp_path, monkeypatch):
    """save_total_limit=1: the Trainer deletes each checkpoint folder when it saves the next; with a worker
    slowed down to take longer than a save interval, every step still lands in the archive, bit-exact."""
    import time

    from transformers import Trainer, TrainingArguments
    model, data = _tiny_gpt2()
    out = str(tmp_path / "out")
    args = TrainingArguments(output_dir=out, max_steps=6, save_steps=1, save_total_limit=1,
                             per_device_train_batch_size=8, learning_rate=1e-3, report_to=[], use_cpu=True,
                             dataloader_num_workers=0, seed=0)
    cb = LMCArchiveCallback(tmp_path / "arc.lmca", keyframe_every=3, max_queue=8)
    real_add = cb.archive.add
    copies = {}

    def slow_add(folder, step=None, **kw):
        time.sleep(0.5)  # longer than a training step here: the Trainer rotates folders the worker has queued
        copies[step] = str(tmp_path / "seen" / f"checkpoint-{step}")
        shutil.copytree(folder, copies[step])
        return real_add(folder, step, **kw)

    monkeypatch.setattr(cb.archive, "add", slow_add)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    assert sorted(p for p in os.listdir(out) if p.startswith("checkpoint-")) == ["checkpoint-6"]
    a = Archive(tmp_path / "arc.lmca")
    assert a.steps() == [1, 2, 3, 4, 5, 6] and a.verify().ok
    for s in a.steps():
        a.restore(s, tmp_path / "r" / f"checkpoint-{s}")
        assert_same_folder(copies[s], tmp_path / "r" / f"checkpoint-{s}")
    assert_same_folder(os.path.join(out, "checkpoint-6"), tmp_path / "r" / "checkpoint-6")
    assert not os.path.exists(os.path.join(out, ".lmc-archive-staging"))


def test_callback_keeps_the_archives_stored_keyframe_every(tmp_path):
    """The archive's stored setting is kept unless told otherwise; told otherwise, it warns."""
    import warnings
    run = str(tmp_path / "run")
    folders = make_series(run, steps=(2, 4))
    a = Archive(tmp_path / "arc", keyframe_every=3)
    a.add(folders[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cb = LMCArchiveCallback(tmp_path / "arc")  # no warning, and the stored 3 stays
    cb.archive.add(folders[1])
    assert Archive(tmp_path / "arc").stored_keyframe_every() == 3
    with pytest.warns(UserWarning, match="stores keyframe_every=3; using 5"):
        LMCArchiveCallback(tmp_path / "arc", keyframe_every=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LMCArchiveCallback(tmp_path / "arc", keyframe_every=3)  # the same value: no warning
        LMCArchiveCallback(tmp_path / "new", keyframe_every=5)  # no archive yet: nothing to warn about
