"""The demo's figure: held-out bits per byte against training tokens."""

from pathlib import Path
from typing import Any

import numpy as np


def plot(
    path: Path, results: dict[str, list[dict[str, Any]]], teacher: dict[str, Any], noise: float, top_k: float
) -> None:
    """Held-out bits per byte against training tokens: one line per method (the mean of its seeds, each seed faint;
    the ablations dashed), the teacher's final figure as a dashed black line."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, runs in results.items():
        tokens = np.array(runs[0]["tokens"]) / 1e3
        style = "--" if method.startswith("vocagnolm-") else "-"
        (line,) = ax.plot(tokens, np.mean([run["bpb"] for run in runs], axis=0), style, marker="o", label=method)
        if len(runs) > 1:
            for run in runs:
                ax.plot(tokens, run["bpb"], color=line.get_color(), alpha=0.3, linewidth=0.8)
    ax.axhline(teacher["bpb"][-1], color="black", linestyle="--", linewidth=1, label="teacher")
    ax.set_xlabel("student training tokens (thousands)")
    ax.set_ylabel("held-out bits per byte (lower is better)")
    ax.set_title(f"Students on math text with {noise:.0%} noise; selection top-k {top_k}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", ncol=2)  # below the curves, which fall from the upper left
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
