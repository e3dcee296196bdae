"""lmcbench: how small can LLM checkpoints get, how fast, and what does it cost.

The pipeline: a *source* yields one tensor of a checkpoint series at a time, a *pipeline* of invertible
transforms turns it into byte streams, a *codec* compresses each stream, and every measurement is verified
bit-exact and appended to a tidy ``records.csv``.
"""

__version__ = "0.1.0"

from .errors import LmcbenchError  # noqa: E402,F401
