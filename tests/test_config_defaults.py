"""One source of truth for defaults: each typed config (a dataclass, or a class's keyword defaults) is where a
default is written; the YAML that states those defaults for Hydra must say the same, and a preset may differ
only where it is declared here to override on purpose."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from lmcbench.lossy.excp import ExCPConfig
from lmcbench.lossy.run import ExCPRunConfig, SweepConfig, _opts
from lmcbench.tinygpt import TRAIN_DEFAULTS, TrainConfig

from lmcbench_testlib import group_options, option_content

# conf/experiment/excp.yaml is a preset over ExCPConfig and ExCPRunConfig: what it changes, and why
EXCP_PRESET_OVERRIDES = {
    "archiver": "zstd",       # zstd-9 instead of lzma: lzma is ~30x slower on this payload
    "archiver_level": 9,
    "eval_batches": 16,       # the 24M series: 16 batches are enough and halve the evaluation time
    "sweep": {"steps": 2, "alpha": [2.0e-4, 1.0e-3], "beta": [4.0], "bits": [2, 8]},  # the default sweeps nothing
}
# presets over TrainConfig (every other source YAML that has a train: block)
TRAIN_PRESETS = {"tinygpt_large"}


def yaml(group: str, name: str) -> dict:
    return option_content(group, name)


def field_defaults(cls) -> dict:
    """A dataclass's defaults, nested dataclasses as dicts, tuples as lists (as YAML writes them)."""
    def plain(v):
        return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v

    return {k: plain(v) if not isinstance(v, dict) else v for k, v in dataclasses.asdict(cls()).items()}


def same(a, b) -> bool:
    """Equal values of the same type (1 and 1.0 differ: a YAML that writes an int where the default is a float
    states another default)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def differences(stated: dict, defaults: dict, prefix="") -> dict:
    """``key -> (stated, default)`` for every key whose value differs (nested dicts key by key)."""
    out = {}
    for k in stated.keys() | defaults.keys():
        a, b = stated.get(k, "<missing>"), defaults.get(k, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(differences(a, b, f"{prefix}{k}."))
        elif not same(a, b):
            out[f"{prefix}{k}"] = (a, b)
    return out


def flat(d: dict, prefix="") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# ------------------------------------------------------------------------------------------------ tinygpt
def test_tinygpt_yaml_states_the_train_config_defaults():
    stated = yaml("source", "tinygpt")["train"]
    assert differences(stated, field_defaults(TrainConfig)) == {}
    assert TrainConfig.from_options(stated) == TrainConfig()
    assert TRAIN_DEFAULTS == TrainConfig().to_dict()


@pytest.mark.parametrize("name", sorted(TRAIN_PRESETS))
def test_train_presets_name_every_field_and_only_fields(name):
    stated = yaml("source", name)["train"]
    assert set(stated) == set(field_defaults(TrainConfig)), "a preset states the whole train: block"
    TrainConfig.from_options(stated)  # and every value is valid


def test_every_source_yaml_with_a_train_block_is_known():
    names = {n for n in group_options("source") if "train" in yaml("source", n)}
    assert names == {"tinygpt"} | TRAIN_PRESETS


# ------------------------------------------------------------------------------------------------ sources
def init_defaults(cls) -> dict:
    """Keyword defaults of a source class's constructor chain (the subclass's win)."""
    out = {}
    for c in reversed(cls.__mro__):
        if "__init__" in vars(c):
            for p in inspect.signature(c.__init__).parameters.values():
                if p.default is not inspect.Parameter.empty:
                    out[p.name] = p.default
    return out


@pytest.mark.parametrize("name", group_options("source"))
def test_source_yaml_defaults_are_the_constructors(name):
    import importlib

    from lmcbench.sources import _SOURCES

    stated = yaml("source", name)
    mod, _, cls = _SOURCES[stated.pop("type")].partition(":")
    defaults = init_defaults(getattr(importlib.import_module(mod), cls))
    assert set(stated) <= set(defaults), f"options the source does not take: {set(stated) - set(defaults)}"
    diff = {k: (v, defaults[k]) for k, v in stated.items()
            if k != "train" and v != "???" and not same(v, defaults[k])}
    assert diff == {}


# ---------------------------------------------------------------------------------------------------- excp
def test_excp_preset_differs_from_the_dataclasses_only_where_declared():
    stated = yaml("experiment", "excp")["excp"]
    defaults = {**field_defaults(ExCPConfig), **field_defaults(ExCPRunConfig)}
    assert set(stated) == set(defaults), "the preset states every option of the codec and the experiment"
    assert set(stated["sweep"]) == set(field_defaults(SweepConfig))
    declared = flat(EXCP_PRESET_OVERRIDES)
    diff = differences(stated, defaults)
    assert set(diff) == set(declared), "an undeclared difference is a drifted default (or a new override)"
    assert all(same(diff[k][0], v) for k, v in declared.items())


def test_excp_options_merge_onto_the_dataclass_defaults():
    cfg, run = _opts({"excp": {}})
    assert cfg == ExCPConfig()
    assert run == dataclasses.asdict(ExCPRunConfig())
    cfg, run = _opts({"excp": yaml("experiment", "excp")["excp"]})
    assert cfg.archiver == "zstd" and run["eval_batches"] == 16 and run["sweep"]["steps"] == 2


# ------------------------------------------------------------------------------------------- checkpoint_store
def test_checkpoint_store_preset_states_the_dataclass_defaults():
    from lmcbench.store import StoreConfig

    stated = yaml("experiment", "checkpoint_store")["store"]
    assert differences(stated, field_defaults(StoreConfig)) == {}
    assert StoreConfig.from_options(stated) == StoreConfig()
