"""Render ``lmcbench experiment=excp`` into results/excp/ (LOSSY): the loss curves of the uncompressed run and of
the run that resumes from reconstructed checkpoints, with the compressed checkpoint sizes (the ExCP paper's
figure); the table in the paper's shape; the sweep of alpha, beta and bits; the archiver's share.

Re-render an existing run:  python experiments/excp.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import MiB, finish, header, load_environment, md_table  # noqa: E402
from lmcbench.report.facets import save  # noqa: E402


def _read(run_dir, name):
    p = os.path.join(run_dir, name)
    return pd.read_csv(p) if os.path.exists(p) and os.path.getsize(p) > 0 else pd.DataFrame()


def paper_table(ck: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """Original / residual + archiver / ExCP: mean size of a checkpoint (over the compressed ones, the first of
    the chain excluded), ratio, and the final held-out loss of the run they belong to."""
    base = ck[ck["run"] == "baseline"]
    later = base[~base["method"].str.contains("first")]
    res = later[later["method"] == "residual+archiver"]
    comp = ck[(ck["run"] == "compressed") & ~ck["method"].str.contains("first")]
    full = comp["full_bytes"].mean()
    arch = f"{summary['config']['archiver']}-{summary['config'].get('archiver_level') or 'default'}"
    rows = [("original (fp32 weights + both Adam moments)", full, summary["final_eval_loss_baseline"], "lossless"),
            (f"residual + {arch}", res["comp_bytes"].mean(), summary["final_eval_loss_baseline"], "lossless"),
            (f"ExCP (+ {arch})", comp["comp_bytes"].mean(), summary["final_eval_loss_compressed"], "LOSSY")]
    return pd.DataFrame([{"method": m, "size per checkpoint (MiB)": f"{b / MiB:.2f}", "ratio": f"{full / b:.1f}x",
                          "final held-out loss": f"{loss:.4f}", "": tag} for m, b, loss, tag in rows]).set_index("method")


def render(run_dir: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    env = load_environment(run_dir)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    ck, sw, ar = _read(run_dir, "excp_checkpoints.csv"), _read(run_dir, "excp_sweep.csv"), \
        _read(run_dir, "excp_archivers.csv")
    cfg = summary["config"]
    lines = header("ExCP: lossy checkpoint compression, judged by resumed training (LOSSY)", env,
                   "Every result on this page is **lossy** and is kept apart from the lossless tables. ExCP as its "
                   "authors' code runs it: the residual against the reconstructed previous checkpoint, weight pruning "
                   "driven by Adam's second moment, moment pruning driven by the first moment and the weight mask, "
                   f"{cfg['bits']}-bit k-means quantization (index 0 = zero), then an archiver. The compressed run "
                   f"stops every {summary['resume_every']} checkpoints and resumes from the reconstruction, same seed "
                   "and data order; held-out loss is the mean cross-entropy over fixed windows of the validation "
                   "split.")
    diff = summary["final_eval_loss_rel_diff"]
    ok = summary["ratio_full"] >= 25 and abs(diff) <= 0.02
    lines += ["## Result", "",
              f"- model: {summary['n_params'] / 1e6:.1f}M parameters; checkpoints at steps "
              f"{summary['steps'][0]}..{summary['steps'][-1]} ({len(summary['steps'])}); full checkpoint = fp32 "
              "weights + both Adam moments (12 bytes per parameter)",
              f"- config: alpha {cfg['alpha']:g}, beta {cfg['beta']:g}, {cfg['bits']} bits, archiver "
              f"{cfg['archiver']}{'' if cfg.get('archiver_level') is None else '-' + str(cfg['archiver_level'])}",
              f"- **ratio_full {summary['ratio_full']:.1f}x** (mean over the compressed run's lossy checkpoints; "
              f"{summary['ratio_full_total']:.1f}x in total bytes; {summary['ratio_full_baseline_chain']:.1f}x on "
              "the baseline run's chain)",
              f"- **final held-out loss {summary['final_eval_loss_compressed']:.4f}** (the compressed run's last "
              f"checkpoint, reconstructed) vs **{summary['final_eval_loss_baseline']:.4f}** uncompressed: "
              f"{100 * diff:+.2f}% (the live model of the compressed run: "
              f"{summary['final_eval_loss_compressed_live']:.4f})",
              f"- target (at least 25x, loss within 2%): {'met' if ok else 'NOT met'}", ""]
    if not ck.empty:
        lines += ["## The paper's table", "", md_table(paper_table(ck, summary)), ""]
    made = [_plot_curves(ck, os.path.join(out_dir, "loss_and_size.png"), summary)] if not ck.empty else []
    if not ck.empty:
        comp = ck[ck["run"] == "compressed"].copy()
        t = comp[["step", "method", "ratio", "resumed_here", "eval_loss", "eval_loss_recon", "weight_rel_l2",
                  "exp_avg_rel_l2", "exp_avg_sq_rel_l2", "weight_kept", "moment_kept"]].copy()
        base = ck[(ck["run"] == "baseline") & (ck["method"].str.startswith("excp"))].set_index("step")["eval_loss"]
        t.insert(4, "baseline loss", t["step"].map(base))
        for c in ("ratio",):
            t[c] = t[c].map(lambda v: f"{v:.1f}")
        for c in ("eval_loss", "eval_loss_recon", "baseline loss"):
            t[c] = t[c].map(lambda v: f"{v:.4f}")
        for c in ("weight_rel_l2", "exp_avg_rel_l2", "exp_avg_sq_rel_l2", "weight_kept", "moment_kept"):
            t[c] = t[c].map(lambda v: f"{v:.3f}")
        t = t.rename(columns={"eval_loss": "loss (live)", "eval_loss_recon": "loss (reconstructed)",
                              "resumed_here": "resumed from recon."}).set_index("step")
        lines += ["## The compressed run, checkpoint by checkpoint", "",
                  "rel_l2 = ||x_rec - x|| / ||x|| per tensor, averaged weighted by size (for weights against W_t); "
                  "kept = fraction of values left non-zero by pruning.", "", md_table(t, "step"), ""]
    if not sw.empty:
        s = sw.copy()
        s["loss change"] = (s["eval_loss_recon"] / s["eval_loss_orig"] - 1).map(lambda v: f"{100 * v:+.2f}%")
        for c in ("ratio",):
            s[c] = s[c].map(lambda v: f"{v:.1f}x")
        for c in ("weight_rel_l2", "exp_avg_rel_l2", "exp_avg_sq_rel_l2", "weight_kept", "moment_kept"):
            s[c] = s[c].map(lambda v: f"{v:.3f}")
        s["eval_loss_recon"] = s["eval_loss_recon"].map(lambda v: f"{v:.4f}")
        s = s[["knob", "alpha", "beta", "bits", "ratio", "weight_kept", "moment_kept", "weight_rel_l2",
               "exp_avg_rel_l2", "eval_loss_recon", "loss change"]].set_index("knob")
        lines += [f"## Sweep (one knob at a time, baseline run, checkpoints {sw['steps'].iloc[0]})", "",
                  "ratio = mean over the chain's lossy checkpoints; loss = the last checkpoint's weights as "
                  f"reconstructed, against the original's {sw['eval_loss_orig'].iloc[0]:.4f} (no training after "
                  "the reconstruction).", "", md_table(s, "knob"), ""]
        made.append(_plot_sweep(sw, os.path.join(out_dir, "sweep.png")))
    if not ar.empty:
        a = ar.copy()
        a["archiver"] = [f"{n}" + ("" if pd.isna(lv) or lv == "" else f"-{int(lv)}") for n, lv in zip(a["archiver"], a["level"])]
        a["ratio"] = a["ratio"].map(lambda v: f"{v:.1f}x")
        a["comp_bytes"] = (a["comp_bytes"] / MiB).map(lambda v: f"{v:.2f}")
        a = a[["archiver", "comp_bytes", "ratio", "seconds"]].rename(columns={"comp_bytes": "MiB"}).set_index("archiver")
        lines += [f"## The archiver's share (the same ExCP payload of step {int(ar['step'].iloc[0])}, single thread)",
                  "", md_table(a, "archiver"), ""]
    made = [m for m in made if m]
    lines += ["## Figures", ""] + [f"![{m}]({m})" for m in made] + [""]
    for name in ("excp_checkpoints.csv", "excp_sweep.csv", "excp_archivers.csv", "summary.json"):
        if os.path.exists(os.path.join(run_dir, name)):
            shutil.copy(os.path.join(run_dir, name), os.path.join(out_dir, name))
    _per_kind(run_dir, out_dir)
    return finish(run_dir, out_dir, lines)


def _per_kind(run_dir, out_dir):
    """Compact per-tensor statistics: per run, step, method and kind (the run folder keeps every tensor)."""
    t = _read(run_dir, "excp_tensors.csv")
    if t.empty:
        return
    t["w"] = t["numel"]
    g = t.groupby(["run", "step", "method", "kind"]).apply(
        lambda x: pd.Series({"numel": x["numel"].sum(),
                             "kept_fraction": (x["kept_fraction"] * x["w"]).sum() / x["w"].sum(),
                             "rel_l2": (x["rel_l2"] * x["w"]).sum() / x["w"].sum(),
                             "max_abs": x["max_abs"].max(), "payload_bytes": x["payload_bytes"].sum()}),
        include_groups=False).reset_index()
    g.to_csv(os.path.join(out_dir, "excp_by_kind.csv"), index=False, float_format="%.6g")


def _plot_curves(ck, path, summary):
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    base = ck[(ck["run"] == "baseline") & ck["method"].str.startswith("excp")].sort_values("step")
    comp = ck[ck["run"] == "compressed"].sort_values("step")
    ax.plot(base["step"], base["eval_loss"], "-o", ms=3, color="black", label="uncompressed run")
    ax.plot(comp["step"], comp["eval_loss"], "-o", ms=3, color="tab:blue", label="compressed run (live)")
    ax.plot(comp["step"], comp["eval_loss_recon"], "x", color="tab:red", label="compressed run, reconstructed ckpt")
    for s in comp.loc[comp["resumed_here"].astype(bool), "step"]:
        ax.axvline(s, color="tab:blue", alpha=0.25, lw=1)
    ax.set_xlabel("training step (vertical lines: resumed from a reconstructed checkpoint)")
    ax.set_ylabel("held-out loss")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    lossy = comp[comp["lossy"].astype(bool)]
    width = 0.35 * (lossy["step"].diff().median() if len(lossy) > 1 else 1)
    ax2.bar(lossy["step"], lossy["comp_bytes"] / MiB, width=width, color="tab:orange", alpha=0.35,
            label="ExCP checkpoint size")
    ax2.set_ylabel(f"compressed checkpoint (MiB); full = {comp['full_bytes'].iloc[0] / MiB:.0f} MiB")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper right")
    ax.set_title(f"ExCP on {summary['n_params'] / 1e6:.0f}M params: {summary['ratio_full']:.1f}x, final loss "
                 f"{100 * summary['final_eval_loss_rel_diff']:+.2f}% (lossy)", fontsize=10)
    return save(fig, path)


def _plot_sweep(sw, path):
    fig, ax = plt.subplots(figsize=(6.2, 4))
    marks = {"main": "*", "alpha": "o", "beta": "s", "bits": "^"}
    for knob, g in sw.groupby("knob", sort=False):
        ax.scatter(g["ratio"], 100 * (g["eval_loss_recon"] / g["eval_loss_orig"] - 1), marker=marks.get(knob, "o"),
                   s=60 if knob == "main" else 30, label=knob)
        if knob != "main":
            for _, r in g.iterrows():
                ax.annotate(f"{r[knob]:g}", (r["ratio"], 100 * (r["eval_loss_recon"] / r["eval_loss_orig"] - 1)),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("ratio (full fp32 checkpoint / ExCP)")
    ax.set_ylabel("held-out loss change of the reconstruction (%)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("ExCP sweep: alpha, beta, bits (lossy)", fontsize=10)
    return save(fig, path)


if __name__ == "__main__":
    from _common import main

    main(render, "excp", __doc__)
