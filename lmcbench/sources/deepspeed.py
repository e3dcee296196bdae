"""DeepSpeed checkpoints as a source: ``global_step<N>/`` folders written by ``engine.save_checkpoint`` (ZeRO
stages 0-3; GPT-NeoX's pipeline layout too), one step per folder, the step parsed from the folder name.

``source.path`` is a folder of ``global_step<N>/`` folders (the ``latest`` file and anything that is not a
checkpoint folder are ignored), one such folder, or a glob of them. The format (which file holds what, the flat
fp32 partitions cut back into named parameters, the safe loading) is :mod:`lmc.formats.deepspeed`;
``source.trust_pickle=true`` lets it unpickle files that need classes other than DeepSpeed's plain-value ones.
"""

from __future__ import annotations

import re

from lmc.formats.deepspeed import NEEDS, DeepSpeedReader, deepspeed_format, deepspeed_refs
from ..errors import ConfigError
from .base import unique
from .pattern import PatternSource

_CHECKPOINT_NAME = re.compile(r"^global_step\d+$")


class DeepSpeedSource(PatternSource):
    source_type = "deepspeed"

    usage = "source.path=DIR or GLOB (a folder of DeepSpeed global_step<N>/ folders, one of them, or a glob)"

    def __init__(self, trust_pickle=False, **kw):
        super().__init__(**kw)
        if not isinstance(trust_pickle, bool):
            raise ConfigError(f"source.trust_pickle: expected true or false, got {trust_pickle!r}")
        self.reader = DeepSpeedReader(trust_pickle)

    def folders(self) -> list[tuple[int, str]]:
        """``[(step, checkpoint folder)]`` in step order."""
        return self.step_folders(deepspeed_format, _CHECKPOINT_NAME, "DeepSpeed", NEEDS)

    def _index(self):
        return unique(self._index_steps(self.folders(), lambda d: deepspeed_refs(d, self.reader)))
