"""Sampled measurement (``bench.sample < 1``): which slices of which tensors a run measures.

The sampling *unit* is a slice of one tensor: by default (``sample_slice_kib: 0``) the slice a full run
measures (``chunk_mib``: a whole tensor up to 16 MiB), so a sampled unit is compressed exactly as a full run
compresses it and the estimate has no slicing bias; ``sample_slice_kib`` sets a smaller unit (the tensor's last
slice, and a tensor smaller than a slice, is shorter). The units are cut from the index (:meth:`Source.entries` gives every
tensor's shape and dtype) before anything is read, and put in *strata*: the tensor kind, the measured dtype (a
cast's target) and the tensor's *role*: its name with the layer numbers taken out (``h.3.mlp.c_fc.weight`` ->
``h.#.mlp.c_fc.weight``) and its shape. Tensors of one role are alike across layers and tensors of different
roles are not (an embedding's rows of unused tokens, a LayerNorm's ones), so a stratum per role takes the
differences between roles out of the sampling error, and a tensor of a role of its own is always measured.
Where a role spans 3 layers or more, its first layer (the first dotted number of the name) is a stratum of its
own: it sits next to the embedding and is unlike the layers after it, and a sample of the role that leaves it out
cannot see that (on the 24M series, 5% samples: per-cell intervals held the ratio 96.1% of the time with the first
layer apart, 91.0% with it in its role's stratum; ``results/sampling``).
Each stratum of N units gets ``n = ceil(fraction x N)`` of them, at least 2 (so that the spread inside it can
be estimated; a stratum of one or two units is measured whole), chosen without replacement by a generator seeded
with ``sample_seed`` and the stratum's name, so the choice in one stratum does not move when another is added.
On a small model the floor of 2 measures more than the fraction (a 5% sample of the 24M series measures half of
its bytes: its roles have 6 tensors each, the first measured whole and 2 of the other 5); on a large one, where a role holds thousands of slices, the fraction is what is measured.

The plan is keyed by tensor and slice position, not by step: every step measures the same regions, so a
temporal pipeline compares a region with the same region of the previous step (its reference is that region of
the previous step's decoded tensor, which is all an elementwise delta reads).

Every unit of stratum h stands for ``N_h / n_h`` units: its ``sample_weight``. Sums of a sampled run are
estimated as the weighted sums of the measured ones (:func:`lmcbench.report.sampling.estimated`).

With ``sample_slice_kib`` set below the run's slice, a unit is compressed on its own where a full run
compresses a whole tensor (up to ``chunk_mib``) at once; a codec's per-call cost (headers, tables, an LZ window
that starts empty) is then paid per unit, a bias no interval from the sample can show (up to 0.8% for brotli on
byte planes of the 24M series, 0.00% for LMC and ZipNN, which code blocks of their own).
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

import numpy as np

from ..dtypes import dtype_name

# the columns a sampled run adds to records.csv (a run that measures everything writes none of them)
SAMPLE_COLUMNS = ["sample", "sample_seed", "sample_slice_kib", "slice", "slice_start", "stratum", "sample_weight"]
PLAN_COLUMNS = ["tensor", "kind", "dtype", "cast", "slice", "slice_start", "numel", "bytes", "stratum",
                "stratum_units", "stratum_sampled", "sample_weight", "selected"]


@dataclass(frozen=True)
class Unit:
    """One slice of one tensor: elements ``[start, end)`` of the flattened tensor."""

    key: tuple  # the tensor's TensorEntry.key (name, kind, cast)
    index: int  # position of the slice in the tensor (0, 1, ...)
    start: int
    end: int
    itemsize: int
    stratum: str

    @property
    def nbytes(self) -> int:
        return (self.end - self.start) * self.itemsize


def sample_size(fraction: float, units: int) -> int:
    """How many of a stratum's ``units`` a sample takes: ceil(fraction x units), at least 2, at most all."""
    if units <= 2:
        return units
    return min(units, max(2, math.ceil(round(fraction * units, 9))))


_LAYER = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


def role(name: str, shape) -> str:
    """A tensor's role: its name with every dotted number (a layer's index) replaced by ``#``, and its shape."""
    return f"{_LAYER.sub('#', name)}[{'x'.join(map(str, shape))}]"


_FIRST_NUMBER = re.compile(r"(?:(?<=\.)|^)(\d+)(?=\.|$)")


def layer_of(name: str) -> int | None:
    """The layer a tensor belongs to: the first dotted number of its name (``h.3.mlp.c_fc.weight`` -> 3; an
    expert's number after it is not its layer); None without one."""
    m = _FIRST_NUMBER.search(name)
    return int(m.group(1)) if m else None


def choose(strata, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """For units labelled by ``strata`` (in frame order): which ones a sample takes, and the weight N / n of
    each taken one (0 for the others). The draw in a stratum depends only on the seed and its name."""
    names, codes = np.unique(np.asarray(strata, dtype=str), return_inverse=True)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    chosen = np.zeros(len(codes), bool)
    weight = np.zeros(len(codes))
    for name, a, b in zip(names, bounds[:-1], bounds[1:]):
        idx = order[a:b]  # the stratum's units, in frame order
        n = sample_size(fraction, len(idx))
        rng = np.random.default_rng([int(seed), zlib.crc32(str(name).encode())])
        picks = idx[rng.choice(len(idx), size=n, replace=False)]
        chosen[picks] = True
        weight[picks] = len(idx) / n
    return chosen, weight


def _measured_dtype(e) -> np.dtype:
    return np.dtype(e.cast[1] if e.cast is not None else e.dtype)


def _cast_label(cast) -> str:
    return "" if cast is None else f"{dtype_name(cast[0])}->{dtype_name(cast[1])}"


class SamplePlan:
    """The units of every selected tensor, and which of them the sample measures."""

    def __init__(self, entries, fraction: float, seed: int, slice_kib: int, scope: str = ""):
        """``scope`` prefixes every stratum name: a shard's (``shard<i>of<n>:``), so that the shards of a
        split series, merged, keep their strata apart (each shard drew its own sample from its own units)."""
        self.fraction, self.seed, self.slice_kib = float(fraction), int(seed), int(slice_kib)
        slice_bytes = self.slice_kib * 1024
        numel: dict[tuple, int] = {}
        first: dict[tuple, object] = {}
        for e in entries:  # a tensor whose shape changes between steps is cut by its largest shape
            n = int(np.prod(e.shape, dtype=np.int64))
            numel[e.key] = max(numel.get(e.key, 0), n)
            first.setdefault(e.key, e)
        # a role's first layer is a stratum of its own where the role spans 3 layers or more: it sits next to the
        # embedding and is unlike the layers after it (results/sampling), which a sample of the role then misses
        names = {key: f"{scope}{e.kind}/{dtype_name(_measured_dtype(e))}/{role(e.name, e.shape)}"
                 for key, e in first.items()}
        layers: dict[str, set] = {}
        for key, name in names.items():
            layers.setdefault(name, set()).add(layer_of(first[key].name))
        self.frame: list[Unit] = []
        for key, n in numel.items():  # empty tensors hold no bytes: they are no unit
            e = first[key]
            dt = _measured_dtype(e)
            per = max(1, slice_bytes // dt.itemsize)
            stratum, seen = names[key], layers[names[key]] - {None}
            if len(seen) >= 3 and layer_of(e.name) == min(seen):
                stratum += "@first"
            self.frame.extend(Unit(key, i, b, min(n, b + per), dt.itemsize, stratum)
                              for i, b in enumerate(range(0, n, per)))
        picked, _ = choose([u.stratum for u in self.frame], self.fraction, self.seed)
        self.chosen: set[Unit] = {u for u, p in zip(self.frame, picked) if p}
        self.strata: dict[str, tuple[int, int]] = {}  # stratum -> (units, sampled)
        for u in self.frame:
            total, n = self.strata.get(u.stratum, (0, 0))
            self.strata[u.stratum] = (total + 1, n + (u in self.chosen))
        self._by_key: dict[tuple, list[Unit]] = {}
        for u in self.frame:
            if u in self.chosen:
                self._by_key.setdefault(u.key, []).append(u)

    def units(self, key) -> list[Unit]:
        """The sampled units of a tensor (by its ``TensorEntry.key``), in order; [] when none is sampled."""
        return self._by_key.get(key, [])

    def weight(self, stratum: str) -> float:
        """How many units of the stratum each sampled one stands for: N / n."""
        total, n = self.strata[stratum]
        return total / n

    def row_fields(self, u: Unit) -> dict:
        """The sample columns (:data:`SAMPLE_COLUMNS`) of the records of a unit."""
        return {"sample": self.fraction, "sample_seed": self.seed, "sample_slice_kib": self.slice_kib,
                "slice": u.index, "slice_start": u.start, "stratum": u.stratum,
                "sample_weight": round(self.weight(u.stratum), 9)}

    def plan_rows(self):
        """``sample.csv``: every unit of the frame, and whether the sample measures it."""
        for u in self.frame:
            total, n = self.strata[u.stratum]
            yield {"tensor": u.key[0], "kind": u.key[1], "dtype": u.stratum.split("/", 2)[1],
                   "cast": _cast_label(u.key[2]),
                   "slice": u.index, "slice_start": u.start, "numel": u.end - u.start, "bytes": u.nbytes,
                   "stratum": u.stratum, "stratum_units": total, "stratum_sampled": n,
                   "sample_weight": round(total / n, 9), "selected": u in self.chosen}

    def describe(self) -> dict:
        """What ``environment.json`` says of the sample."""
        total = sum(u.nbytes for u in self.frame)
        measured = sum(u.nbytes for u in self.chosen)
        return {"fraction": self.fraction, "seed": self.seed, "slice_kib": self.slice_kib,
                "units": len(self.frame), "sampled_units": len(self.chosen), "bytes_per_step": total,
                "sampled_bytes_per_step": measured, "strata": {k: list(v) for k, v in self.strata.items()}}
