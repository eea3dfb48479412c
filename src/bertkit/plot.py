"""Training curves of a pre-training run: RUN_DIR/metrics.jsonl → RUN_DIR/curves.png.

Three panels against the optimizer step: loss (train MLM + NSP, and held-out), accuracy (MLM and
NSP, train and held-out) and the learning rate. matplotlib is an optional dependency
(`pip install bertkit[plot]`), imported only here.
"""

from __future__ import annotations

import os
from pathlib import Path

from bertkit.fileio import atomic_path
from bertkit.train.state import read_metrics


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Draw the curves of `run_dir` into `out` (default RUN_DIR/curves.png); returns the path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'bertkit[plot]' "
                          "(or pip install matplotlib)") from None
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if r.get("split", "train") == "train"]
    held_out = [r for r in records if r.get("split") == "eval"]
    if not train and not held_out:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no records yet; plot after the first "
                         "--log-every steps")

    # Figure + Agg canvas directly, not pyplot: no global backend switch, no window, thread-safe.
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)

    for key, label in (("loss", "train loss"), ("mlm_loss", "train MLM"), ("nsp_loss", "train NSP")):
        xs, ys = _series(train, key)
        if xs:
            ax_loss.plot(xs, ys, label=label, linewidth=1.2 if key == "loss" else 0.8)
    for key, label in (("loss", "held-out loss"), ("mlm_loss", "held-out MLM")):
        xs, ys = _series(held_out, key)
        if xs:
            ax_loss.plot(xs, ys, "o--", label=label, markersize=3)
    ax_loss.set(title="loss", xlabel="step", ylabel="cross-entropy (nats)")

    for key, label in (("mlm_accuracy", "train MLM"), ("nsp_accuracy", "train NSP")):
        xs, ys = _series(train, key)
        if xs:
            ax_acc.plot(xs, ys, label=label)
    for key, label in (("mlm_accuracy", "held-out MLM"), ("nsp_accuracy", "held-out NSP")):
        xs, ys = _series(held_out, key)
        if xs:
            ax_acc.plot(xs, ys, "o--", label=label, markersize=3)
    ax_acc.set(title="accuracy", xlabel="step", ylabel="accuracy", ylim=(0, 1))

    xs, ys = _series(train, "lr")
    if xs:
        ax_lr.plot(xs, ys, color="tab:gray")
    ax_lr.set(title="learning rate", xlabel="step")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))

    for ax in (ax_loss, ax_acc):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    ax_lr.grid(alpha=0.3)
    fig.suptitle(run_dir.name)

    out = Path(out) if out is not None else run_dir / "curves.png"
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return out
