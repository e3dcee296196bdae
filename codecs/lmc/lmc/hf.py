"""Hugging Face Trainer integration: archive every checkpoint as it is saved.

    from lmc.hf import LMCArchiveCallback
    trainer = Trainer(..., callbacks=[LMCArchiveCallback("run.lmca")])

`on_save` hands the new `checkpoint-<step>` folder to a background thread
that appends it to an lmc archive (lmc.archive) while training continues.
Needs `transformers` (extra `lmc[hf]`).

The Trainer may delete a checkpoint folder before the worker has read it
(`save_total_limit` rotates old folders away when the next one is saved).
So `on_save` first hard-links the folder's files into
`<output_dir>/.lmc-archive-staging/checkpoint-<step>/` (no data is copied;
the links keep the files alive whatever the Trainer deletes) and the worker
reads that; the staging folder is removed once the step is archived, and
kept, as the only copy, if archiving fails.  Where hard links are not
possible (a file system without them), the worker reads the folder itself
and the callback waits for the worker before the Trainer's next save, so a
rotation can never remove a folder that is still being read.
"""
import errno
import os
import queue
import shutil
import tempfile
import threading

from transformers import TrainerCallback

from .archive import Archive

__all__ = ["LMCArchiveCallback"]

_STOP = object()
STAGING = ".lmc-archive-staging"


def _link_tree(src, dst):
    """Hard-link every file of the folder src into a new folder dst (same
    file system).  Returns False, leaving nothing behind, where links are
    not supported; other errors propagate."""
    try:
        for root, dirs, files in os.walk(src):
            rel = os.path.relpath(root, src)
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            for f in files:
                os.link(os.path.join(root, f), os.path.join(dst, rel, f))
        return True
    except OSError as e:
        shutil.rmtree(dst, ignore_errors=True)
        if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise


class LMCArchiveCallback(TrainerCallback):
    """Append every saved checkpoint to an lmc archive in a worker thread.

    archive: path of the archive (or an lmc.archive.Archive).
    keyframe_every: at most K steps per chain (bounds a restore); None (the default) keeps what an
        existing archive stores (a new one gets lmc.archive.DEFAULT_KEYFRAME_EVERY). A value that
        differs from the stored one is used for new steps, with a warning.
    delete_raw: remove the raw checkpoint folder once it is appended and its
        archived copy verified (safe beside the Trainer's save_total_limit: the
        worker reads hard-linked staging copies, see the module docstring).
    max_queue: checkpoints waiting for the worker; on_save blocks when full.
    threads: lmc threads of the worker (default: all cores).

    An error in the worker is re-raised at the next callback event (and at the
    end of training); checkpoints saved after an error are not archived.
    Only the main process (state.is_world_process_zero) archives.
    """

    def __init__(self, archive, keyframe_every=None, delete_raw=False, max_queue=2, threads=None):
        if not isinstance(archive, Archive):
            archive = Archive(archive, threads=threads)
        self.archive = archive
        if keyframe_every is not None:
            stored = archive.stored_keyframe_every()
            if stored is not None and stored != int(keyframe_every):
                import warnings
                warnings.warn(f"lmc-archive: {archive.path} stores keyframe_every={stored}; using "
                              f"{int(keyframe_every)} for the steps added from now on, as asked "
                              "(leave keyframe_every=None to keep the archive's)", stacklevel=2)
            self.archive.keyframe_every = int(keyframe_every)
        self.delete_raw = bool(delete_raw)
        self.max_queue = int(max_queue)
        if self.max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        self._queue = None
        self._thread = None
        self._error = None
        self._lock = threading.Lock()
        self._unstaged = 0  # queued folders read in place (no hard links): drained before the next save
        self._prev_staged = None  # the last archived step's staged links (the next step's reference)
        self.archived = []  # steps appended so far

    # -- worker
    def _start(self):
        if self._thread is None:
            self._queue = queue.Queue(self.max_queue)
            self._thread = threading.Thread(target=self._work, name="lmc-archive", daemon=True)
            self._thread.start()

    def _work(self):
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:
                    self._archive(*item)
                elif item[2] is None:  # skipped after an error; a staged copy stays where it is
                    with self._lock:
                        self._unstaged -= 1
            except BaseException as e:  # handed to the training thread
                with self._lock:
                    if self._error is None:
                        self._error = e
            finally:
                self._queue.task_done()

    def _archive(self, folder, step, staged):
        # the previous step's staged links are the reference folder (its tensors, checksum-matched, spare
        # decoding them from the archive); they are kept until this step is in
        prev = self._prev_staged if staged and self._prev_staged and os.path.isdir(self._prev_staged) else None
        try:
            if step not in self.archive.steps():
                self.archive.add(staged or folder, step, reference_folder=prev if staged else "auto")
            self.archived.append(step)
            if self.delete_raw:
                self.archive.check_step(step)
                shutil.rmtree(folder, ignore_errors=True)  # the Trainer may have rotated it away already
        except BaseException as e:
            if staged:  # the staged links may be the only copy left: keep them, and say where
                raise RuntimeError(f"{type(e).__name__}: {e} (checkpoint {step} kept in {staged})") from e
            raise
        finally:
            if not staged:
                with self._lock:
                    self._unstaged -= 1
        if staged:
            self._drop_staged()
            self._prev_staged = staged

    def _drop_staged(self):
        if self._prev_staged is not None:
            shutil.rmtree(self._prev_staged, ignore_errors=True)
            try:
                os.rmdir(os.path.dirname(self._prev_staged))  # the staging folder, once empty
            except OSError:
                pass
            self._prev_staged = None

    def _raise_pending(self):
        with self._lock:
            e, self._error = self._error, None
        if e is not None:
            raise RuntimeError(f"lmc-archive worker failed: {type(e).__name__}: {e}") from e

    def drain(self):
        """Wait until every queued checkpoint is archived; re-raise a worker error."""
        if self._thread is not None:
            self._queue.join()
        self._raise_pending()

    def close(self):
        """Drain and stop the worker thread."""
        if self._thread is not None:
            self._queue.join()
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        self._drop_staged()  # an archived step's links (a failed step's are never dropped)
        self._raise_pending()

    # -- TrainerCallback events
    def on_save(self, args, state, control, **kwargs):
        self._raise_pending()
        if not state.is_world_process_zero:
            return
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(folder):
            raise RuntimeError(f"lmc-archive: saved checkpoint folder {folder} not found")
        self._start()
        root = os.path.join(args.output_dir, STAGING)
        os.makedirs(root, exist_ok=True)
        staged = tempfile.mkdtemp(prefix=f"checkpoint-{state.global_step}-", dir=root)
        if not _link_tree(folder, staged):  # (removes staged then)
            staged = None
            try:
                os.rmdir(root)
            except OSError:
                pass
            with self._lock:
                self._unstaged += 1
        self._queue.put((folder, state.global_step, staged))  # blocks while the queue is full

    def on_step_end(self, args, state, control, **kwargs):
        self._raise_pending()
        if self._unstaged and getattr(control, "should_save", False):
            self.drain()  # the save (and rotation) comes next: let the worker finish reading in place

    def on_log(self, args, state, control, **kwargs):
        self._raise_pending()

    def on_evaluate(self, args, state, control, **kwargs):
        self._raise_pending()

    def on_epoch_end(self, args, state, control, **kwargs):
        self._raise_pending()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()
