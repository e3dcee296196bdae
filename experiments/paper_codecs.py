"""Render ``lmcbench experiment=paper_codecs`` into results/paper_codecs/: the general-purpose codecs x
transforms table of the LMC paper (ratio, compress and decompress MiB/s per tensor kind and dtype), with the
trade-off front and ratio against step.

Re-render an existing run:  python experiments/paper_codecs.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import os
import shutil
import sys

from lmcbench.report import render as render_report


def render(run_dir: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = render_report(run_dir, out_dir, title="General-purpose codecs x transforms (the LMC paper's comparison)")
    for name in ("environment.json", "config.yaml"):
        src = os.path.join(run_dir, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(out_dir, name))
    return path


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import main

    main(render, "paper_codecs", __doc__)
