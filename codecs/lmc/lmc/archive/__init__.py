"""lmc.archive: a checkpoint series archive.  Every tensor is coded with lmc
against the same tensor of the previous step (a keyframe every K steps);
every other file is kept byte for byte.  Format: ARCHIVE.md.

>>> from lmc.archive import Archive                       # doctest: +SKIP
>>> a = Archive("run.lmca"); a.add("run/checkpoint-100")  # doctest: +SKIP
>>> a.restore(100, "restored/checkpoint-100")             # doctest: +SKIP
"""
from ..chains import DEFAULT_KEYFRAME_EVERY
from ._archive import Archive, VerifyResult, step_folders
from ._cli import main
from ._manifest import ArchiveError

__all__ = ["Archive", "ArchiveError", "VerifyResult", "DEFAULT_KEYFRAME_EVERY", "main", "step_folders"]
