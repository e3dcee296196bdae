"""The command line: ``lmcbench [OVERRIDES...]`` (a thin ``@hydra.main`` over :func:`run_task`).

Errors in the input or the configuration are reported in one line (exit status 2); set
``LMCBENCH_DEBUG=1`` (or ``HYDRA_FULL_ERROR=1``) for the traceback.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import sys
import time

from .errors import ConfigError, LmcbenchError

from .paths import CONF_DIR, results_dir


def render_experiment(name: str, run_dir: str, out_dir: str) -> None:
    """Render a run with ``experiments/<name>.py`` (the module ``lmcbench.experiments.<name>``, its
    ``render(run_dir, out_dir)``) into ``out_dir``."""
    import importlib
    import importlib.util

    from .paths import EXPERIMENTS_DIR

    module = f"lmcbench.experiments.{name}"
    if not name.isidentifier() or name.startswith("_") or importlib.util.find_spec(module) is None:
        raise ConfigError(f"experiment {name!r} has no renderer ({os.path.join(EXPERIMENTS_DIR, name + '.py')})")
    importlib.import_module(module).render(run_dir, out_dir)


def _debug() -> bool:
    return bool(os.environ.get("LMCBENCH_DEBUG") or os.environ.get("HYDRA_FULL_ERROR"))


def fail(msg: str, code: int = 2):
    print(f"lmcbench: error: {msg}", file=sys.stderr)
    sys.exit(code)


def build(cfg):
    """Source, pipelines, codecs and bench options from a composed config (instantiates everything)."""
    from omegaconf import OmegaConf

    from .bench.options import BenchOptions
    from .codecs import get_codec
    from .sources import get_source
    from .transforms import Pipeline

    from omegaconf.errors import MissingMandatoryValue

    try:
        c = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", "") or "a value"
        hint = {"source.path": " (e.g. source.path=DIR)",
                "source.repo_id": " (e.g. source.repo_id=EleutherAI/pythia-70m)",
                "source.revisions": " (e.g. 'source.revisions=[step1000,step2000]')"}.get(str(key), "")
        raise ConfigError(f"{key} must be given{hint}") from None
    if not c.get("codec"):
        raise ConfigError("no codec selected (codec=[...])")
    if not c.get("pipeline"):
        raise ConfigError("no pipeline selected (pipeline=[...])")
    source = get_source(c["source"])
    pipelines = {}
    for name, steps in c["pipeline"].items():
        if steps is not None and not isinstance(steps, list):
            raise ConfigError(f"pipeline.{name}: expected a list of transforms, got {steps!r}")
        pipelines[name] = Pipeline.from_config(name, steps)
    codecs, notes = {}, []
    for name, ccfg in c["codec"].items():
        if not isinstance(ccfg, dict) or "id" not in ccfg:
            raise ConfigError(f"codec.{name}: expected a codec config with an 'id', got {ccfg!r}")
        try:
            cls_ok = get_codec(ccfg)
            type(cls_ok).check_installed()
            codecs[name] = cls_ok
        except ImportError as e:
            if not c.get("skip_unavailable_codecs", True):
                raise ConfigError(f"codec {name}: its library is not installed ({e})") from None
            notes.append(f"note: codec {name} skipped: its library is not installed ({e.name or e})")
    if not codecs:
        raise ConfigError("none of the selected codecs is installed")
    restrict = c.get("restrict") or {}
    if not isinstance(restrict, dict):
        raise ConfigError(f"restrict: expected a mapping codec -> [pipelines], got {restrict!r}")
    for cname, pl in restrict.items():
        pl = [pl] if isinstance(pl, str) else pl
        bad = [p for p in (pl or []) if p not in pipelines]
        if not isinstance(pl, list) or bad:
            raise ConfigError(f"restrict.{cname}: pipelines {bad or pl!r} are not in the selected pipelines "
                              f"({', '.join(pipelines)})")
        restrict[cname] = pl
    return source, pipelines, codecs, BenchOptions.from_config(c.get("bench")), notes, restrict


def environment(cfg, source, codecs) -> dict:
    """What ``environment.json`` and the report's header hold (:func:`lmcbench.report.header.collect`)."""
    from .report.header import collect

    command = " ".join(["lmcbench"] + sys.argv[1:])
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        job = " ".join(hc.overrides.task)
        if hc.mode == RunMode.MULTIRUN:  # a sweep's job (maybe in a launcher's process): the command of this point
            hydra_args = [o for o in hc.overrides.hydra if not o.startswith("hydra.mode=")]
            command = " ".join(["lmcbench", "-m", *hydra_args, *hc.overrides.task])
    except Exception:  # noqa: BLE001 - run_task called without Hydra (tests, notebooks)
        job = ""
    return collect(command, job_overrides=job, source=source.describe(),
                   versions={name: c.version for name, c in codecs.items()})


def series_id(cfg) -> str:
    """What the shards of one split series share: a digest of the run's configuration less ``source.shard``
    and the report options (which change no record)."""
    import hashlib

    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True)
    c.pop("report", None)
    (c.get("source") or {}).pop("shard", None)
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _whole_series_only(c: dict, task: str) -> None:
    from .sources.shard import parse_shard

    if parse_shard((c.get("source") or {}).get("shard")) is not None:
        raise ConfigError(f"source.shard splits the lossless grid (task=bench); task={task} needs whole checkpoints")


def run_task(cfg, out_dir: str) -> dict:
    task = cfg.get("task") or "bench"
    if task == "excp":
        return run_excp_task(cfg, out_dir)
    if task == "store":
        return run_store_task(cfg, out_dir)
    if task == "sample_check":
        return run_sample_check_task(cfg, out_dir)
    if task == "experiment":
        return run_experiment_task(cfg, out_dir)
    if task != "bench":
        raise ConfigError(f"task: unknown task {task!r}; known: bench (the lossless grid), excp (lossy, "
                          "experiment=excp), store (saving checkpoints, experiment=checkpoint_store), sample_check "
                          "(the grid in full and sampled, experiment=sampling), experiment (one that measures by "
                          "itself: experiment=peak_memory, experiment=exp_avg_context)")
    summary = _run_bench(cfg, out_dir)
    _render_preset(cfg, out_dir)
    return summary


def _run_bench(cfg, out_dir: str, every_slice: bool = False) -> dict:
    """The lossless grid of ``cfg`` into ``out_dir``: records, environment, report (``every_slice``: every slice
    of the sample's frame measured as a sample measures it; :func:`lmcbench.bench.runner.run`)."""
    from omegaconf import OmegaConf

    from .bench import runner
    from .report import load_records, render, summary_text
    from .report.options import ReportOptions

    source, pipelines, codecs, opts, notes, restrict = build(cfg)
    rep = ReportOptions.from_config(cfg.get("report"))
    for n in notes:
        print(n, file=sys.stderr)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg))
    env = environment(cfg, source, codecs)
    t0 = time.time()
    summary = runner.run(source, pipelines, codecs, opts, out_dir, log=lambda m: print(m, file=sys.stderr),
                         restrict=restrict, every_slice=every_slice)
    env["series"] = series_id(cfg)
    if source.sharding is not None:  # lmcbench-report checks a merge has every shard of the series once
        env["shard"] = source.sharding
    _write_environment(env, summary, t0, out_dir)
    if rep.enabled or rep.print_summary:
        records = load_records(out_dir)  # read once for the report and the printed summary
        if rep.enabled:
            print(f"report: {render(out_dir, out_dir, figures=rep.figures, records=records)}")
        if rep.print_summary:
            print(summary_text(records))
    print(f"records: {os.path.join(out_dir, 'records.csv')} ({summary['rows']} rows, "
          f"{summary['failed']} failed round trips)")
    if summary["failed"]:
        print(f"lmcbench: warning: {summary['failed']} measurement(s) did not round-trip; see the 'error' column",
              file=sys.stderr)
    return summary


def _write_environment(env: dict, summary: dict, t0: float, out_dir: str) -> None:
    from .report.header import threads

    env.update(summary)
    env["threads"] = threads()  # after the run: numba names its threading layer once a parallel region ran
    env["seconds"] = round(time.time() - t0, 1)
    env["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(os.path.join(out_dir, "environment.json"), "w") as f:
        json.dump(env, f, indent=1, default=str)


def _render_preset(cfg, out_dir: str) -> None:
    """An experiment preset's run is rendered by experiments/<name>.py into <results_dir>/<name>/."""
    name = cfg.get("experiment_name")
    if name:
        results = os.path.join(str(cfg.get("results_dir") or results_dir()), name)
        render_experiment(name, out_dir, results)
        print(f"experiment {name}: {os.path.join(results, 'report.md')}")


def run_experiment_task(cfg, out_dir: str) -> dict:
    """``task: experiment`` (``lmcbench experiment=peak_memory``, ``experiment=exp_avg_context``): an experiment
    that measures by itself rather than through the grid: ``experiments/<experiment_name>.py``'s
    ``run(config, out)`` writes its report into ``<results_dir>/<experiment_name>/``."""
    import importlib
    import importlib.util

    from omegaconf import OmegaConf

    name = cfg.get("experiment_name")
    module = f"lmcbench.experiments.{name}"
    if not name or not str(name).isidentifier() or name.startswith("_") or importlib.util.find_spec(module) is None \
            or not hasattr(importlib.import_module(module), "run"):
        raise ConfigError(f"task experiment: experiment_name {name!r} names no experiment with a run() "
                          f"(experiments/<name>.py)")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg))
    results = os.path.join(str(cfg.get("results_dir") or results_dir()), name)
    report = importlib.import_module(module).run(OmegaConf.to_container(cfg, resolve=True), results)
    print(f"experiment {name}: {report}")
    return {"report": report}


def run_excp_task(cfg, out_dir: str) -> dict:
    """``task: excp`` (``lmcbench experiment=excp``): the lossy ExCP experiment, judged by resumed training."""
    from omegaconf import OmegaConf

    from .lossy.run import run_excp
    from .sources import get_source

    c = OmegaConf.to_container(cfg, resolve=True)
    _whole_series_only(c, "excp")
    source = get_source(c["source"])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg))
    env = environment(cfg, source, {})
    t0 = time.time()
    summary = run_excp(c, out_dir, log=lambda m: print(m, file=sys.stderr))
    _write_environment(env, {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}, t0, out_dir)
    _render_preset(cfg, out_dir)
    print(f"excp (lossy): {os.path.join(out_dir, 'summary.json')}: ratio_full {summary['ratio_full']:.1f}x, "
          f"final eval loss {summary['final_eval_loss_compressed']:.4f} vs {summary['final_eval_loss_baseline']:.4f}")
    return summary


def run_store_task(cfg, out_dir: str) -> dict:
    """``task: store`` (``lmcbench experiment=checkpoint_store``): a series' checkpoints saved by each method."""
    from omegaconf import OmegaConf

    from .sources import get_source
    from .store import run_store

    c = OmegaConf.to_container(cfg, resolve=True)
    _whole_series_only(c, "store")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg))
    env = environment(cfg, get_source(c["source"]), {})
    t0 = time.time()
    summary = run_store(c, out_dir, log=lambda m: print(m, file=sys.stderr))
    _write_environment(env, {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}, t0, out_dir)
    _render_preset(cfg, out_dir)
    print(f"store: {os.path.join(out_dir, 'store_checkpoints.csv')}; every restore bit-exact: {summary['verified']}")
    return summary


def run_sample_check_task(cfg, out_dir: str) -> dict:
    """``task: sample_check`` (``lmcbench experiment=sampling``): the same grid measured in full (into ``full/``),
    every slice of the sample's frame on its own (``slices/``) and from a ``bench.sample`` of the slices with each
    seed of ``sample_check.seeds`` (``sample-<seed>/``), then rendered side by side: does each sampled ratio's
    interval hold the full run's ratio?"""
    from omegaconf import OmegaConf

    frac = cfg.bench.get("sample", 1.0)
    seeds = (cfg.get("sample_check") or {}).get("seeds") or [cfg.bench.get("sample_seed", 0)]
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
        raise ConfigError(f"task sample_check: bench.sample must be a fraction below 1 (the sample to check), "
                          f"got {frac!r}")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ConfigError(f"sample_check.seeds: expected a list of seeds >= 0, got {list(seeds)!r}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg))
    summaries = {}
    runs = [("full", 1.0, seeds[0], "every byte"), ("slices", 1.0, seeds[0], "every slice on its own")] + \
        [(f"sample-{s}", float(frac), s, f"{frac:g} of the slices, seed {s}") for s in seeds]
    for name, sample, seed, what in runs:
        sub = copy.deepcopy(cfg)
        sub.task, sub.experiment_name = "bench", None
        sub.bench.sample, sub.bench.sample_seed = sample, int(seed)
        print(f"sample_check: {name} ({what})", file=sys.stderr)
        summaries[name] = _run_bench(sub, os.path.join(out_dir, name), every_slice=name == "slices")
    _render_preset(cfg, out_dir)
    return {"rows": sum(s["rows"] for s in summaries.values()), "failed": sum(s["failed"] for s in summaries.values()),
            "runs": list(summaries)}


def _hydra_main():
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
    def _main(cfg):
        try:
            run_task(cfg, HydraConfig.get().runtime.output_dir)
        except LmcbenchError as e:
            if _debug():
                raise
            fail(str(e))
        except KeyboardInterrupt:
            fail("interrupted; the records written so far are kept", 130)

    return _main


def _precheck(args: list[str]) -> None:
    """Compose the config once before Hydra runs, so an unknown option or value gets one clear line. A sweep
    (``-m``) has every point composed and its grid built first, so that a bad value fails here, at once,
    instead of in jobs already handed to a launcher (a cluster's queue)."""
    if any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion",
                 "--version") or a.startswith(("--cfg", "--info", "--config", "-cp", "-cn", "--package", "-p"))
           for a in args):
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun") and not a.lstrip("+~").startswith("hydra")]
    points = _sweep_points(overrides) if multirun else [overrides]
    where = ""
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            for point in points:
                where = f" (sweep point: {' '.join(point)})" if multirun else ""
                cfg = compose(config_name="config", overrides=point)
                if multirun:
                    _check_point(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        if _debug():
            raise
        fail(_one_line(str(e)) + where)
    except LmcbenchError as e:
        if _debug():
            raise
        fail(f"{e}{where}")


def _sweep_points(overrides: list[str]) -> list[list[str]]:
    """The overrides of each job of a sweep, as Hydra's basic sweeper expands them (none when it cannot:
    Hydra then reports the sweep itself)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)[0]
    except Exception:  # noqa: BLE001 - a sweep this cannot expand (glob, intervals) is left to Hydra
        return []


def _check_point(cfg) -> None:
    """What a job would refuse at its start: the grid of a bench run, the source of the other tasks."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as e:
        if "HydraConfig" in str(e):  # ${hydra:...}: known only in the job, which checks itself
            return
        raise
    task = cfg.get("task") or "bench"
    if task == "bench":
        build(cfg)
    elif task in ("excp", "store"):
        _whole_series_only(OmegaConf.to_container(cfg, resolve=True), task)


def _one_line(msg: str) -> str:
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    if not lines:
        return "invalid configuration"
    head = lines[0]
    import re

    m = re.match(r"Could not override '([^']+)'", head)
    if m and "Available options" not in msg:
        return f"unknown option {m.group(1)!r} (`lmcbench --cfg job` prints every option)"
    if "no viable alternative" in head or "mismatched input" in head or "extraneous input" in head:
        return f"cannot parse the command line ({head}); quote overrides that contain [ ] , or spaces"
    if "Available options" in msg:
        opts = [ln for ln in lines[lines.index(next(x for x in lines if x.startswith("Available options"))) + 1:]
                if not ln.startswith(("Config search path", "provider=", "Set the environment"))]
        head += " (available: " + ", ".join(opts) + ")"
    elif len(lines) > 1 and lines[1].startswith(("Key", "full_key")):
        head += " " + lines[1]
    return head


def main() -> None:
    args = sys.argv[1:]
    _precheck(args)
    _hydra_main()()


if __name__ == "__main__":
    main()
