"""The header above every report, for runs and experiments alike: what made the records.

:func:`collect` gathers the machine (CPU, cores), the git commit, the library versions, the thread counts
(:func:`threads`) and the tinygpt corpus (:func:`lmcbench.tinygpt.corpus.corpus_id`: its name and SHA-256); a
run writes it, with its command, to ``environment.json``. :func:`load` reads it back and
:func:`lines` writes it above a report (``lmcbench.report.render`` and every ``experiments/*.py``).
"""

from __future__ import annotations

import glob
import json
import os
import platform
import subprocess
import time

from ..paths import SOURCE_TREE
from ..tinygpt.corpus import corpus_id

LIBRARIES = ("torch", "numba", "pandas", "ml_dtypes", "hydra", "safetensors")


def cpu_name() -> str:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def git_commit(root: str | None = SOURCE_TREE) -> str:
    """The short commit of ``root`` (the checkout lmcbench runs from), with ``+dirty`` when tracked files differ
    from it ("" outside git, and from a non-editable install)."""
    if root is None:
        return ""
    try:
        git = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return git + ("+dirty" if dirty and git else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def library_versions() -> dict:
    import numpy as np

    versions = {"numpy": np.__version__}
    for mod in LIBRARIES:
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a library that is missing or broken is left out
            pass
    return versions


def threads() -> dict:
    """Numba's thread count and threading layer, and torch's thread count.

    ``numba.threading_layer()`` names the layer only once a parallel region has run in this process; before
    that, the configured choice (``numba.config.THREADING_LAYER``, e.g. ``default``) and the configured thread
    count are recorded, and ``numba_threading_layer_from`` says which of the two it is."""
    out: dict = {}
    try:
        import numba

        try:  # asked first: numba.get_num_threads() would start the thread pool, and so pick a layer, itself
            out["numba_threading_layer"] = numba.threading_layer()
            out["numba_threading_layer_from"] = "numba.threading_layer(), after a parallel region ran"
            out["numba"] = numba.get_num_threads()
        except ValueError:  # no parallel region ran in this process
            out["numba_threading_layer"] = str(numba.config.THREADING_LAYER)
            out["numba_threading_layer_from"] = "numba.config.THREADING_LAYER, no parallel region ran"
            out["numba"] = int(numba.config.NUMBA_NUM_THREADS)
    except ImportError:
        pass
    try:
        import torch

        out["torch"] = torch.get_num_threads()
    except ImportError:
        pass
    return out


def collect(command: str, job_overrides: str = "", source: str = "", versions: dict | None = None) -> dict:
    """The environment of this process: the command (and a sweep job's overrides), the time, the machine, the
    git commit, the library versions (and ``versions``, e.g. the codecs'), the threads, the source and the
    tinygpt corpus."""
    from .. import __version__

    return {"command": command, "job_overrides": job_overrides, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "lmcbench": __version__, "python": platform.python_version(), "platform": platform.platform(),
            "cpu": cpu_name(), "cores": cores(), "git_commit": git_commit(),
            "versions": {**library_versions(), **(versions or {})}, "source": source, "threads": threads(),
            "corpus": corpus_id()}


def _files(run_dirs) -> list[str]:
    """The ``environment.json`` files of run folders: a folder's own first, then those below it."""
    dirs = [run_dirs] if isinstance(run_dirs, (str, os.PathLike)) else list(run_dirs)
    out = []
    for d in map(str, dirs):
        own = os.path.join(d, "environment.json")
        found = sorted(glob.glob(os.path.join(d, "**", "environment.json"), recursive=True))
        out += ([own] if os.path.isfile(own) else []) + [f for f in found if f != own]
    return out


def _read(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def load(run_dirs) -> dict:
    """The environment of the first run found in ``run_dirs`` ({} if there is none)."""
    for f in _files(run_dirs):
        env = _read(f)
        if env is not None:
            return env
    return {}


def commands(run_dirs) -> list[str]:
    """The command of every run found in ``run_dirs`` (a sweep's job by its overrides)."""
    out = []
    for f in _files(run_dirs):
        e = _read(f)
        if e is not None:
            out.append(f"lmcbench {e['job_overrides']}" if e.get("job_overrides") else e.get("command", ""))
    return out


def _threads_line(t: dict) -> str:
    parts = []
    if "numba" in t:
        parts.append(f"numba {t['numba']} (threading layer {t.get('numba_threading_layer', '?')}: "
                     f"{t.get('numba_threading_layer_from', '?')})")
    if "torch" in t:
        parts.append(f"torch {t['torch']}")
    return "- threads: " + ", ".join(parts)


def lines(title: str, env: dict, what: str = "", runs: list[str] | None = None, more: list[str] = ()) -> list[str]:
    """The header of a report: the title, ``what`` it shows, then the command (or the ``runs`` merged), the
    machine, the threads, the source, the tinygpt corpus (runs made before it was recorded: none) and the
    libraries, and the bullets in ``more``; ends with a blank line."""
    out = [f"# {title}", ""] + ([what, ""] if what else [])
    if runs is not None and len(runs) > 1:
        out += [f"- merged {len(runs)} runs:"] + [f"  - `{c}`" for c in runs]
    elif env:
        out.append(f"- command: `{env.get('command', '?')}`")
    if env:
        out.append(f"- machine: {env.get('cpu', '?')}, {env.get('cores', '?')} cores; python {env.get('python', '?')}; "
                   f"lmcbench git {env.get('git_commit', '?')}; run {env.get('time', '?')}")
        if env.get("threads"):
            out.append(_threads_line(env["threads"]))
        out.append(f"- source: {env.get('source', '?')}")
        if env.get("corpus"):
            out.append(f"- tinygpt corpus: {env['corpus']}")
        if env.get("versions"):
            out.append("- libraries: " + ", ".join(f"{k} {v}" if not str(v).startswith(k) else str(v)
                                                   for k, v in sorted(env["versions"].items())))
    return out + list(more) + [""]
