"""The Hydra configuration: every option of every group composes and instantiates; bad values fail clearly."""

from __future__ import annotations

import dataclasses
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lmcbench import cli
from lmcbench.bench.options import BenchOptions
from lmcbench.errors import ConfigError, LmcbenchError
from lmcbench.paths import EXPERIMENTS_DIR
from lmcbench.report.options import ReportOptions
from lmcbench.sources import Source
from lmcbench.transforms import Pipeline

from lmcbench_testlib import (REPO, codec_configs, group_options, make_hf_cache, make_trainer_folder,
                              option_content, pipeline_configs)


def composed(overrides):
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="module")
def trainer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfg") / "out"
    make_trainer_folder(root, steps=(10,))
    return root


BASE = ["codec=[memcpy]", "pipeline=[raw]"]


def test_groups_exist():
    for g in ("source", "codec", "pipeline", "bench", "report"):
        assert group_options(g), g
    assert {"hf_trainer", "files", "tinygpt", "tinygpt_large"} <= set(group_options("source"))


def test_default_config_composes_and_builds(tmp_path):
    cfg = composed([f"source.cache_dir={tmp_path}"])
    assert cfg.source.type == "tinygpt"
    assert list(cfg.codec) and list(cfg.pipeline)
    source, pipelines, codecs, opts, notes, restrict = cli.build(cfg)
    assert source.source_type == "tinygpt"
    assert set(pipelines) == set(cfg.pipeline)
    # every selected codec is either built or dropped with a note naming it
    for name in cfg.codec:
        assert name in codecs or any(name in n for n in notes), name
    assert isinstance(opts, BenchOptions)
    assert restrict == {}
    assert not (tmp_path / "tinygpt").exists() and not list(tmp_path.iterdir()), "build must not train"


@pytest.mark.parametrize("name", group_options("codec"))
def test_every_codec_option(name):
    cfg = composed([f"codec=[memcpy,{name}]", "pipeline=[raw]", "source.cache_dir=/nonexistent/never-made"])
    assert OmegaConf.to_container(cfg.codec[name]) == codec_configs()[name]
    _, _, codecs, _, notes, _ = cli.build(cfg)
    if name in codecs:
        assert codecs[name].get_config() == codec_configs()[name]
    else:
        assert any(name in n and "not installed" in n for n in notes)


@pytest.mark.parametrize("name", group_options("pipeline"))
def test_every_pipeline_option(name):
    cfg = composed(["codec=[memcpy]", f"pipeline=[{name}]"])
    _, pipelines, _, _, _, _ = cli.build(cfg)
    assert list(pipelines) == [name]
    assert isinstance(pipelines[name], Pipeline)
    assert pipelines[name].get_config() == (pipeline_configs()[name] or [])


def test_several_codecs_and_pipelines():
    cfg = composed(["codec=[zstd,bz2,lz4hc]", "pipeline=[raw,delta,expsplit_bytegroup]"])
    _, pipelines, codecs, _, _, _ = cli.build(cfg)
    assert list(codecs) == ["zstd", "bz2", "lz4hc"]
    assert list(pipelines) == ["raw", "delta", "expsplit_bytegroup"]
    assert codecs["lz4hc"].get_config() == {"id": "lz4", "level": 9}


@pytest.mark.parametrize("name", group_options("bench"))
def test_every_bench_option(name):
    cfg = composed(BASE + [f"bench={name}"])
    opts = cli.build(cfg)[3]
    expected = option_content("bench", name)
    for k, v in expected.items():
        assert getattr(opts, k) == v


@pytest.mark.parametrize("name", group_options("report"))
def test_every_report_option(name):
    cfg = composed(BASE + [f"report={name}"])
    assert OmegaConf.to_container(cfg.report) == option_content("report", name)
    cli.build(cfg)


@pytest.mark.parametrize("name", group_options("source"))
def test_every_source_option(name, trainer_dir, tmp_path, monkeypatch):
    import shutil

    shutil.copy(trainer_dir / "checkpoint-10" / "model.safetensors", tmp_path / "run3_step10.safetensors")
    if name == "hf_hub":  # the Trainer checkpoint as revision step10 of a repository in an offline cache
        from huggingface_hub import constants

        make_hf_cache(tmp_path / "hub", "lmcbench-tests/tiny", {"step10": trainer_dir / "checkpoint-10"})
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    extra = {"hf_trainer": [f"source.path={trainer_dir}"],
             "hf_hub": ["source.repo_id=lmcbench-tests/tiny", "source.revisions=[step10]",
                        f"source.cache_dir={tmp_path}/hub"],
             "files": [f"source.path={tmp_path}/*.safetensors", r"source.step_regex='step(\d+)'"],
             "dcp": [f"source.path={tmp_path}/dcp"],
             "deepspeed": [f"source.path={tmp_path}/deepspeed"],
             "tinygpt": [f"source.cache_dir={tmp_path}"],
             "tinygpt_large": [f"source.cache_dir={tmp_path}"]}[name]
    if name == "dcp":  # one DCP checkpoint of a model and its AdamW state
        import warnings

        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        m = torch.nn.Linear(4, 3)
        opt = torch.optim.AdamW(m.parameters())
        m(torch.ones(2, 4)).sum().backward()
        opt.step()
        msd, osd = get_state_dict(m, opt)
        with warnings.catch_warnings():  # "torch.distributed is disabled ... a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({"model": msd, "optim": osd}, storage_writer=dcp.FileSystemWriter(tmp_path / "dcp" / "step-10"))
    if name == "deepspeed":  # one DeepSpeed ZeRO-2 checkpoint in DeepSpeed's layout, built with torch.save
        from deepspeed_layout import build

        build(tmp_path / "deepspeed", steps=(10,))
    cfg = composed(BASE + [f"source={name}"] + extra)
    source = cli.build(cfg)[0]
    assert isinstance(source, Source) and source.source_type == cfg.source.type
    if cfg.source.type == "tinygpt":
        assert str(tmp_path) in source.path
        assert source.train_opts["max_steps"] == cfg.source.train.max_steps
        return  # entries() would train
    if name == "files":
        assert source.step_regex.pattern == r"step(\d+)"
        es = source.entries()
        assert {e.step for e in es} == {10} and {e.kind for e in es} == {"weight"}
    else:
        es = source.entries()
        assert {"weight", "exp_avg", "exp_avg_sq"} <= {e.kind for e in es}


@pytest.mark.parametrize("name", ["hf_trainer", "files"])
def test_source_needs_path(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "abc").mkdir()  # a 3-character name in the cwd
    cfg = composed(BASE + [f"source={name}"])
    with pytest.raises(LmcbenchError) as ei:  # the mandatory '???' value must not be taken as a path
        cli.build(cfg)[0].entries()
    assert "source.path" in str(ei.value)


def test_tinygpt_options_are_checked():
    with pytest.raises(ConfigError, match="nope"):
        cli.build(composed(BASE + ["+source.train.nope=1"]))
    with pytest.raises(ConfigError, match="n_head"):
        cli.build(composed(BASE + ["source.train.n_embd=30", "source.train.n_head=4"]))
    with pytest.raises(ConfigError, match="save_steps"):
        cli.build(composed(BASE + ["source.train.save_steps=0"]))


@pytest.mark.parametrize("override", ["codec=[nope]", "source=nope", "pipeline=[nope]", "bench=nope", "bench.nope=1"])
def test_unknown_options_fail_at_compose(override):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with pytest.raises((HydraException, OmegaConfBaseException)) as ei:
        composed([override])
    assert "nope" in str(ei.value)


@pytest.mark.parametrize("overrides,match", [
    (["bench.repeats=0"], "repeats"),
    (["bench.chunk_mib=0"], "chunk_mib"),
    (["codec.zstd.level=99"], "level"),
    (["source.kinds=[weights]"], "weights"),
    (["source.include='('"], "include"),
    (["source.cast=bf17"], "bf17"),
    (["codec.zstd.threads=x"], "threads"),
    (["codec=[]"], "codec"),
    (["pipeline=[]"], "pipeline"),
])
def test_bad_values_fail_at_build(overrides, match, tmp_path):
    defaults = {"codec": "codec=[zstd]", "pipeline": "pipeline=[raw]"}
    ov = [v for k, v in defaults.items() if not any(o.startswith(k + "=") for o in overrides)] + overrides
    cfg = composed(ov + [f"source.cache_dir={tmp_path}"])
    with pytest.raises(ConfigError) as ei:
        cli.build(cfg)
    msg = str(ei.value)
    assert match in msg and "\n" not in msg
    assert isinstance(ei.value, LmcbenchError)


def test_missing_library_is_an_error_when_not_skipping(monkeypatch):
    from lmcbench.codecs.basic import Zstd

    def boom():
        raise ImportError("no zstandard here", name="zstandard")

    monkeypatch.setattr(Zstd, "check_installed", classmethod(lambda cls: boom()))
    _, _, codecs, _, notes, _ = cli.build(composed(["codec=[zstd,lz4]", "pipeline=[raw]"]))
    assert list(codecs) == ["lz4"] and any("zstd" in n for n in notes)
    with pytest.raises(ConfigError, match="zstd"):
        cli.build(composed(["codec=[zstd,lz4]", "pipeline=[raw]", "skip_unavailable_codecs=false"]))
    with pytest.raises(ConfigError, match="none of the selected codecs"):
        cli.build(composed(["codec=[zstd]", "pipeline=[raw]"]))


@pytest.mark.parametrize("args", [["codec=[nope]"], ["source=nope"], ["bench.nope=1"], ["pipeline=[nope]"]])
def test_precheck_reports_one_line(args, capsys, monkeypatch):
    monkeypatch.delenv("LMCBENCH_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as ei:
        cli._precheck(args)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmcbench: error:") and "nope" in lines[0]


def test_precheck_accepts_good_and_hydra_overrides(capsys):
    cli._precheck(["codec=[zstd]", "pipeline=[raw,delta]", "hydra.run.dir=/tmp/x", "bench=quick"])
    cli._precheck(["--help"])  # hydra's own flags are left to hydra
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("group, options", [("bench", BenchOptions), ("report", ReportOptions)])
def test_default_yaml_and_its_dataclass_agree(group, options):
    """conf/<group>/default.yaml holds every option of the dataclass, at the dataclass's default: one cannot
    change without the other."""
    yaml = option_content(group, "default")
    assert set(yaml) == {f.name for f in dataclasses.fields(options)}
    assert options.from_config(yaml) == options()
    for name, value in yaml.items():
        default = getattr(options(), name)
        assert value == default and type(value) in (type(default), int if type(default) is float else None), name


def test_report_options_from_config():
    assert ReportOptions.from_config(None) == ReportOptions()
    assert ReportOptions.from_config({"figures": False}).figures is False
    with pytest.raises(ConfigError, match="nope"):
        ReportOptions.from_config({"nope": 1})
    with pytest.raises(ConfigError, match="report.enabled"):
        ReportOptions.from_config({"enabled": "yes"})


def test_bench_options_from_config():
    assert BenchOptions.from_config(None) == BenchOptions()
    with pytest.raises(ConfigError, match="nope"):
        BenchOptions.from_config({"nope": 1})
    with pytest.raises(ConfigError):
        BenchOptions.from_config({"warmup": -1})


def test_restrict_limits_codecs_to_pipelines(tmp_path):
    cfg = composed(BASE + ["codec=[zstd,bz2]", "pipeline=[raw,bytegroup]", "+restrict.bz2=[bytegroup]"])
    assert cli.build(cfg)[5] == {"bz2": ["bytegroup"]}
    with pytest.raises(ConfigError, match="restrict.bz2"):
        cli.build(composed(BASE + ["codec=[zstd,bz2]", "pipeline=[raw]", "+restrict.bz2=[bytegroup]"]))


@pytest.mark.parametrize("name", group_options("experiment"))
def test_every_experiment_preset_composes_builds_and_has_a_renderer(name, tmp_path):
    cfg = composed([f"experiment={name}", f"source.cache_dir={tmp_path}"])
    assert cfg.experiment_name == name
    source, pipelines, codecs, opts, notes, restrict = cli.build(cfg)
    for cname, plist in restrict.items():
        assert cname in cfg.codec and set(plist) <= set(pipelines)
    assert os.path.exists(os.path.join(EXPERIMENTS_DIR, f"{name}.py"))
    header = open(f"{cli.CONF_DIR}/experiment/{name}.yaml").read().splitlines()[:15]
    assert any(f"lmcbench experiment={name}" in line for line in header), "the header comment names the command"


def _imports(path, prefix="lmcbench") -> set[str]:
    """The modules under ``prefix`` (lmcbench) a file imports, anywhere in it (absolute names)."""
    import ast

    pkg = list(path.relative_to(REPO).parts[:-1])  # the package the file is in (relative imports start there)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out |= {name} | {f"{name}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m == prefix or m.startswith(prefix + ".")}


def test_layers():
    """Each layer imports only those below it: the tiny GPT only the checkpoint formats (lmc.formats), sources and
    the lossy package those two (never each other), bench no report, report neither bench nor the command line,
    transforms none of them; the lmc distribution (its formats package, its benchmarks and its tests too: every
    file under codecs/lmc) nothing of lmcbench, codecs/lmc/benchmarks (but studies/) none of lmc's private modules,
    no script loose in codecs/lmc or results/, and lmcbench has no second copy of the formats."""

    root = REPO / "lmcbench"
    above = ("lmcbench.bench", "lmcbench.report", "lmcbench.cli", "lmcbench.lossy", "lmcbench.experiments")
    rules = {"bench": ("lmcbench.report", "lmcbench.cli", "lmcbench.lossy"),
             "report": ("lmcbench.bench", "lmcbench.cli", "lmcbench.lossy"),
             "transforms": ("lmcbench.bench", "lmcbench.report", "lmcbench.cli", "lmcbench.sources"),
             "tinygpt": above + ("lmcbench.sources", "lmcbench.transforms"),
             "sources": ("lmcbench.bench", "lmcbench.report", "lmcbench.cli", "lmcbench.lossy"),
             "lossy": ("lmcbench.sources", "lmcbench.report", "lmcbench.cli", "lmcbench.bench.runner"),
             "store": ("lmcbench.sources", "lmcbench.report", "lmcbench.cli", "lmcbench.bench.runner",
                       "lmcbench.bench.measure", "lmcbench.lossy", "lmcbench.transforms", "lmcbench.codecs")}
    for pkg, banned in rules.items():
        files = list((root / pkg).rglob("*.py"))
        assert files, pkg
        for f in files:
            bad = [m for m in _imports(f) if m.startswith(banned)]
            assert not bad, f"{f.relative_to(root)} imports {bad}"
    lmc_files = list((REPO / "codecs" / "lmc" / "lmc").rglob("*.py"))
    assert any(f.parent.name == "formats" for f in lmc_files)
    # the whole lmc distribution (lmc/, benchmarks/, tests/, anything else under codecs/lmc) imports no lmcbench
    dist = list((REPO / "codecs" / "lmc").rglob("*.py"))
    assert {"lmc", "benchmarks", "tests"} <= {f.relative_to(REPO / "codecs" / "lmc").parts[0] for f in dist}
    assert not [f"{f.relative_to(REPO)}: {sorted(_imports(f))}" for f in dist if _imports(f)]
    # no script lies loose in codecs/lmc (benchmarks/ holds them) or in results/
    assert not list((REPO / "codecs" / "lmc").glob("*.py")) and not list((REPO / "results").rglob("*.py"))
    # benchmarks/ (but studies/) uses lmc's public API: none of its private modules, nor a private name of lmc
    bench = REPO / "codecs" / "lmc" / "benchmarks"
    public = set(__import__("lmc").__all__)
    for f in bench.rglob("*.py"):
        if "studies" in f.relative_to(bench).parts:
            continue
        used = _imports(f, "lmc")
        bad = sorted(m for m in used if any(p.startswith("_") for p in m.split(".")[1:])
                     or m.startswith("lmc.kernels")  # the codec's kernels: internal, however named
                     or (m.count(".") == 1 and m.split(".")[1] not in public
                         and not (REPO / "codecs" / "lmc" / m.replace(".", "/")).exists()
                         and not (REPO / "codecs" / "lmc" / (m.replace(".", "/") + ".py")).exists()))
        assert not bad, f"{f.relative_to(REPO)} imports lmc's private {bad}"
    assert not (root / "checkpoints").exists()  # every format lives once, in lmc.formats
    # the layers inside lmc itself (codec, storage, formats, archive and dcp, hf): codecs/lmc/tests/test_layers.py


def test_peak_memory_preset(monkeypatch, tmp_path):
    """``lmcbench experiment=peak_memory`` composes (task: experiment) and runs experiments/peak_memory.py's run
    with the preset's sizes into <results_dir>/peak_memory/; a bad size fails in one line before measuring."""
    from lmcbench.experiments import peak_memory

    cfg = composed(["experiment=peak_memory", f"results_dir={tmp_path}"])
    assert cfg.task == "experiment" and cfg.experiment_name == "peak_memory"
    assert list(cfg.peak_memory.mib) == [256, 512]
    assert composed(["experiment=peak_memory", "peak_memory.mib=[8]"]).peak_memory.mib == [8]
    calls = []
    monkeypatch.setattr(peak_memory, "write", lambda mibs, out, command: calls.append((list(mibs), out)) or "r.md")
    assert cli.run_task(cfg, str(tmp_path / "run")) == {"report": "r.md"}
    assert calls == [([256, 512], str(tmp_path / "peak_memory"))]
    assert (tmp_path / "run" / "config.yaml").is_file()
    with pytest.raises(ConfigError, match="peak_memory.mib"):
        cli.run_task(composed(["experiment=peak_memory", "peak_memory.mib=[0]"]), str(tmp_path / "run2"))
