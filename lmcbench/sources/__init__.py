"""Checkpoint series sources: each yields one tensor at a time, never a whole checkpoint.

A source first builds a cheap *index* of :class:`TensorEntry` (step, name, kind, dtype, shape and how to
load it) without reading tensor data, then loads tensors lazily, one at a time. Iteration is
*tensor-major*: every step of one tensor before the next tensor, so that a temporal transform only ever
keeps the previous step of the tensor it is working on. A source that can only hold one checkpoint at a time
(``hf_hub`` with ``delete_after``: each revision is downloaded, measured and deleted) sets ``step_major``: its
entries come checkpoint by checkpoint, and the runner keeps every tensor's previous steps instead (one
checkpoint's worth of memory per step of lag).

Modules: :mod:`.base` (entries, records and the base class), :mod:`.pattern` (sources given by a path
pattern), :mod:`.registry` (the types by name) and one module per source type.
"""

from lmc.formats.tensors import KINDS
from ..dtypes import BFLOAT16
from .base import Source, TensorEntry, TensorRecord, _key_name, unique  # noqa: F401 - _key_name, unique: as before
from .pattern import STEP_REGEX, PatternSource, compile_step_regex, parse_step  # noqa: F401 - as before
from .registry import _SOURCES, get_source  # noqa: F401 - _SOURCES: as before

__all__ = ["TensorEntry", "TensorRecord", "Source", "get_source", "KINDS", "BFLOAT16"]
