"""Codec wrappers behind one interface that follows numcodecs' contract.

Every codec has a ``codec_id``, ``encode(buf) -> bytes``, ``decode(buf, out=None)``, ``get_config()``
returning exactly its constructor's arguments plus ``id``, ``from_config(cfg)``, and is found in a registry.
A codec config in ``conf/codec/`` equals its ``get_config()``, so any row of the results can be replayed.

``encode`` receives a contiguous numpy array (the caller's buffer: never modified) and returns bytes;
``decode`` returns the decoded bytes as a ``uint8`` array (or fills ``out``). Dtype-aware codecs read the
array's dtype; byte codecs read its bytes.

Modules: :mod:`.base` (the base class), :mod:`.registry` (codecs by id), :mod:`.basic`, :mod:`.peers` and
:mod:`.lmc` (the wrappers).
"""

from ..errors import NotApplicable
from .base import Codec
from .registry import available_codecs, get_codec, get_codec_class, register_codec

__all__ = ["Codec", "register_codec", "get_codec", "get_codec_class", "available_codecs", "NotApplicable"]
