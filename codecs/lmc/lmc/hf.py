"""Hugging Face Trainer integration: archive every checkpoint as it is saved.

    from lmc.hf import LMCArchiveCallback
    trainer = Trainer(..., callbacks=[LMCArchiveCallback("run.lmca")])

`on_save` hands the new `checkpoint-<step>` folder to a background thread
that appends it to an lmc archive (lmc.archive) while training continues.
Needs `transformers` (extra `lmc[hf]`).
"""
import os
import queue
import shutil
import threading

from transformers import TrainerCallback

from .archive import Archive

__all__ = ["LMCArchiveCallback"]

_STOP = object()


class LMCArchiveCallback(TrainerCallback):
    """Append every saved checkpoint to an lmc archive in a worker thread.

    archive: path of the archive (or an lmc.archive.Archive).
    keyframe_every: a keyframe every K steps (bounds the restore chain).
    delete_raw: remove the raw checkpoint folder once it is appended and its
        archived copy verified (the Trainer's own save_total_limit rotation may
        otherwise delete a folder the worker has not read yet: leave it unset).
    max_queue: checkpoints waiting for the worker; on_save blocks when full.
    threads: lmc threads of the worker (default: all cores).

    An error in the worker is re-raised at the next callback event (and at the
    end of training); checkpoints saved after an error are not archived.
    Only the main process (state.is_world_process_zero) archives.
    """

    def __init__(self, archive, keyframe_every=10, delete_raw=False, max_queue=2, threads=None):
        if isinstance(archive, Archive):
            self.archive = archive
            if keyframe_every is not None:
                self.archive.keyframe_every = keyframe_every
        else:
            self.archive = Archive(archive, keyframe_every=keyframe_every, threads=threads)
        self.delete_raw = bool(delete_raw)
        self.max_queue = int(max_queue)
        if self.max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        self._queue = None
        self._thread = None
        self._error = None
        self._lock = threading.Lock()
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
            except BaseException as e:  # handed to the training thread
                with self._lock:
                    if self._error is None:
                        self._error = e
            finally:
                self._queue.task_done()

    def _archive(self, folder, step):
        if step not in self.archive.steps():
            self.archive.add(folder, step)
        self.archived.append(step)
        if self.delete_raw:
            self.archive.check_step(step)
            shutil.rmtree(folder)

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
        self._queue.put((folder, state.global_step))  # blocks while the queue is full

    def on_step_end(self, args, state, control, **kwargs):
        self._raise_pending()

    def on_log(self, args, state, control, **kwargs):
        self._raise_pending()

    def on_evaluate(self, args, state, control, **kwargs):
        self._raise_pending()

    def on_epoch_end(self, args, state, control, **kwargs):
        self._raise_pending()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()
