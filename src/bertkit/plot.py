"""Training curves of a run: RUN_DIR/metrics.jsonl → RUN_DIR/curves.png.

A pre-training run: three panels against the optimizer step: loss (train MLM + NSP, and
held-out), accuracy (MLM and NSP, train and held-out) and the learning rate. A fine-tuning
directory (its metrics.jsonl has one line per epoch): train loss, the eval metrics and the
learning rate against the epoch. matplotlib is an optional dependency (`pip install bertkit[plot]`),
imported only here.
"""

from __future__ import annotations

import os
from pathlib import Path

from bertkit.train.state import read_metrics
from bertkit.util.fileio import atomic_path, check_writable_output


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, *,
             overwrite: bool = False) -> Path:
    """Draw the curves of `run_dir` into `out` (default RUN_DIR/curves.png); returns the path.

    RUN_DIR/curves.png is this function's own output and is redrawn every time; another existing
    `out` is replaced only with `overwrite`.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise (NotADirectoryError if run_dir.exists() else FileNotFoundError)(
            f"run directory {run_dir} is not a directory; pass the --out of `bertkit pretrain` "
            "or `bertkit finetune`")
    out = Path(out) if out is not None else run_dir / "curves.png"
    own = out.resolve() == (run_dir / "curves.png").resolve()
    check_writable_output(out, overwrite=True if own else overwrite, kind="file")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'bertkit[plot]' "
                          "(or pip install matplotlib)") from None
    # Lines of another shape (not a metrics file of ours) count as no records.
    records = [r for r in read_metrics(run_dir) if isinstance(r, dict) and "step" in r]
    if records and all("epoch" in r and "train_loss" in r for r in records):
        fig = _finetune_figure(records, Figure, FigureCanvasAgg)
    else:
        fig = _pretrain_figure(records, run_dir, Figure, FigureCanvasAgg)
    fig.suptitle(run_dir.resolve().name)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return out


def _finetune_figure(records: list[dict], Figure, FigureCanvasAgg):
    """Train loss, eval metrics and learning rate per epoch of a `finetune` run."""
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_eval, ax_lr = fig.subplots(1, 3)
    epochs = [r["epoch"] for r in records]
    ax_loss.plot(epochs, [r["train_loss"] for r in records], "o-", label="train loss")
    ax_loss.set(title="loss", xlabel="epoch", ylabel="loss")
    evals = [(r["epoch"], r["eval"]) for r in records if isinstance(r.get("eval"), dict)]
    names = sorted({k for _, e in evals for k, v in e.items()
                    if k != "n" and isinstance(v, (int, float)) and not isinstance(v, bool)})
    for name in names:
        points = [(epoch, e[name]) for epoch, e in evals if e.get(name) is not None]
        ax_eval.plot([p[0] for p in points], [p[1] for p in points], "o--", label=name, markersize=4)
    ax_eval.set(title="eval" if evals else "eval (no --eval set given)", xlabel="epoch")
    saved = [r["epoch"] for r in records if r.get("saved")]
    for epoch in saved[-1:] if evals else []:
        ax_eval.axvline(epoch, color="tab:gray", linestyle=":", linewidth=1, label="saved model")
    ax_lr.plot(epochs, [r.get("lr") for r in records], "o-", color="tab:gray")
    ax_lr.set(title="learning rate (end of epoch)", xlabel="epoch")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    for ax in (ax_loss, ax_eval, ax_lr):
        if ax.get_legend_handles_labels()[0] and ax is not ax_lr:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return fig


def _pretrain_figure(records: list[dict], run_dir: Path, Figure, FigureCanvasAgg):
    """Loss, accuracy and learning rate per step of a `pretrain` run."""
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
    return fig
