"""lmc: lossless compression codec for LLM checkpoint tensors.

>>> import numpy as np, lmc
>>> x = np.arange(10, dtype=np.float32)
>>> np.array_equal(lmc.decompress(lmc.compress(x)), x)
True

The package in layers, each importing only the ones below it (``tests/test_layers.py`` checks it, imports inside
functions too):

1. the codec: :mod:`lmc.api` (this package's names) over :mod:`lmc.kernels` (the Numba kernels, one module per
   coder); it imports nothing of what follows, so the codec alone needs numpy and numba only;
2. :mod:`lmc.storage` (the one atomic write: file fsync, rename, folder fsync; the object-store commit) and
   :mod:`lmc.chains` (the default chain length both writers share: a constant below both, so neither imports
   the other for it), :mod:`lmc.worker` (the per-phase timers and per-thread buffers both writers' worker
   threads use) and :mod:`lmc.memory`;
3. :mod:`lmc.formats`: the checkpoint formats, read and written; it takes an LMC DCP reader from its caller
   rather than import :mod:`lmc.dcp`;
4. :mod:`lmc.archive` and :mod:`lmc.dcp`, two packages side by side that never import each other;
5. :mod:`lmc.hf`, the Trainer callback over the archive.
"""
from .api import FormatError, OutputLimitError, compress, decompress, info, shaped

__version__ = "0.3.6"
__all__ = ["compress", "decompress", "info", "shaped", "FormatError", "OutputLimitError", "__version__"]
