"""lmc: lossless compression codec for LLM checkpoint tensors.

>>> import numpy as np, lmc
>>> x = np.arange(10, dtype=np.float32)
>>> np.array_equal(lmc.decompress(lmc.compress(x)), x)
True
"""
from .api import FormatError, OutputLimitError, compress, decompress, info, shaped

__version__ = "0.3.6"
__all__ = ["compress", "decompress", "info", "shaped", "FormatError", "OutputLimitError", "__version__"]
