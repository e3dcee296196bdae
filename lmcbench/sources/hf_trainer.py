"""Hugging Face Trainer output folders as a source: ``checkpoint-<step>/`` with weights and ``optimizer.pt``.

The format (weight files, shards, optimizer slots and their names) is read by
:mod:`lmc.formats.trainer_folder`; this turns it into a series of tensors. RNG, scheduler,
trainer-state and training-args files are skipped (``training_args.bin`` is a pickle and is never opened).
"""

from __future__ import annotations

import os

from lmc.formats.trainer_folder import OPTIMIZER_FILE, folder_optimizer_refs, list_checkpoints, weight_refs
from ..errors import SourceError
from .base import Source


def checkpoint_refs(d: str, kinds=None) -> list:
    """The tensors of one Trainer checkpoint folder ``d``: its weights and, when it has an ``optimizer.pt`` and
    ``kinds`` (None = all) wants more than weights, the optimizer's per-parameter tensors."""
    weights, order = weight_refs(d)
    if os.path.exists(os.path.join(d, OPTIMIZER_FILE)) and (kinds is None or set(kinds) - {"weight"}):
        return weights + folder_optimizer_refs(d, weights, order)
    return weights


class HFTrainerSource(Source):
    source_type = "hf_trainer"

    def __init__(self, path=None, **kw):
        super().__init__(**kw)
        if not path:
            raise SourceError("source=hf_trainer needs source.path=DIR (a Trainer output folder)")
        self.path = os.path.abspath(os.path.expanduser(str(path)))

    def describe(self):
        return self.path

    def checkpoints(self) -> list[tuple[int, str]]:
        return list_checkpoints(self.path)

    def _index(self):
        return self._index_steps(self.checkpoints(), self._refs)

    def _refs(self, d):
        return checkpoint_refs(d, self.kinds)
