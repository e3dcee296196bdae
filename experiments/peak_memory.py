"""Peak memory of a streaming run against the size of the largest tensor.

Writes a two-step series of one large fp32 tensor (plus a small one) as safetensors files, runs
``lmcbench source=files`` over it in a child process, and again over the small tensor only (the fixed
overhead: interpreter, libraries, Numba); reports both peaks (ru_maxrss of the child) and their difference
against twice the large tensor.

    lmcbench experiment=peak_memory                        # into results/peak_memory/ (256 and 512 MiB)
    lmcbench experiment=peak_memory 'peak_memory.mib=[64]' results_dir=/tmp/mine
    python experiments/peak_memory.py [--mib 256] [--out results/peak_memory]   # the same without Hydra
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from lmcbench.report.header import collect
from lmcbench.report.header import lines as header_lines


MAKE = """
import os, sys, torch
from safetensors.torch import save_file
tmp, mib = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(0)
w = torch.randn(mib * 2**20 // 4, generator=g) * 0.02
for step in (100, 200):
    save_file({"big.weight": w, "small.weight": w[:4096].clone()}, os.path.join(tmp, f"step{step}.safetensors"))
    w += torch.randn(w.numel(), generator=g) * 1e-4
"""


def child_peak_mib(args: list[str], cwd: str) -> tuple[float, float]:
    """Run ``lmcbench ARGS`` and return (peak RSS of that child in MiB, seconds)."""
    code = ("import resource, runpy, sys; sys.argv = ['lmcbench'] + sys.argv[1:]; "
            "import lmcbench.cli as c\ntry:\n    c.main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)\n"
            "sys.exit(code)")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", code] + args, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"lmcbench failed:\n{p.stderr[-3000:]}")
    peak = [float(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("PEAK ")][-1]
    return peak, time.time() - t0


def measure(mib: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        # the data is written by a child too: Linux carries a parent's peak RSS into a forked child's ru_maxrss,
        # so this process must stay small
        subprocess.run([sys.executable, "-c", MAKE, tmp, str(mib)], check=True)
        common = ["source=files", f"source.path={tmp}/step*.safetensors", "codec=[zstd,lz4,lmc]",
                  "pipeline=[raw,bytegroup,delta_bytegroup,expsplit]", "bench=quick", "report=none"]
        # a first run fills Numba's on-disk cache (compiling takes far more memory than running)
        child_peak_mib(common + ["source.include=small", f"hydra.run.dir={tmp}/warm"], tmp)
        base, _ = child_peak_mib(common + ["source.include=small", f"hydra.run.dir={tmp}/small"], tmp)
        big, secs = child_peak_mib(common + [f"hydra.run.dir={tmp}/big"], tmp)
    return {"large_tensor_mib": mib, "peak_rss_mib": round(big, 1), "baseline_peak_rss_mib": round(base, 1),
            "above_baseline_mib": round(big - base, 1), "above_baseline_over_tensor": round((big - base) / mib, 2),
            "above_two_tensors_mib": round(big - base - 2 * mib, 1), "seconds": round(secs, 1)}


def run(c: dict, out: str) -> str:
    """``lmcbench experiment=peak_memory`` (``task: experiment``): measure each ``peak_memory.mib`` and write
    the report into ``out``; returns its path."""
    from lmcbench.errors import ConfigError

    mib = (c.get("peak_memory") or {}).get("mib")
    if not mib or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in mib):
        raise ConfigError(f"peak_memory.mib: expected a list of sizes in MiB (integers >= 1), got {mib!r}")
    return write(mib, out, " ".join(["lmcbench"] + sys.argv[1:]))


def write(mibs: list[int], out: str, command: str) -> str:
    rows = [measure(m) for m in mibs]
    env = collect(command, source="a two-step series of one large fp32 tensor, written by this script")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "peak_memory.json"), "w") as f:
        json.dump({"command": command, "machine": f"{env['cpu']}, {env['cores']} cores", "environment": env,
                   "runs": rows}, f, indent=1)
    lines = header_lines(
        "Peak memory while streaming", env,
        "Two steps of one large fp32 tensor (and a small one), codecs zstd, lz4 and LMC, pipelines raw, bytegroup, "
        "delta_bytegroup and expsplit, every round trip verified. Peak RSS of the lmcbench process (ru_maxrss); the "
        "fixed overhead is the same run over the small tensor only (Python, torch, pandas, Numba and the codecs).")
    lines += ["| largest tensor (MiB) | peak RSS (MiB) | fixed overhead (MiB) | above it (MiB) | above it / tensor "
              "| above 2 x tensor (MiB) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['large_tensor_mib']} | {r['peak_rss_mib']:.0f} | {r['baseline_peak_rss_mib']:.0f} | "
                     f"{r['above_baseline_mib']:.0f} | {r['above_baseline_over_tensor']:.2f} | "
                     f"{r['above_two_tensors_mib']:.0f} |")
    lines += ["", "The tensor and its delta reference are the only full-size buffers; the rest (the last column) is "
              "per-slice work space (bench.chunk_mib = 16) and does not grow with the tensor."]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return os.path.join(out, "report.md")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[256, 512], help="sizes of the large fp32 tensor")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                  "results", "peak_memory"))
    a = ap.parse_args()
    write(a.mib, a.out, " ".join(["python", "experiments/peak_memory.py"] + sys.argv[1:]))


if __name__ == "__main__":
    main()
