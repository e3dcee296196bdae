"""PyTorch Distributed Checkpoint folders as a source: plain ``FileSystemWriter`` output and LMC-coded ones
(``lmc.dcp``), one step per folder, the step parsed from the folder name by a regular expression.

``source.path`` is a folder of checkpoint folders (``step-<N>/``, ``checkpoint-<N>/``, any subfolder with DCP
metadata), one checkpoint folder, or a glob of checkpoint folders. The format (metadata, kinds from FQNs,
reading a tensor) is :mod:`lmc.formats.dcp`; :func:`lmc.dcp.dcp_refs` reads both kinds of folder.
"""

from __future__ import annotations

import re

from lmc.formats.dcp import LMC_METADATA, PLAIN_METADATA, dcp_format
from .base import unique
from .pattern import PatternSource

_CHECKPOINT_NAME = re.compile(r"^(step|checkpoint)[-_]?\d+$")


class DCPSource(PatternSource):
    source_type = "dcp"

    usage = ("source.path=DIR or GLOB (DCP checkpoint folders, e.g. 'ckpts/step-*' or a folder of step-<N>/ "
             "folders)")

    def folders(self) -> list[tuple[int, str]]:
        """``[(step, checkpoint folder)]`` in step order."""
        return self.step_folders(lambda d: dcp_format(d) is not None, _CHECKPOINT_NAME, "DCP",
                                 f"{PLAIN_METADATA} or {LMC_METADATA}")

    def _index(self):
        from lmc.dcp import dcp_refs  # lmc.dcp needs torch at import: imported when a folder is read

        return unique(self._index_steps(self.folders(), dcp_refs))
