"""A source's index entries (:class:`TensorEntry`), the tensors it loads (:class:`TensorRecord`) and the base
class :class:`Source`: selection (steps, kinds, include/exclude, casts, a shard) and tensor-major iteration."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from lmc.formats.tensors import KINDS, TensorRef, load_checked
from lmc.formats.trainer_folder import parse_steps
from ..dtypes import dtype_name, resolve
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


def unique(entries: list[TensorEntry]) -> list[TensorEntry]:
    """``entries``, checked: a tensor (name and kind) twice at one step is a one-line error naming the file."""
    seen = set()
    for e in entries:
        if e.name and (e.step, e.key) in seen:
            raise SourceError(f"{e.file}: tensor {e.name!r} ({e.kind}) appears twice at step {e.step}")
        seen.add((e.step, e.key))
    return entries
