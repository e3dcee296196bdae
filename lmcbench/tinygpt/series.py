"""The cached tinygpt series: a folder keyed by a hash of the training options and the corpus, trained once and
reused.

Both ``source=tinygpt`` (:class:`lmcbench.sources.tinygpt.TinyGPTSource`) and the ExCP experiment resolve a
series here, so the experiment needs nothing from the sources layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass

from lmc.formats.trainer_folder import list_checkpoints, parse_steps
from .corpus import NAME as CORPUS_NAME
from .corpus import SHA256 as CORPUS_SHA256
from .config import TrainConfig
from .trainer import train

FORMAT_VERSION = 1


def default_cache_dir() -> str:
    return os.environ.get("LMCBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lmcbench")


def series_key(opts: dict) -> str:
    """The hash of the (checked) training options, the format version and the corpus' SHA-256
    (:data:`CORPUS_SHA256`, recorded in :mod:`lmcbench.tinygpt.corpus`): a series trained on another corpus
    never shares a folder."""
    key = {**opts, "v": FORMAT_VERSION, "corpus": CORPUS_SHA256}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def series_folder(opts: dict, cache_dir=None) -> str:
    """``<cache>/tinygpt-<key>``: the folder of :func:`series_key` under the cache."""
    key = series_key(opts)
    root = os.path.expanduser(str(cache_dir)) if cache_dir else default_cache_dir()
    return os.path.join(root, f"tinygpt-{key}")


def ensure_series(folder: str, opts: dict) -> str:
    """Train and write the series into ``folder`` unless a complete one is there. Processes that need the same
    missing series at once (the jobs of a sweep) take turns on a lock beside it: one trains, the others wait
    and reuse what it wrote."""
    marker = os.path.join(folder, "lmcbench_series.json")
    if os.path.exists(marker):
        return folder
    parent = os.path.dirname(folder) or "."
    os.makedirs(parent, exist_ok=True)
    with _exclusive(os.path.join(parent, f".{os.path.basename(folder)}.lock")):
        if os.path.exists(marker):  # written by another process while this one waited
            return folder
        tmp = f"{folder}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            info = train(tmp, opts)
            with open(os.path.join(tmp, "lmcbench_series.json"), "w") as f:
                json.dump({"options": {k: list(v) if isinstance(v, tuple) else v for k, v in opts.items()},
                           "corpus": {"name": CORPUS_NAME, "sha256": CORPUS_SHA256}, **info}, f, indent=1)
            if os.path.exists(folder):  # an incomplete earlier attempt
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


@contextmanager
def _exclusive(path: str):
    """An exclusive ``flock`` on ``path`` (created, and left for the next process) while the block runs; where
    there is no ``fcntl`` (Windows), no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass
class Series:
    """One tinygpt series: its checked training options, its folder and the selected steps (None: all)."""

    train_opts: dict
    path: str
    steps: list[int] | None = None

    @classmethod
    def from_options(cls, cache_dir=None, train=None, path=None, steps=None) -> "Series":
        """The series that ``source.cache_dir``, ``source.train``, ``source.path`` and ``source.steps`` name."""
        opts = TrainConfig.from_options(train).to_dict()
        folder = os.path.abspath(os.path.expanduser(str(path or series_folder(opts, cache_dir))))
        return cls(opts, folder, parse_steps(steps))

    def ensure(self) -> str:
        return ensure_series(self.path, self.train_opts)

    def checkpoints(self) -> list[tuple[int, str]]:
        """``[(step, folder)]`` of every checkpoint in the folder (the selection in ``steps`` not applied)."""
        return list_checkpoints(self.path)
