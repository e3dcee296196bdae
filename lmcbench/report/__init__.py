"""Reports: pandas tables and matplotlib figures rendered next to the records.

Records of a sampled run (``bench.sample < 1``) are loaded as estimates of the whole checkpoint
(:func:`.sampling.estimated`), so every sum / sum of :mod:`.records` is the sample's ratio estimate; the run
report then gives each ratio its bootstrap interval and says in its header that the run was sampled.

Modules: :mod:`.records` (loading and aggregating records), :mod:`.run_report` (a run's report),
:mod:`.sampling` (a sampled run's estimates and intervals), :mod:`.header`, :mod:`.plots`, :mod:`.facets`,
:mod:`.shards`, :mod:`.options` and :mod:`.merge` (``lmcbench-report``).
"""

from .records import (MiB, aggregate, comparable, kinds_in, load_records, load_streams, record_files,  # noqa: F401
                      run_names, size_text, temporal)
from .run_report import pivot, ratio_cells, render, summary_text

__all__ = ["record_files", "run_names", "kinds_in", "load_records", "load_streams", "aggregate", "comparable", "pivot",
           "ratio_cells", "render", "summary_text", "temporal"]
