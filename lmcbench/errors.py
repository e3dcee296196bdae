"""User-facing errors: one clear line, no traceback unless asked for (``LMCBENCH_DEBUG=1``)."""


class LmcbenchError(Exception):
    """An error caused by the input or the configuration, reported to the user as one line."""


class SourceError(LmcbenchError):
    """A checkpoint file or folder that cannot be read."""


class ConfigError(LmcbenchError):
    """An unknown or invalid configuration value."""


class NotApplicable(Exception):
    """A codec or transform that does not apply to a stream (e.g. a bf16-only codec on int8 data)."""
