"""``source.shard=i/n``: one of ``n`` disjoint parts of a series' tensors, so that one large series can be
measured by ``n`` jobs (a Hydra sweep over ``source.shard=0/n,...,n-1/n``) and merged by ``lmcbench-report``.

A part holds whole tensors: every step of a tensor stays in one shard, because a temporal pipeline and the XOR
analysis need the previous step of the same tensor. The partition depends only on the selected tensors (their
keys and sizes), never on the job, so every job computes the same one and keeps its own part: the tensors are
taken largest first (ties by key) and each goes to the shard holding the fewest bytes so far (ties: the fewest
tensors, then the lowest index). The union of the ``n`` parts is the whole selection, and no shard holds more
than the lightest one plus the largest tensor.
"""

from __future__ import annotations

import re

from ..errors import ConfigError

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(spec) -> tuple[int, int] | None:
    """``"i/n"`` as ``(i, n)`` with ``0 <= i < n``; ``None``, ``"null"``, ``"none"`` or ``""`` as ``None``.
    Anything else is a one-line :class:`~lmcbench.errors.ConfigError`."""
    if spec is None or str(spec).strip().lower() in ("", "null", "none"):
        return None
    m = _SPEC.match(str(spec))
    if m:
        i, n = int(m.group(1)), int(m.group(2))
        if 0 <= i < n:
            return i, n
    raise ConfigError(f"source.shard: expected i/n with 0 <= i < n (e.g. 0/4 ... 3/4), got {str(spec)!r}")


def partition(sizes: dict[str, int], n: int) -> list[list[str]]:
    """The keys of ``sizes`` (key -> bytes) in ``n`` parts balanced by bytes, each part in the keys' order."""
    if n < 1:
        raise ConfigError(f"source.shard: {n} shards; there must be at least one")
    load = [0] * n
    count = [0] * n
    owner: dict[str, int] = {}
    for key in sorted(sizes, key=lambda k: (-int(sizes[k]), k)):
        i = min(range(n), key=lambda j: (load[j], count[j], j))
        owner[key] = i
        load[i] += int(sizes[key])
        count[i] += 1
    return [[k for k in sizes if owner[k] == i] for i in range(n)]


__all__ = ["parse_shard", "partition"]
