"""Small multiples: one panel per (row, column) pair of values (kind x transform, dtype x kind, ...), and
saving a figure. Used by the run report's figures and by the experiments' renderers."""

from __future__ import annotations

import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def facet_grid(rows: list, cols: list, draw, *, panel=(3.6, 2.7), title=None, title_size=9, col_titles=False,
               row_label=None, xlabel="training step", legend="first", **subplots_kw):
    """A ``len(rows) x len(cols)`` grid; ``draw(ax, row, col)`` fills each panel, and a panel it returns
    ``False`` for is left blank (no data there). Every other panel gets a grid, ``title(row, col)`` as its
    title (or, with ``col_titles``, the top row the column's value), and the first column ``row_label(row)``
    as its y label; the bottom row gets ``xlabel``. ``legend``: ``"first"`` (in the top-left panel),
    ``"figure"`` (one legend above the grid, from the panel with the most entries) or None (``draw`` places
    its own). Returns the figure and the 2-D array of axes; :func:`save` writes it."""
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(panel[0] * len(cols), panel[1] * len(rows)),
                             squeeze=False, **subplots_kw)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            ax = axes[i][j]
            if draw(ax, r, c) is False:
                ax.axis("off")
                continue
            ax.grid(alpha=0.3)
            if title is not None:
                ax.set_title(title(r, c), fontsize=title_size)
            if col_titles and i == 0:
                ax.set_title(str(c), fontsize=10)
            if row_label is not None and j == 0:
                ax.set_ylabel(row_label(r))
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    if legend == "first":
        axes[0][0].legend(fontsize=7)
    elif legend == "figure":
        handles, labels = axes[0][0].get_legend_handles_labels()
        for row in axes:
            for ax in row:
                h, lab = ax.get_legend_handles_labels()
                if len(lab) > len(labels):
                    handles, labels = h, lab
        fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 9), frameon=False)
    return fig, axes


def save(fig, path: str, suptitle: str | None = None, rect=None, tight: bool = True, dpi: int = 110,
         **savefig_kw) -> str:
    """Lay out (``tight_layout`` within ``rect``, unless ``tight=False``), write ``path`` and close the figure;
    returns the file's name."""
    if suptitle is not None:
        fig.suptitle(suptitle)
    if tight:
        fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi, **savefig_kw)
    plt.close(fig)
    return os.path.basename(path)


def where(df, **equal):
    """The rows of ``df`` whose columns equal the values given (``where(df, dtype=d, kind=k)``)."""
    mask = np.ones(len(df), bool)
    for col, value in equal.items():
        mask = mask & (df[col] == value)
    return df[mask]
