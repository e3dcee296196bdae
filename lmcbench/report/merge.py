"""``lmcbench-report DIR [DIR...]``: merge the runs of a sweep folder (or several runs) into one report."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import LmcbenchError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lmcbench-report", description=__doc__.split(":", 1)[1].strip())
    ap.add_argument("runs", nargs="+", help="run or sweep folders (searched for records.csv), or records.csv files")
    ap.add_argument("-o", "--out", help="where to write report.md and figures (default: the first folder)")
    ap.add_argument("--title", default="lmcbench report")
    ap.add_argument("--no-figures", action="store_true")
    a = ap.parse_args(argv)
    from .run_report import render

    out = a.out or (a.runs[0] if os.path.isdir(a.runs[0]) else os.path.dirname(a.runs[0]) or ".")
    try:
        path = render(a.runs, out, title=a.title, figures=not a.no_figures)
    except LmcbenchError as e:
        print(f"lmcbench-report: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
