"""``lmcbench experiment=lossy`` (LOSSY): the frontier of lossy checkpoint methods on one tinygpt series, judged
by resumed training (training stops every ``lossy.resume_every`` checkpoints and resumes from the
reconstruction, same seed and data order; the final held-out loss against the uncompressed run's) and, labelled
beside it, by the reconstruction alone. Writes frontier.csv, lossy_checkpoints.csv, summary.json, report.md and
frontier.png into results/lossy/ (the lossless records.csv is never written).

Re-render an existing result folder:  python experiments/lossy.py RESULTS_DIR [OUT_DIR]
Merge result folders of the same series (points measured by separate processes) and render them:
    python experiments/lossy.py --merge OUT_DIR RESULTS_DIR...
"""

from __future__ import annotations

import json
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import md_table  # noqa: E402
from lmcbench.report.facets import save  # noqa: E402
from lmcbench.report.header import collect  # noqa: E402
from lmcbench.report.header import lines as header_lines  # noqa: E402

BUDGETS = (0.25, 0.5, 1.0, 2.0)  # loss budgets (% final held-out loss) of the targets
ANCHORS = ("excp", "sz3", "zfp", "adam8bit", "bitsnap")
OURS = "efq"
TARGET = (70.0, 1.0)  # ratio, loss change (%)
CAP = 50.0  # the figure's top: a run that diverged is drawn there (^), its value is in the table


def run(c: dict, out: str) -> str:
    """``task: experiment``: measure the frontier into ``out`` and render it; returns the report's path."""
    from lmcbench.lossy.frontier import run_frontier

    command = " ".join(["lmcbench"] + sys.argv[1:])
    env = collect(command, source=str((c.get("source") or {}).get("type")))
    os.makedirs(out, exist_ok=True)
    run_frontier(c, out, log=lambda m: print(m, file=sys.stderr))
    with open(os.path.join(out, "environment.json"), "w") as f:
        json.dump(env, f, indent=1, default=str)
    return render(out, out)


def merge(run_dirs: list[str], out: str) -> str:
    """Concatenate the frontiers of several result folders of one series (same steps, same baseline losses)
    into ``out`` and render it; the report lists each folder's command."""
    import shutil

    sums, envs = [], []
    for d in run_dirs:
        with open(os.path.join(d, "summary.json")) as f:
            sums.append(json.load(f))
        p = os.path.join(d, "environment.json")
        envs.append(json.load(open(p)) if os.path.exists(p) else {})
    for s in sums[1:]:
        if s["steps"] != sums[0]["steps"] or s["baseline_losses"] != sums[0]["baseline_losses"] \
                or s["resume_every"] != sums[0]["resume_every"]:
            raise SystemExit("merge: the folders are not of one series, resume_every and evaluation")
    os.makedirs(out, exist_ok=True)
    for name in ("frontier.csv", "lossy_checkpoints.csv"):
        pd.concat([pd.read_csv(os.path.join(d, name)) for d in run_dirs]).to_csv(os.path.join(out, name), index=False)
    summary = {**sums[0], "points": sum(s["points"] for s in sums), "complete": all(s.get("complete") for s in sums),
               "seconds": max(s["seconds"] or 0 for s in sums), "commands": [e.get("command", "?") for e in envs],
               "skipped": {k: v for s in sums for k, v in (s.get("skipped") or {}).items()}}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if envs[0]:
        shutil.copy(os.path.join(run_dirs[0], "environment.json"), os.path.join(out, "environment.json"))
    return render(out, out)


def best_under(fr: pd.DataFrame, budget: float) -> pd.Series:
    """Per method, the best ratio among its resumed points within ``budget`` % loss change (NaN: none)."""
    r = fr[(fr["judged"] == "resumed") & (fr["loss_change_pct"] <= budget)]
    return r.groupby("method")["ratio"].max()


def render(run_dir: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    fr = pd.read_csv(os.path.join(run_dir, "frontier.csv"))
    ck = pd.read_csv(os.path.join(run_dir, "lossy_checkpoints.csv"))
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    env = {}
    if os.path.exists(os.path.join(run_dir, "environment.json")):
        with open(os.path.join(run_dir, "environment.json")) as f:
            env = json.load(f)
    t = summary["train"]
    runs = summary.get("commands")
    lines = header_lines(
        "Lossy frontier: ratio against final held-out loss, judged by resumed training (LOSSY)", env,
        "Every result on this page is **lossy** and kept apart from the lossless tables. Each method compresses "
        "the series as a chain (the first checkpoint whole and lossless, each later one against the previous "
        f"*reconstruction*). **resumed**: the training stops every {summary['resume_every']} checkpoints, "
        "compresses its checkpoint and resumes from the reconstruction (same seed, same data order); the final "
        "loss is the held-out loss of the run's last checkpoint as reconstructed. **reconstruction**: the chain "
        "over the uncompressed series, no training after any reconstruction (the last checkpoint's loss). "
        "ratio = full checkpoint (fp32 weights + both Adam moments) / blob, the mean over the chain's checkpoints "
        "after the first.", runs=runs)
    lines += [f"- series: tinygpt {t['n_layer']} layers x {t['n_embd']}, {summary['n_params'] / 1e6:.2f}M "
              f"parameters, checkpoints at steps {summary['steps'][0]}..{summary['steps'][-1]} "
              f"({len(summary['steps'])}); held-out loss over {summary['eval_batches']} batches",
              f"- uncompressed final held-out loss: {summary['baseline_losses'][str(summary['steps'][-1])]:.4f}",
              (f"- measured in {summary['seconds'] / 60:.0f} min" + (" (the longest of the merged runs, which ran side "
                                                                    "by side)" if runs else "")
               if summary.get("complete")
               else "- **the run did not finish**: the points below are those it measured")]
    for name, why in (summary.get("skipped") or {}).items():
        lines.append(f"- **{name} skipped**: {why}")
    lines.append("")
    made = plot(fr, os.path.join(out_dir, "frontier.png"))
    lines += ["## Frontier", "", f"![ratio against loss change]({os.path.basename(made)})", ""]
    res = fr[fr["judged"] == "resumed"]
    if not res.empty:
        tab = pd.DataFrame({f"<= +{b:g}%": best_under(fr, b) for b in BUDGETS})
        tab = tab.reindex(sorted(set(fr["method"]), key=_order)).map(lambda v: "-" if pd.isna(v) else f"{v:.1f}x")
        lines += ["## Best ratio within a loss budget (resumed)", "",
                  "The largest ratio among a method's settings whose final held-out loss is within the budget "
                  "('-': no setting is).", "", md_table(tab, "method"), ""]
        ours = res[res["method"] == OURS]
        hit = ours[(ours["ratio"] >= TARGET[0]) & (ours["loss_change_pct"] <= TARGET[1])]
        lines += [f"- target ({OURS} at >= {TARGET[0]:g}x within +{TARGET[1]:g}%, resumed): "
                  + (f"met on this series ({', '.join(hit['setting'])})" if not hit.empty else "not met on this series"),
                  ""]
    t = fr.copy()
    for col, fmt in (("ratio", "{:.1f}x"), ("ratio_total", "{:.1f}x"), ("final_loss", "{:.4f}"),
                     ("baseline_loss", "{:.4f}"), ("loss_change_pct", "{:+.2f}%"), ("weight_rel_l2", "{:.4f}"),
                     ("exp_avg_rel_l2", "{:.3f}"), ("exp_avg_sq_rel_l2", "{:.3f}")):
        t[col] = t[col].map(lambda v, f=fmt: f.format(v))
    t = t[["method", "setting", "judged", "ratio", "ratio_total", "final_loss", "baseline_loss", "loss_change_pct",
           "weight_rel_l2", "exp_avg_rel_l2", "exp_avg_sq_rel_l2", "seconds"]]
    lines += ["## Every point", "", "rel_l2 = ||x_rec - x|| / ||x|| per tensor, mean over tensors and checkpoints.",
              "", md_table(t.set_index("method"), "method"), ""]
    lines += per_checkpoint(fr, ck)
    for d in dict.fromkeys([run_dir, out_dir]):  # notes written by hand beside the results, kept on re-rendering
        if os.path.exists(os.path.join(d, "notes.md")):
            lines += [open(os.path.join(d, "notes.md")).read().rstrip(), ""]
            break
    if os.path.abspath(run_dir) != os.path.abspath(out_dir):
        import shutil

        for name in ("frontier.csv", "lossy_checkpoints.csv", "summary.json", "environment.json", "notes.md"):
            if os.path.exists(os.path.join(run_dir, name)):
                shutil.copy(os.path.join(run_dir, name), os.path.join(out_dir, name))
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.join(out_dir, "report.md")


def _order(m: str) -> tuple:
    return (ANCHORS.index(m) if m in ANCHORS else len(ANCHORS), m)


def per_checkpoint(fr: pd.DataFrame, ck: pd.DataFrame) -> list[str]:
    """The compressed run checkpoint by checkpoint for each method's best resumed point within +1% (else its
    smallest loss change)."""
    res = fr[fr["judged"] == "resumed"]
    if res.empty:
        return []
    out = ["## The best points, checkpoint by checkpoint (resumed)", "",
           "Per method its best setting within +1% (else its smallest loss change). loss (live): the training "
           "run's own checkpoint; loss (recon.): its reconstruction (measured at resumes and at the end).", ""]
    for m in sorted(set(res["method"]), key=_order):
        g = res[res["method"] == m]
        ok = g[g["loss_change_pct"] <= 1.0]
        best = ok.loc[ok["ratio"].idxmax()] if not ok.empty else g.loc[g["loss_change_pct"].idxmin()]
        c = ck[(ck["method"] == m) & (ck["setting"] == best["setting"]) & (ck["judged"] == "resumed")].copy()
        c["ratio"] = c["ratio"].map(lambda v: f"{v:.1f}x")
        for col in ("eval_loss", "eval_loss_recon", "baseline_loss"):
            c[col] = c[col].map(lambda v: "" if pd.isna(v) else f"{v:.4f}")
        c = c[["step", "ratio", "comp_bytes", "resumed_here", "eval_loss", "eval_loss_recon", "baseline_loss"]]
        c = c.rename(columns={"eval_loss": "loss (live)", "eval_loss_recon": "loss (recon.)",
                              "baseline_loss": "uncompressed"}).set_index("step")
        out += [f"### {m} {best['setting']}: {best['ratio']:.1f}x, {best['loss_change_pct']:+.2f}%", "",
                md_table(c, "step"), ""]
    return out


def _curve(r) -> str:
    """The curve a point belongs to: its method, and for ours the step allocation, the coder and the
    reconstruction of the codes."""
    keys = ("alloc=", "coder=", "recon=")
    opts = [p for p in str(r["setting"]).split(",") if p.startswith(keys)]
    return r["method"] + (f" {' '.join(opts)}" if opts else "")


def pareto(g: pd.DataFrame) -> pd.Series:
    """Which points of one curve are on its frontier: no other point has a ratio at least as high and a smaller
    loss change."""
    keep, best = pd.Series(False, index=g.index), float("inf")
    for idx, r in g.sort_values(["ratio", "loss_change_pct"], ascending=[False, True]).iterrows():
        if r["loss_change_pct"] < best:
            keep[idx], best = True, r["loss_change_pct"]
    return keep


def plot(fr: pd.DataFrame, path: str) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fr = fr.assign(curve=[_curve(r) for _, r in fr.iterrows()])
    ctrl = fr["setting"].astype(str).str.contains("control")
    for _, r in fr[ctrl].iterrows():
        ax.plot(r["ratio"], min(r["loss_change_pct"], CAP), "*", color="black", ms=9,
                label=f"{r['method']} lossless control ({r['judged']})" if r["judged"] == "resumed" else None)
    fr = fr[~ctrl]
    for i, m in enumerate(sorted(set(fr["curve"]), key=lambda c: _order(c.split()[0]) + (c,))):
        for judged, style in (("resumed", "-o"), ("reconstruction", ":x")):
            g = fr[(fr["curve"] == m) & (fr["judged"] == judged)].sort_values("ratio")
            if g.empty:
                continue
            y = g["loss_change_pct"].clip(upper=CAP)
            # every setting a marker; the line joins the curve's frontier (no other setting of it is both
            # smaller and better), so settings that differ in more than one knob do not zigzag
            front = pareto(g)
            ax.plot(g["ratio"], y, style[-1], color=colors[i % len(colors)], ms=4,
                    alpha=1.0 if judged == "resumed" else 0.6)
            ax.plot(g["ratio"][front], y[front], style, color=colors[i % len(colors)], ms=4,
                    label=f"{m} ({judged})", alpha=1.0 if judged == "resumed" else 0.6)
            off = g["loss_change_pct"] > CAP
            ax.plot(g["ratio"][off], y[off], "^", color=colors[i % len(colors)], ms=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(TARGET[0], color="grey", lw=0.8, ls="--")
    ax.axhline(TARGET[1], color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel("ratio (full fp32 checkpoint with both Adam moments / compressed)")
    ax.set_ylabel(f"final held-out loss change (%; ^ = beyond {CAP:g}%)")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Lossy frontier (solid: resumed training; dotted: reconstruction only)", fontsize=10)
    return save(fig, path)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--merge":
        print(merge(sys.argv[3:], sys.argv[2]))
    else:
        from _common import main

        main(render, "lossy", __doc__)
