"""Fixtures for the lmcbench test-suite; the helpers are in ``lmcbench_testlib`` (a module name of its own, so
that it cannot clash with ``codecs/lmc/tests``' modules when both suites run in one pytest session)."""

from __future__ import annotations

import pytest

from excp_testlib import encode_chain2
from lmcbench_testlib import run_cli, tiny_overrides


@pytest.fixture(scope="session")
def e2e(tmp_path_factory):
    """The tinygpt series trained once and measured twice through the CLI (the second run reuses the cache)."""
    import time

    base = tmp_path_factory.mktemp("e2e")
    cache = base / "cache"
    runs = {}
    for name in ("run1", "run2"):
        args = tiny_overrides() + ["codec=[memcpy,zstd,lz4]", "pipeline=[raw,bytegroup,delta]", "bench=quick",
                                   f"hydra.run.dir={base / 'sweep' / name}"]
        t0 = time.time()
        p = run_cli(args, base, cache, timeout=240)
        runs[name] = {"proc": p, "seconds": time.time() - t0, "dir": base / "sweep" / name}
    return {"base": base, "cache": cache, "sweep": base / "sweep", **runs}


@pytest.fixture(scope="module")
def chain2():
    """A first ExCP checkpoint (lossless) and a second one coded against the first's reconstruction."""
    return encode_chain2()
