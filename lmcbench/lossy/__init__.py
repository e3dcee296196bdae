"""Lossy checkpoint codecs (kept apart from the lossless pipeline: their output is not bit-exact)."""

from . import excp
from .excp import *  # noqa: F403 - the ExCP API, exactly the names in excp.__all__

__all__ = sorted(excp.__all__)
