"""PyTorch Distributed Checkpoint folders as a source: plain ``FileSystemWriter`` output and LMC-coded ones
(``lmc.dcp``), one step per folder, the step parsed from the folder name by a regular expression.

``source.path`` is a folder of checkpoint folders (``step-<N>/``, ``checkpoint-<N>/``, any subfolder with DCP
metadata), one checkpoint folder, or a glob of checkpoint folders. The format (metadata, kinds from FQNs,
reading a tensor) is :mod:`lmcbench.checkpoints.dcp`.
"""

from __future__ import annotations

import glob
import os
import re

from ..checkpoints.dcp import LMC_METADATA, PLAIN_METADATA, dcp_format, dcp_refs
from ..errors import SourceError
from . import PatternSource

_CHECKPOINT_NAME = re.compile(r"^(step|checkpoint)[-_]?\d+$")


class DCPSource(PatternSource):
    source_type = "dcp"

    usage = ("source.path=DIR or GLOB (DCP checkpoint folders, e.g. 'ckpts/step-*' or a folder of step-<N>/ "
             "folders)")

    def folders(self) -> list[tuple[int, str]]:
        """``[(step, checkpoint folder)]`` in step order."""
        p = self.pattern
        if os.path.isdir(p) and dcp_format(p):
            dirs = [p]
        elif os.path.isdir(p):
            dirs = []
            for name in sorted(os.listdir(p)):
                sub = os.path.join(p, name)
                if not os.path.isdir(sub):
                    continue
                if dcp_format(sub):
                    dirs.append(sub)
                elif _CHECKPOINT_NAME.match(name):
                    raise SourceError(f"{sub}: not a complete DCP checkpoint (no {PLAIN_METADATA} or "
                                      f"{LMC_METADATA}: an interrupted save?)")
            if not dirs:
                raise SourceError(f"{p}: no DCP checkpoint folders in it (folders with {PLAIN_METADATA} or "
                                  f"{LMC_METADATA})")
        else:
            dirs = sorted(glob.glob(p, recursive=True))
            if not dirs:
                raise SourceError(f"{p}: no such folder, and no folders match")
            for d in dirs:
                if not os.path.isdir(d) or not dcp_format(d):
                    raise SourceError(f"{d}: not a complete DCP checkpoint folder (no {PLAIN_METADATA} or "
                                      f"{LMC_METADATA})")
        out = sorted((self.step_of(d, "folder"), d) for d in dirs)
        for (s1, d1), (s2, d2) in zip(out, out[1:]):
            if s1 == s2:
                raise SourceError(f"{d1} and {d2} are both step {s1} (source.step_regex="
                                  f"{self.step_regex.pattern!r})")
        return out

    def _index(self):
        entries = self._index_steps(self.folders(), dcp_refs)
        seen = set()
        for e in entries:
            if e.name and (e.step, e.key) in seen:
                raise SourceError(f"{e.file}: tensor {e.name!r} ({e.kind}) appears twice at step {e.step}")
            seen.add((e.step, e.key))
        return entries
