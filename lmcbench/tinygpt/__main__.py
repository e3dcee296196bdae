"""Train a tinygpt series into a folder of your choice, on any torch device.

    python -m lmcbench.tinygpt OUT [--preset tinygpt_large] [--set max_steps=300 --set save_steps=100]
                                   [--device cuda]

``--preset`` takes the ``train:`` block of ``conf/source/<preset>.yaml`` (default: the small default series),
``--set`` overrides single options (checked as ``source.train`` is), ``--device`` says where the arithmetic runs
(checkpoints are written from CPU copies, in the same Trainer layout). Writes ``OUT/checkpoint-<step>/`` and
``OUT/lmcbench_series.json``. Use it to make a real training series where lmcbench's cache is not wanted: on a
machine with an accelerator, or to hand a series to the lmc benchmarks (``codecs/lmc/benchmarks``). A series
trained on an accelerator is real but not bit-identical to the CPU's: lmcbench's cache never holds one.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import LmcbenchError
from .corpus import NAME as CORPUS_NAME
from .corpus import SHA256 as CORPUS_SHA256


def _options(preset: str | None, sets: list[str]) -> dict:
    from importlib import resources

    import yaml

    from .config import TrainConfig

    train = {}
    if preset:
        try:  # installed: conf/ ships as lmcbench.conf; a source checkout has it at the top
            path = resources.files("lmcbench.conf").joinpath("source", f"{preset}.yaml")
        except ModuleNotFoundError:
            from pathlib import Path

            path = Path(__file__).resolve().parents[2] / "conf" / "source" / f"{preset}.yaml"
        if not path.is_file():
            raise LmcbenchError(f"--preset {preset}: no conf/source/{preset}.yaml")
        train = dict(yaml.safe_load(path.read_text()).get("train") or {})
    for kv in sets:
        key, sep, value = kv.partition("=")
        if not sep:
            raise LmcbenchError(f"--set {kv!r}: expected KEY=VALUE")
        train[key.strip()] = yaml.safe_load(value)
    return TrainConfig.from_options(train).to_dict()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmcbench.tinygpt", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder to write checkpoint-<step>/ into (must not hold a series yet)")
    ap.add_argument("--preset", default=None, help="a conf/source preset, e.g. tinygpt_large")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a training option")
    ap.add_argument("--device", default="cpu", help="torch device for the arithmetic (cpu, cuda, ...)")
    a = ap.parse_args(argv)
    try:
        opts = _options(a.preset, a.set)
        if os.path.isdir(a.out) and any(n.startswith("checkpoint-") for n in os.listdir(a.out)):
            raise LmcbenchError(f"{a.out}: already holds checkpoints; choose an empty folder")
        from .trainer import train

        info = train(a.out, opts, device=a.device)
    except LmcbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(a.out, "lmcbench_series.json"), "w") as f:
        json.dump({"options": opts, "device": a.device, "corpus": {"name": CORPUS_NAME, "sha256": CORPUS_SHA256},
                   **info}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
