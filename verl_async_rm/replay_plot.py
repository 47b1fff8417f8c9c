"""The replay's plot: old vs new score per sample, and the agreement per step. matplotlib is not a
dependency of the agent (training needs no plot): it comes with the ``plot`` extra (and the rig), and
``--plot`` is refused before the first request when it is missing."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path


def check_can_plot() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'verl-async-rm[plot]' (or drop --plot: the report "
                         "holds the points)")


def plot_replay(report: dict, path: Path) -> None:
    """Left: each sample's (old, new) score, a point's area growing with how many share it (judges
    often score on a few levels: 0, 0.5, 1; then each point is labelled with its count). Right: Spearman and the GRPO ranking agreement per step."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    compared = Counter((old, new) for _, old, new in report["points"] if old is not None and new is not None)
    figure, (scatter, steps) = plt.subplots(1, 2, figsize=(11, 4.5))
    if compared:
        xs, ys, counts = zip(*((old, new, n) for (old, new), n in compared.items()))
        most = max(counts)
        scatter.scatter(xs, ys, s=[15 + 400 * n / most for n in counts], alpha=0.5)
        if len(compared) <= 30:  # few levels (0, 0.5, 1): say how many samples each point is
            for x, y, n in zip(xs, ys, counts):
                scatter.annotate(str(n), (x, y), textcoords="offset points", xytext=(8, 8), fontsize=8)
        low, high = min(xs + ys), max(xs + ys)
        scatter.plot([low, high], [low, high], color="grey", linewidth=0.8, linestyle="--")
    total = report["agreement"]
    scatter.set(xlabel="old score", ylabel="new score",
                title=f"{total['compared']} samples: Pearson {_fmt(total['pearson'])}, Spearman {_fmt(total['spearman'])}")
    numbers = [s["step"] for s in report["steps"]]
    for name in ("spearman", "ranking_agreement", "sign_agreement"):
        steps.plot(numbers, [float("nan") if s[name] is None else s[name] for s in report["steps"]], marker="o", label=name)
    steps.set(xlabel="step", ylabel="agreement", ylim=(-0.05, 1.05), title="per step (drift)")
    steps.legend(loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
