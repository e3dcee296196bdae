"""Helpers shared by the experiment renderers: loading a run, the header every report starts with (the same
as a run report's: lmcbench.report.header), tables, writing the report."""

from __future__ import annotations

import os

import pandas as pd

from lmcbench.report import load_records, load_streams
from lmcbench.report.header import lines as header_lines
from lmcbench.report.header import load as load_environment
from lmcbench.sources import KINDS as _SOURCE_KINDS

KINDS = [k for k in _SOURCE_KINDS if k != "other"]  # weights and the Adam moments, in report order

MiB = 2**20
GiB = 2**30


def load_run(run_dir: str):
    return load_records(run_dir), load_streams(run_dir), load_environment(run_dir)


def header(title: str, env: dict, what: str) -> list[str]:
    """The report's first lines: the title, what it shows, and what made it (lmcbench.report.header)."""
    return header_lines(title, env, what)


def begin(run_dir: str, out_dir: str, title: str, what: str):
    """Load a run, make ``out_dir`` and start its report: ``(records, streams, environment, header lines)``."""
    df, streams, env = load_run(run_dir)
    os.makedirs(out_dir, exist_ok=True)
    return df, streams, env, header(title, env, what)


def md_table(df: pd.DataFrame, index_name: str = "") -> str:
    cols = [index_name] + [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] + ["---:"] * len(df.columns)) + "|"]
    for idx, row in df.iterrows():
        out.append("| " + " | ".join([str(idx)] + ["" if pd.isna(v) else str(v) for v in row.values]) + " |")
    return "\n".join(out)


def finish(run_dir: str, out_dir: str, lines: list[str], copy=("environment.json",)) -> str:
    """Copy the named files of the run beside the report, write ``report.md`` and return its path."""
    import shutil

    for name in copy:
        src = os.path.join(run_dir, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(out_dir, name))
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def main(render, name: str, doc: str) -> None:
    """``python experiments/<name>.py RUN_DIR [OUT_DIR]``: re-render a run (default OUT_DIR: results/<name>: the
    checkout's, or the working directory's from a non-editable install)."""
    import sys

    if len(sys.argv) < 2:
        sys.exit(doc)
    from lmcbench.paths import results_dir

    print(render(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else os.path.join(results_dir(), name)))
