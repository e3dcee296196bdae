"""Checkpoint series sources: each yields one tensor at a time, never a whole checkpoint.

A source first builds a cheap *index* of :class:`TensorEntry` (step, name, kind, dtype, shape and how to
load it) without reading tensor data, then loads tensors lazily, one at a time. Iteration is
*tensor-major*: every step of one tensor before the next tensor, so that a temporal transform only ever
keeps the previous step of the tensor it is working on. A source that can only hold one checkpoint at a time
(``hf_hub`` with ``delete_after``: each revision is downloaded, measured and deleted) sets ``step_major``: its
entries come checkpoint by checkpoint, and the runner keeps every tensor's previous steps instead (one
checkpoint's worth of memory per step of lag).
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from lmc.formats.tensors import KINDS, TensorRef, load_checked
from lmc.formats.trainer_folder import parse_steps
from ..dtypes import BFLOAT16, dtype_name, resolve
from ..errors import ConfigError, SourceError
from .shard import parse_shard, partition


@dataclass
class TensorEntry:
    step: int
    name: str
    kind: str
    dtype: np.dtype
    shape: tuple
    loader: Callable[[], np.ndarray] = field(repr=False, compare=False)
    file: str = ""
    cast: tuple | None = None  # (from dtype, to dtype) applied when loaded

    @classmethod
    def of(cls, step: int, ref: TensorRef) -> "TensorEntry":
        """The entry of a format reader's :class:`~lmc.formats.tensors.TensorRef` at ``step``."""
        return cls(step, ref.name, ref.kind, ref.dtype, ref.shape, ref.load, ref.file)

    @property
    def key(self) -> tuple:
        return (self.name, self.kind, self.cast)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class TensorRecord:
    """One tensor of one checkpoint, loaded: what the pipeline measures."""

    step: int
    name: str
    kind: str
    dtype: np.dtype
    shape: tuple
    array: np.ndarray = field(repr=False)
    cast: str = ""  # "" or e.g. "float32->bfloat16" when the source cast it


class Source:
    """Base class: subclasses implement :meth:`_index` (all entries, unfiltered)."""

    source_type = ""
    step_major = False  # entries step by step (every tensor of a checkpoint before the next checkpoint)

    def __init__(self, steps=None, include=None, exclude=None, kinds=None, cast=None, cast_kinds=None, shard=None,
                 **unknown):
        if unknown:
            raise ConfigError(f"source {self.source_type}: unknown option(s) {', '.join(sorted(unknown))}")
        self.steps = parse_steps(steps)
        # shard: "i/n" keeps part i of n disjoint parts of the selected tensors (:mod:`.shard`); null = all
        self.shard = parse_shard(shard)
        self.sharding: dict | None = None  # what entries() kept of the series, when sharded
        try:
            self.include = re.compile(include) if include else None
            self.exclude = re.compile(exclude) if exclude else None
        except re.error as e:
            raise ConfigError(f"source.include/exclude: bad regular expression: {e}") from None
        self.kinds = None if kinds is None else ([kinds] if isinstance(kinds, str) else list(kinds))
        for k in self.kinds or []:
            if k not in KINDS:
                raise ConfigError(f"source.kinds: unknown kind {k!r}; known: {', '.join(KINDS)}")
        # cast: null, one target ("bf16", "float32->bf16"), or a list of them (each tensor measured once per
        # entry: [null, bf16] gives the fp32 original and its bf16 cast as two series)
        casts = list(cast) if isinstance(cast, (list, tuple)) or type(cast).__name__ == "ListConfig" else [cast]
        self.casts = []
        for c in casts or [None]:
            if c is None or str(c).lower() in ("none", "null", ""):
                self.casts.append(None)
                continue
            src, _, dst = str(c).partition("->")
            if not dst:
                src, dst = "float32", src
            self.casts.append((resolve(src), resolve(dst)))
        # cast_kinds: the kinds a cast applies to (e.g. [weight]: bf16 weights beside fp32 Adam moments, which
        # are then measured once, as they are); null = every kind
        self.cast_kinds = None if cast_kinds is None else \
            ([cast_kinds] if isinstance(cast_kinds, str) else list(cast_kinds))
        for k in self.cast_kinds or []:
            if k not in KINDS:
                raise ConfigError(f"source.cast_kinds: unknown kind {k!r}; known: {', '.join(KINDS)}")

    # -- to implement -------------------------------------------------------------------------------------
    def _index(self) -> list[TensorEntry]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.source_type

    def finish(self) -> None:
        """Called by the runner once every entry was measured (never after an error): a source that holds
        something per checkpoint lets go of the last one here."""

    def _index_steps(self, located, refs) -> list[TensorEntry]:
        """The entries of ``located`` (``[(step, file or folder)]``): ``refs(where)`` (format readers'
        :class:`~lmc.formats.tensors.TensorRef` s) for the selected steps; the other steps are listed with a
        placeholder (name '') and never opened, so that a missing step can be named."""
        entries = []
        for step, where in located:
            if self.steps is not None and step not in self.steps:
                entries.append(TensorEntry(step, "", "weight", None, (), lambda: None, where))
            else:
                entries.extend(TensorEntry.of(step, r) for r in refs(where))
        return entries

    # -- selection and iteration --------------------------------------------------------------------------
    def entries(self) -> list[TensorEntry]:
        """The selected entries, grouped tensor-major (all steps of a tensor in step order), or step by step
        (each step's tensors in the same order) when :attr:`step_major` is set."""
        all_entries = self._index()
        if not any(e.name for e in all_entries) and self.steps is None:
            raise SourceError(f"{self.describe()}: no tensors found")
        have_steps = sorted({e.step for e in all_entries})
        if self.steps is not None:
            missing = sorted(set(self.steps) - set(have_steps))
            if missing:
                raise SourceError(f"{self.describe()}: step(s) {missing} not found; available: {have_steps}")
        sel = [e for e in all_entries
               if e.name and (self.steps is None or e.step in self.steps)
               and (self.kinds is None or e.kind in self.kinds)
               and (self.include is None or self.include.search(e.name))
               and (self.exclude is None or not self.exclude.search(e.name))]
        if not sel:
            raise SourceError(f"{self.describe()}: the selection (steps, include, kinds) matches no tensor")
        groups: OrderedDict[tuple, list[TensorEntry]] = OrderedDict()
        for e in sel:
            castable = self.cast_kinds is None or e.kind in self.cast_kinds
            for c in (self.casts if castable else [None]):  # a kind left out of cast_kinds: once, as it is
                if c is None:
                    groups.setdefault(e.key, []).append(e)
                elif e.dtype == c[0]:
                    v = replace(e, cast=c)
                    groups.setdefault(v.key, []).append(v)
        if self.shard is not None:
            groups = self._keep_shard(groups)
        out = []
        for g in groups.values():
            out.extend(sorted(g, key=lambda e: e.step))
        if self.step_major:
            out.sort(key=lambda e: e.step)  # stable: within a step, the tensor-major order of the tensors
        return out

    def _keep_shard(self, groups: OrderedDict) -> OrderedDict:
        """The tensors (all their steps) of shard ``i`` of ``n`` (:func:`.shard.partition`); records in
        :attr:`sharding` what was kept of how much."""
        i, n = self.shard
        if len(groups) < n:
            raise ConfigError(f"source.shard={i}/{n}: the selection has {len(groups)} tensor(s), fewer than {n} "
                              "shards; use at most that many")
        names = {_key_name(k): k for k in groups}
        sizes = {name: sum(e.nbytes for e in groups[k]) for name, k in names.items()}
        kept = partition(sizes, n)[i]
        self.sharding = {"index": i, "count": n, "tensors": len(kept), "series_tensors": len(groups),
                         "bytes": sum(sizes[k] for k in kept), "series_bytes": sum(sizes.values())}
        return OrderedDict((names[k], groups[names[k]]) for k in kept)

    def load(self, e: TensorEntry) -> TensorRecord:
        arr = load_checked(e.loader, e.name, e.dtype, e.shape, e.file, self.describe())
        cast = ""
        if e.cast is not None:
            arr = arr.astype(e.cast[1])
            cast = f"{dtype_name(e.cast[0])}->{dtype_name(e.cast[1])}"
        return TensorRecord(e.step, e.name, e.kind, arr.dtype, tuple(arr.shape), arr, cast)

    def __iter__(self) -> Iterator[TensorRecord]:
        for e in self.entries():
            yield self.load(e)


def _key_name(key: tuple) -> str:
    """A tensor key (name, kind, cast) as text, the same in every process (the shard partition sorts on it)."""
    name, kind, cast = key
    return f"{name}|{kind}" + (f"|{dtype_name(cast[0])}->{dtype_name(cast[1])}" if cast else "")


_SOURCES: dict[str, str] = {
    "hf_trainer": "lmcbench.sources.hf_trainer:HFTrainerSource",
    "files": "lmcbench.sources.files:FilesSource",
    "dcp": "lmcbench.sources.dcp:DCPSource",
    "deepspeed": "lmcbench.sources.deepspeed:DeepSpeedSource",
    "tinygpt": "lmcbench.sources.tinygpt:TinyGPTSource",
    "hf_hub": "lmcbench.sources.hf_hub:HFHubSource",
}


STEP_REGEX = r"(\d+)(?!.*\d)"  # the last integer in a name


def compile_step_regex(pattern) -> re.Pattern:
    """``source.step_regex`` compiled, or a one-line error."""
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as e:
        raise ConfigError(f"source.step_regex: bad regular expression: {e}") from None


def parse_step(regex: re.Pattern, name: str, where: str, what: str) -> int:
    """The step ``regex`` finds in ``name`` (its first group, else the whole match), or a one-line error naming
    ``where`` (``what``: what the name is, e.g. "file name")."""
    m = regex.search(name)
    if not m:
        raise SourceError(f"{where}: no step in the {what} (source.step_regex={regex.pattern!r})")
    try:
        return int(m.group(1) if m.groups() else m.group(0))
    except ValueError:
        raise SourceError(f"{where}: step_regex matched {m.group(0)!r}, not an integer") from None


class PatternSource(Source):
    """A source given by ``path`` (a glob, file or folder) with the step taken from each name by ``step_regex``
    (the last integer in the name by default)."""

    usage = "source.path=GLOB"

    def __init__(self, path=None, step_regex=STEP_REGEX, **kw):
        super().__init__(**kw)
        if not path:
            raise SourceError(f"source={self.source_type} needs {self.usage}")
        self.pattern = os.path.expanduser(str(path))
        self.step_regex = compile_step_regex(step_regex)

    def describe(self):
        return self.pattern

    def step_of(self, path: str, what: str = "file") -> int:
        """The step in ``path``'s last name, or a one-line error naming the path."""
        return parse_step(self.step_regex, os.path.basename(os.path.normpath(path)), path, f"{what} name")

    def step_folders(self, complete: Callable[[str], bool], name_re, what: str, needs: str) -> list[tuple[int, str]]:
        """``[(step, checkpoint folder)]`` in step order from ``path``: one checkpoint folder, a folder of them
        (its subfolders that are ``complete``; one whose name matches ``name_re`` but is not is an error, an
        interrupted save), or a glob of checkpoint folders. ``what`` names the format, ``needs`` what a complete
        folder holds."""
        import glob

        p = self.pattern
        if os.path.isdir(p) and complete(p):
            dirs = [p]
        elif os.path.isdir(p):
            dirs = []
            for name in sorted(os.listdir(p)):
                sub = os.path.join(p, name)
                if not os.path.isdir(sub):
                    continue
                if complete(sub):
                    dirs.append(sub)
                elif name_re.match(name):
                    raise SourceError(f"{sub}: not a complete {what} checkpoint (no {needs}: an interrupted save?)")
            if not dirs:
                raise SourceError(f"{p}: no {what} checkpoint folders in it (folders with {needs})")
        else:
            dirs = sorted(glob.glob(p, recursive=True))
            if not dirs:
                raise SourceError(f"{p}: no such folder, and no folders match")
            for d in dirs:
                if not os.path.isdir(d) or not complete(d):
                    raise SourceError(f"{d}: not a complete {what} checkpoint folder (no {needs})")
        out = sorted((self.step_of(d, "folder"), d) for d in dirs)
        for (s1, d1), (s2, d2) in zip(out, out[1:]):
            if s1 == s2:
                raise SourceError(f"{d1} and {d2} are both step {s1} (source.step_regex="
                                  f"{self.step_regex.pattern!r})")
        return out


def unique(entries: list[TensorEntry]) -> list[TensorEntry]:
    """``entries``, checked: a tensor (name and kind) twice at one step is a one-line error naming the file."""
    seen = set()
    for e in entries:
        if e.name and (e.step, e.key) in seen:
            raise SourceError(f"{e.file}: tensor {e.name!r} ({e.kind}) appears twice at step {e.step}")
        seen.add((e.step, e.key))
    return entries


def get_source(config) -> Source:
    """Instantiate a source from its config (``type`` selects the class, the rest are its options)."""
    import importlib

    cfg = dict(config)
    st = cfg.pop("type", None)
    if st not in _SOURCES:
        raise ConfigError(f"unknown source type {st!r}; known: {', '.join(sorted(_SOURCES))}")
    mod, _, cls = _SOURCES[st].partition(":")
    return getattr(importlib.import_module(mod), cls)(**cfg)


__all__ = ["TensorEntry", "TensorRecord", "Source", "get_source", "KINDS", "BFLOAT16"]
