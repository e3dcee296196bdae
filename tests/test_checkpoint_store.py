"""``task: store`` (``lmcbench experiment=checkpoint_store``): every method round-trips bit-exactly, the LMC archive is
smaller than torch.save after the first step, the report holds the values of the CSV, bad options are one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from lmcbench import cli
from lmcbench.errors import ConfigError
from lmcbench.store import METHODS, StoreConfig

from lmcbench_testlib import load_experiment, make_trainer_folder, run_cli

MiB = 2**20


def renderer():
    return load_experiment("checkpoint_store")


def big_model_folder(root, steps=(10, 20, 30)):
    """A Trainer folder of a model large enough (~40k parameters) that coding against the previous step pays for
    the archive's own headers: two Linear layers and AdamW with a small learning rate."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    done = 0
    for step in steps:
        for _ in range(step - done):
            x = torch.randn(16, 128)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        done = step
        d = root / f"checkpoint-{step}"
        d.mkdir(parents=True)
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
                  str(d / "model.safetensors"), metadata={"format": "pt"})
        torch.save(opt.state_dict(), d / "optimizer.pt")
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The preset on a small Trainer folder (3 checkpoints, keyframe every 2), through run_task, rendered."""
    base = tmp_path_factory.mktemp("store")
    big_model_folder(base / "train")
    results = base / "results"
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=checkpoint_store", "source=hf_trainer", f"source.path={base / 'train'}",
            "store.keyframe_every=2", f"results_dir={results}"])
    summary = cli.run_task(cfg, str(base / "run"))
    df = pd.read_csv(base / "run" / "store_checkpoints.csv", keep_default_na=False, na_values=[""])
    return base / "run", results / "checkpoint_store", summary, df


def test_every_method_round_trips(run):
    _, _, summary, df = run
    assert summary["verified"] is True
    assert set(summary["methods"]) == set(METHODS), summary["notes"]  # every library is in the test environment
    for variant in ("fp32", "bf16"):
        part = df[df["variant"] == variant]
        assert len(part) == 3 * len(METHODS)
        restored = part[part["restore"].notna()]
        assert set(restored["restore"]) == {"middle", "last"}
        assert len(restored) == 2 * len(METHODS) and restored["verified"].astype(str).eq("True").all()
        assert (part["bytes"] > 0).all() and (part["blocked_s"] >= 0).all()
        assert (part["total_s"] >= part["blocked_s"]).all()
        assert list(part[part["method"] == "lmc_dcp"]["keyframe"].astype(str)) == ["True", "False", "True"]
    # bf16 weights: fewer tensor bytes than fp32
    sb = df.groupby("variant")["state_bytes"].first()
    assert sb["bf16"] < sb["fp32"]


def test_lmc_archive_is_smaller_than_torch_save_after_the_first_step(run):
    _, _, _, df = run
    for variant in ("fp32", "bf16"):
        part = df[df["variant"] == variant]
        ts = part[part["method"] == "torch_save"].set_index("step")["bytes"]
        for m in ("lmc_archive", "lmc_archive_bg"):
            a = part[part["method"] == m].set_index("step")["bytes"]
            assert all(a[s] < ts[s] for s in ts.index[1:]), (variant, m, a.to_dict(), ts.to_dict())


def test_the_report_holds_the_values_of_the_csv(run):
    run_dir, out, summary, df = run
    text = (out / "report.md").read_text()
    assert text.startswith("# ") and "- command:" in text
    assert (out / "bytes_and_blocked.png").stat().st_size > 1000
    assert json.loads((out / "summary.json").read_text())["steps"] == [10, 20, 30]
    for variant in ("fp32", "bf16"):
        section = text[text.index(f"## Weights {variant}"):]
        part = df[df["variant"] == variant]
        ref = part[part["method"] == "torch_save"]["bytes"].mean()
        for m in METHODS:
            rows = part[part["method"] == m]
            line = next(ln for ln in section.splitlines() if ln.startswith(f"| {m} |"))
            cells = [c.strip() for c in line.strip("|").split("|")]
            last = rows[rows["restore"] == "last"]["restore_s"].iloc[0]
            middle = rows[rows["restore"] == "middle"]["restore_s"].iloc[0]
            assert cells == [m, f"{rows['bytes'].mean() / MiB:.3f}", f"{ref / rows['bytes'].mean():.3f}",
                             f"{rows['blocked_s'].mean():.4f}", f"{rows['total_s'].mean():.4f}", f"{last:.4f}",
                             f"{middle:.4f}", "yes", f"{rows['save_peak_mib'].max():.0f}",
                             f"{rows['restore_peak_mib'].max():.0f}"]
            # and summary.json's table holds the same numbers
            t = summary["table"][variant][m]
            assert t["mean_bytes"] == pytest.approx(rows["bytes"].mean())
            assert t["mean_blocked_s"] == pytest.approx(rows["blocked_s"].mean())
            assert t["verified"] is True
    assert "LMC archive smaller than torch.save at every step after the first: yes" in text
    # the renderer run again on the run folder gives the same report
    again = renderer().render(str(run_dir), str(out.parent / "again"))
    assert open(again).read() == text


def test_a_trainer_folder_of_the_test_library_round_trips(tmp_path):
    """The shared test folder (safetensors weights, AdamW built from named parameters), a subset of methods."""
    from lmcbench.store import run_store

    make_trainer_folder(tmp_path / "out", steps=(10, 20))
    s = run_store({"source": {"type": "hf_trainer", "path": str(tmp_path / "out")},
                   "store": {"methods": ["torch_save", "zipnn", "lmc_archive", "lmc_dcp"], "variants": ["bf16"]}},
                  str(tmp_path / "run"), log=lambda m: None)
    assert s["verified"] and set(s["table"]["bf16"]) == {"torch_save", "zipnn", "lmc_archive", "lmc_dcp"}
    assert not (tmp_path / "run" / "checkpoints").exists()  # deleted as it went (keep_checkpoints false)


@pytest.mark.parametrize("opts, needle", [
    ({"keyframe_every": 0}, "store.keyframe_every: expected a positive integer"),
    ({"methods": ["torch_save", "pickle"]}, "store.methods: unknown 'pickle'"),
    ({"variants": ["fp8"]}, "store.variants: unknown 'fp8'"),
    ({"variants": []}, "store.variants: expected a non-empty list"),
    ({"threads": 0}, "store.threads: expected a positive integer or null"),
    ({"zstd_level": 30}, "store.zstd_level: expected an integer in [1, 22]"),
    ({"keep_checkpoints": "yes"}, "store.keep_checkpoints: expected true or false"),
    ({"speed": 1}, "store: unknown option(s) speed"),
])
def test_bad_options_are_one_clear_line(opts, needle):
    with pytest.raises(ConfigError) as e:
        StoreConfig.from_options(opts)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_options_on_the_command_line(tmp_path):
    p = run_cli(["experiment=checkpoint_store", "store.keyframe_every=0", f"hydra.run.dir={tmp_path / 'run'}",
                 f"results_dir={tmp_path / 'res'}"], cwd=tmp_path, cache=tmp_path / "cache")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "lmcbench: error: store.keyframe_every: expected a positive integer (checkpoints), got 0"]
    p = run_cli(["experiment=checkpoint_store", "source=files", "source.path=/nonexistent",
                 f"hydra.run.dir={tmp_path / 'run2'}"], cwd=tmp_path, cache=tmp_path / "cache")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_tiled_series_and_peak_memory(tmp_path):
    """store.tile=2: each replayed checkpoint is two consecutive ones concatenated tensor by tensor (twice the
    bytes, one checkpoint fewer), restored bit-exactly; every save and restore has its peak RSS rise recorded."""
    import torch

    from lmcbench.store.methods import tensors_of
    from lmcbench.store.run import load_state, load_tiled

    big_model_folder(tmp_path / "train")
    a, b = load_state(str(tmp_path / "train" / "checkpoint-10"), "float32"), \
        load_state(str(tmp_path / "train" / "checkpoint-20"), "float32")
    t = load_tiled([str(tmp_path / "train" / "checkpoint-10"), str(tmp_path / "train" / "checkpoint-20")], "float32")
    for k, v in a["model"].items():
        assert torch.equal(t["model"][k], torch.cat([v, b["model"][k]]))
    st = t["optimizer"]["state"][0]
    assert torch.equal(st["exp_avg"], torch.cat([a["optimizer"]["state"][0]["exp_avg"],
                                                 b["optimizer"]["state"][0]["exp_avg"]]))
    assert torch.equal(st["step"], a["optimizer"]["state"][0]["step"])  # 0-dim: the first one's
    assert t["optimizer"]["param_groups"] == a["optimizer"]["param_groups"]
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=checkpoint_store", "source=hf_trainer", f"source.path={tmp_path / 'train'}",
            "store.tile=2", "store.variants=[fp32]", "store.methods=[torch_save,lmc_dcp]",
            f"results_dir={tmp_path / 'results'}"])
    summary = cli.run_task(cfg, str(tmp_path / "run"))
    df = pd.read_csv(tmp_path / "run" / "store_checkpoints.csv", keep_default_na=False, na_values=[""])
    assert summary["verified"] is True and summary["tile"] == 2 and summary["steps"] == [10, 20]
    tiled_bytes = sum(x.numel() * x.element_size() for x in tensors_of(t))
    assert df[df["step"] == 10]["state_bytes"].iloc[0] == tiled_bytes
    assert df["save_peak_mib"].notna().all() and (df["save_peak_mib"] >= 0).all()
    restored = df[df["restore"].notna()]
    assert len(restored) == 4 and (restored["restore_peak_mib"] >= 0).all()
    report = (tmp_path / "results" / "checkpoint_store" / "report.md").read_text()
    assert "a tiled series" in report and "save peak MiB (max)" in report
    with pytest.raises(ConfigError, match="store.tile"):
        StoreConfig.from_options({"tile": 0})


def test_peak_rss_rise_sees_what_a_call_touches():
    """The store's memory column: the peak RSS rise after a reset sees a 64 MiB buffer that was touched and freed
    (RSS, not tracemalloc: memory Numba or mmap allocates counts as well), and not one freed before the reset."""
    import numpy as np

    from lmcbench.store.run import _peak_mib, reset_peak

    base = reset_peak()
    if base is None:
        pytest.skip("no /proc/self/clear_refs here")
    a = np.ones(64 * MiB, np.uint8)  # touched
    del a
    assert _peak_mib(base) >= 60
    base = reset_peak()
    assert _peak_mib(base) < 60


def test_bytes_are_what_each_save_added(tmp_path):
    """A save's bytes are what it added to storage: the LMC DCP writer re-codes the previous checkpoint against
    the new one, so the rows of a method add up to what its folder holds at the end (the archive: run.lmca)."""
    from lmcbench.store.methods import dir_bytes

    big_model_folder(tmp_path / "train", steps=(10, 20, 30, 40))
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=checkpoint_store", "source=hf_trainer", f"source.path={tmp_path / 'train'}",
            "store.variants=[fp32]", "store.methods=[torch_save,lmc_dcp,lmc_archive]", "store.keep_checkpoints=true",
            f"results_dir={tmp_path / 'results'}"])
    cli.run_task(cfg, str(tmp_path / "run"))
    df = pd.read_csv(tmp_path / "run" / "store_checkpoints.csv", keep_default_na=False, na_values=[""])
    kept = tmp_path / "run" / "checkpoints" / "fp32"
    assert df[df["method"] == "torch_save"]["bytes"].sum() == dir_bytes(str(kept / "torch_save"))
    assert df[df["method"] == "lmc_dcp"]["bytes"].sum() == dir_bytes(str(kept / "lmc_dcp"))
    assert df[df["method"] == "lmc_archive"]["bytes"].sum() == dir_bytes(str(kept / "lmc_archive" / "run.lmca"))
    # and a step after the first adds less than its keyframe would: the previous one shrank
    lmc = df[df["method"] == "lmc_dcp"]["bytes"].tolist()
    assert all(b < lmc[0] for b in lmc[1:])
