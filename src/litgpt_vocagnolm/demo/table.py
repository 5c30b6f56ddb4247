"""The demo's results: one row per student, the table, the noise sentence, and the paper's comparisons these runs
can make."""

import csv
from pathlib import Path
from typing import Any

import numpy as np

from litgpt_vocagnolm.demo.settings import TWO_TEACHERS


def method_row(method: str, runs: list[dict[str, Any]], noise_all: float) -> dict[str, Any]:
    """One method's results, averaged over its seeds: final held-out bits per byte (with the seeds' range), held-out
    loss and training loss (nats per student token), throughput, the share of training tokens touching noise (of all:
    `noise_all`, the same for every method; of those the method trains: `noise_trained`, see `trained_noise_share`),
    and the held-out curve as `bpb@<tokens>` columns."""
    finals = [run["bpb"][-1] for run in runs]
    row = {
        "method": method,
        "seeds": len(runs),
        "tokens": runs[0]["tokens"][-1],
        "heldout_bpb": float(np.mean(finals)),
        "heldout_bpb_min": min(finals),
        "heldout_bpb_max": max(finals),
        "heldout_loss": float(np.mean([run["heldout_loss"] for run in runs])),
        "train_loss": float(np.mean([run["train_loss"] for run in runs])),
        "train_ce": float(np.mean([run["student_loss"] for run in runs])),
        "tokens_per_sec": float(np.mean([run["tokens_per_sec"] for run in runs])),
        "noise_all": noise_all,
        "noise_trained": float(np.mean([run["noise_trained"] for run in runs])),
    }
    for i, tokens in enumerate(runs[0]["tokens"]):
        row[f"bpb@{tokens}"] = float(np.mean([run["bpb"][i] for run in runs]))
    return row


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: list[dict[str, Any]], teacher: dict[str, Any], teacher2: dict[str, Any] | None = None) -> str:
    """Held-out bits per byte (the seeds' range where there are several), losses, the share of trained tokens that
    touch noise and throughput per method, under the teachers' held-out bits per byte (comparable across
    tokenizers)."""
    header = (
        "method",
        "seeds",
        "held-out bits/byte",
        "held-out loss",
        "training objective",
        "training CE, all tokens",
        "trained tokens touching noise",
        "tokens/s",
    )
    bpb, speed = teacher["bpb"][-1], teacher["tokens_per_sec"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
        f"| teacher (own tokenizer, clean text) | 1 | {bpb:.3f} | | | | | {speed:,.0f} |",
    ]
    if teacher2 is not None:
        lines.append(
            f"| second teacher (vocagnolm-2teachers) | 1 | {teacher2['bpb'][-1]:.3f} | | | | |"
            f" {teacher2['tokens_per_sec']:,.0f} |"
        )
    for row in rows:
        spread = f" ({row['heldout_bpb_min']:.3f}-{row['heldout_bpb_max']:.3f})" if row["seeds"] > 1 else ""
        lines.append(
            f"| {row['method']} | {row['seeds']} | {row['heldout_bpb']:.3f}{spread} | {row['heldout_loss']:.3f}"
            f" | {row['train_loss']:.3f} | {row['train_ce']:.3f} | {row['noise_trained']:.1%}"
            f" | {row['tokens_per_sec']:,.0f} |"
        )
    return "\n".join(lines)


def noise_summary(rows: list[dict[str, Any]], sample_tokens: int) -> str:
    """The measured noise shares in one sentence."""
    trained = ", ".join(f"{row['method']} {row['noise_trained']:.1%}" for row in rows)
    return (
        f"Noise: {rows[0]['noise_all']:.1%} of the students' training tokens touch noise (counted on the first"
        f" {sample_tokens:,}); of the tokens each method trains, as its final student selects them: {trained}."
    )


def compare(a: list[float], b: list[float], spread: float | None) -> str:
    """How final bits per byte `a` compare to `b` (lower is better), claimed only beyond seed noise: with several
    seeds on both sides, when every seed of one beats every seed of the other; otherwise when the gap exceeds
    `spread`, the largest range between the seeds of one method (None: no method ran with several seeds)."""
    gap = float(np.mean(a) - np.mean(b))
    if len(a) > 1 and len(b) > 1:
        verdict = "better" if max(a) < min(b) else "worse" if min(a) > max(b) else "no clear difference"
        basis = f"{len(a)} and {len(b)} seeds"
    elif spread is None:
        verdict, basis = "not claimed", "one seed, no seed range measured"
    else:
        verdict = "better" if gap < -spread else "worse" if gap > spread else "no clear difference"
        basis = f"one seed; largest range between seeds {spread:.3f}"
    return f"{gap:+.3f} bits/byte: {verdict} ({basis})"


def gaps_along_the_run(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    """The gap in held-out bits per byte (mean of `a`'s seeds minus `b`'s) at each evaluation, and whether every seed
    of `a` was ahead of every seed of `b` there."""
    points = []
    for i, tokens in enumerate(a[0]["tokens"]):
        ours, theirs = [run["bpb"][i] for run in a], [run["bpb"][i] for run in b]
        ahead = " (every seed ahead)" if max(ours) < min(theirs) else ""
        points.append(f"{np.mean(ours) - np.mean(theirs):+.3f} at {tokens:,}{ahead}")
    return "; ".join(points) + " tokens"


def claims(results: dict[str, list[dict[str, Any]]], teacher: dict[str, Any]) -> list[str]:
    """The paper's comparisons that these runs can make, each as far as the runs support it."""
    finals = {method: [run["bpb"][-1] for run in runs] for method, runs in results.items()}
    spreads = [max(f) - min(f) for f in finals.values() if len(f) > 1]
    spread = max(spreads) if spreads else None
    best = min(finals, key=lambda method: np.mean(finals[method]))
    lines = [
        f"teacher vs the best student ({best}): {teacher['bpb'][-1] - np.mean(finals[best]):+.3f} bits/byte (the"
        " teacher must know the text better than the students to guide them)"
    ]
    pairs = [
        ("vocagnolm", "ce", "teacher-guided selection vs naive training (Table 1)"),
        ("vocagnolm", "random", "the teacher's choice vs as many tokens drawn at random"),
        ("vocagnolm", "chunk", "token-level vs chunk-level alignment (Table 2)"),
        ("vocagnolm", "uld", "selection vs logit distillation across vocabularies (Table 1)"),
        ("vocagnolm-mean", "vocagnolm", "mean vs max aggregation (Table 3)"),
        ("vocagnolm-exclude", "vocagnolm", "unmapped tokens excluded vs included (Table 3)"),
        ("vocagnolm-2teachers", "vocagnolm", "two teachers (each token's lower loss) vs the first alone"),
        ("vocagnolm-2teachers-byte", "vocagnolm-2teachers", "two teachers compared per byte vs per teacher token"),
    ]
    for a, b, what in pairs:
        if a in finals and b in finals:
            lines.append(f"{a} vs {b}, {what}: {compare(finals[a], finals[b], spread)}")
    if "vocagnolm" in results and "ce" in results:
        lines.append(f"vocagnolm vs ce along the run: {gaps_along_the_run(results['vocagnolm'], results['ce'])}")
    for method in TWO_TEACHERS:
        shares = [run["second_teacher_share"] for run in results.get(method, [])]
        if shares:
            lines.append(
                f"{method}: the second teacher set the reference of {np.mean(shares):.1%} of the selected"
                " tokens (mean of the logged steps and seeds)"
            )
    return lines
