"""The formats layer's errors: one clear line naming the file or the value.

lmcbench's errors are these classes (``lmcbench.errors``: ``LmcbenchError`` is :class:`InputError`), so an
error a reader raises is caught and printed as one line by lmcbench's commands like any of its own; lmc imports
nothing of lmcbench.
"""


class InputError(Exception):
    """An error caused by the input or a setting (a file, a folder, a value), reported to the user as one line."""


class SourceError(InputError):
    """A checkpoint file or folder that cannot be read."""


class ConfigError(InputError, ValueError):
    """An unknown or invalid value (a step list, a dtype name...)."""
