"""User-facing errors: one clear line, no traceback unless asked for (``LMCBENCH_DEBUG=1``).

The base and the two commonest ones are the formats layer's (:mod:`lmc.formats.errors`), which reads every
checkpoint format for lmcbench as for the ``lmc`` product: a reader's error is an ``LmcbenchError`` here.
"""

from lmc.formats.errors import ConfigError, SourceError  # noqa: F401 - re-exported
from lmc.formats.errors import InputError as LmcbenchError  # noqa: F401


class NotApplicable(Exception):
    """A codec or transform that does not apply to a stream (e.g. a bf16-only codec on int8 data)."""
