"""Where lmcbench finds its own files, the same from a source checkout and from an installed wheel.

The Hydra configuration and the experiment renderers live at the top of the repository (``conf/``,
``experiments/``), where users find them, and ship inside the package as :mod:`lmcbench.conf` and
:mod:`lmcbench.experiments` (pyproject.toml maps the two packages to those folders; an editable install maps
them the same way). :data:`CONF_DIR` and :data:`EXPERIMENTS_DIR` are the folders of those packages, wherever
they were imported from; :data:`SOURCE_TREE` is the checkout when lmcbench runs from one (``None`` from a
non-editable install, which then writes experiment results into ``./results`` of the working directory).
"""

from __future__ import annotations

import importlib.util
import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _package_dir(name: str, folder: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        return os.path.abspath(list(spec.submodule_search_locations)[0])
    # a checkout on sys.path without an install (e.g. PYTHONPATH=.): the folder beside the package
    return os.path.abspath(os.path.join(PACKAGE_DIR, os.pardir, folder))


CONF_DIR = _package_dir("lmcbench.conf", "conf")
EXPERIMENTS_DIR = _package_dir("lmcbench.experiments", "experiments")


def _source_tree() -> str | None:
    root = os.path.dirname(PACKAGE_DIR)
    here = os.path.join(root, "conf")
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isdir(here) \
            and os.path.samefile(here, CONF_DIR):
        return root
    return None


SOURCE_TREE = _source_tree()


def results_dir() -> str:
    """Where an experiment's report goes by default (``results_dir: null``): the checkout's ``results/``, or
    ``results/`` in the working directory of a non-editable install."""
    return os.path.join(SOURCE_TREE, "results") if SOURCE_TREE else os.path.abspath("results")
