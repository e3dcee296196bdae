"""The options of a run's report (the ``report`` config group): defaults here, mirrored by
``conf/report/default.yaml`` (``tests/test_config.py`` checks that the two agree)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ConfigError


@dataclass
class ReportOptions:
    enabled: bool = True  # write report.md, summary.csv (and the figures) beside the records
    figures: bool = True
    print_summary: bool = True  # print the ratio and speed tables at the end of the run

    @classmethod
    def from_config(cls, cfg) -> "ReportOptions":
        cfg = dict(cfg or {})
        unknown = sorted(set(cfg) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"report: unknown option(s) {', '.join(unknown)}")
        for k, v in cfg.items():
            if not isinstance(v, bool):
                raise ConfigError(f"report.{k}: expected true or false, got {v!r}")
        return cls(**cfg)
