"""Writes dcp_v2/: two LMC DCP checkpoints in format version 2 (CRC-32 checksums), frozen as they were written
by lmc 0.3.5 (commit cce514a), for the test that newer versions still read (and re-code) them. step-1 is coded
against step-2. The state is exact arithmetic (no RNG), so its bits are the same on every platform and torch:
``state(step)`` is what the test compares with. Run from codecs/lmc: ``python tests/data/make_dcp_v2.py``."""
import os
import shutil
import sys

import torch


def state(step):
    n = torch.arange(3 * 1024)
    w = ((n % 97 - 48) / 64 + step / 256).reshape(3, 1024)  # exact in float32
    return {
        "model": {"w": w, "w16": w[:, :256].bfloat16(), "b": (n[:40] % 7 - 3).to(torch.int64) + step},
        "optim": {"state": {"w": {"exp_avg": w / 1024, "step": torch.tensor(float(step))}},
                  "param_groups": [{"lr": 0.01, "params": ["w"]}]},
        "c128": torch.arange(6, dtype=torch.float64).to(torch.complex128) * (1 + 2j) + step,  # not an lmc dtype: stored raw/zlib
        "extra": {"step": step, "name": "frozen"},
    }


if __name__ == "__main__":
    import torch.distributed.checkpoint as dcp
    from lmc.dcp import LMCStorageWriter

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dcp_v2")
    shutil.rmtree(out, ignore_errors=True)
    for s in (1, 2):
        ref = os.path.join(out, f"step-{s - 1}") if s > 1 else None
        dcp.save(state(s), storage_writer=LMCStorageWriter(os.path.join(out, f"step-{s}"), reference=ref),
                 no_dist=True)
    print(out, file=sys.stderr)
