"""Sources given by a path pattern, with the step taken from each name by a regular expression
(:class:`PatternSource`, the base of the files, DCP and DeepSpeed sources)."""

from __future__ import annotations

import os
import re
from typing import Callable

from ..errors import ConfigError, SourceError
from .base import Source

STEP_REGEX = r"(\d+)(?!.*\d)"  # the last integer in a name


def compile_step_regex(pattern) -> re.Pattern:
    """``source.step_regex`` compiled, or a one-line error."""
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as e:
        raise ConfigError(f"source.step_regex: bad regular expression: {e}") from None


def parse_step(regex: re.Pattern, name: str, where: str, what: str) -> int:
    """The step ``regex`` finds in ``name`` (its first group, else the whole match), or a one-line error naming
    ``where`` (``what``: what the name is, e.g. "file name")."""
    m = regex.search(name)
    if not m:
        raise SourceError(f"{where}: no step in the {what} (source.step_regex: {regex.pattern}; on the command line "
                          f"quote the value twice: 'source.step_regex=\"...\"')")
    try:
        return int(m.group(1) if m.groups() else m.group(0))
    except ValueError:
        raise SourceError(f"{where}: step_regex matched {m.group(0)!r}, not an integer") from None


class PatternSource(Source):
    """A source given by ``path`` (a glob, file or folder) with the step taken from each name by ``step_regex``
    (the last integer in the name by default)."""

    usage = "source.path=GLOB"

    def __init__(self, path=None, step_regex=STEP_REGEX, **kw):
        super().__init__(**kw)
        if not path:
            raise SourceError(f"source={self.source_type} needs {self.usage}")
        self.pattern = os.path.expanduser(str(path))
        self.step_regex = compile_step_regex(step_regex)

    def describe(self):
        return self.pattern

    def step_of(self, path: str, what: str = "file") -> int:
        """The step in ``path``'s last name, or a one-line error naming the path."""
        return parse_step(self.step_regex, os.path.basename(os.path.normpath(path)), path, f"{what} name")

    def step_folders(self, complete: Callable[[str], bool], name_re, what: str, needs: str) -> list[tuple[int, str]]:
        """``[(step, checkpoint folder)]`` in step order from ``path``: one checkpoint folder, a folder of them
        (its subfolders that are ``complete``; one whose name matches ``name_re`` but is not is an error, an
        interrupted save), or a glob of checkpoint folders. ``what`` names the format, ``needs`` what a complete
        folder holds."""
        import glob

        p = self.pattern
        if os.path.isdir(p) and complete(p):
            dirs = [p]
        elif os.path.isdir(p):
            dirs = []
            for name in sorted(os.listdir(p)):
                sub = os.path.join(p, name)
                if not os.path.isdir(sub):
                    continue
                if complete(sub):
                    dirs.append(sub)
                elif name_re.match(name):
                    raise SourceError(f"{sub}: not a complete {what} checkpoint (no {needs}: an interrupted save?)")
            if not dirs:
                raise SourceError(f"{p}: no {what} checkpoint folders in it (folders with {needs})")
        else:
            dirs = sorted(glob.glob(p, recursive=True))
            if not dirs:
                raise SourceError(f"{p}: no such folder, and no folders match")
            for d in dirs:
                if not os.path.isdir(d) or not complete(d):
                    raise SourceError(f"{d}: not a complete {what} checkpoint folder (no {needs})")
        out = sorted((self.step_of(d, "folder"), d) for d in dirs)
        for (s1, d1), (s2, d2) in zip(out, out[1:]):
            if s1 == s2:
                raise SourceError(f"{d1} and {d2} are both step {s1} (source.step_regex: "
                                  f"{self.step_regex.pattern})")
        return out
