"""`vocagnolm evaluate`'s results files in its `--out_dir`: merged, never rewritten.

results.csv holds one row per (checkpoint, task, settings, limit), bpb.csv one per (checkpoint, file, precision). A
checkpoint is named by the sha256 of its weights (`weights.verified_weights_sha256`), not by its path alone: a
checkpoint trained again in the same folder keeps rows of its own, and a copy of one elsewhere is the same
checkpoint. Each new row is merged into the file as it is on disk at that moment, which then is replaced whole
(`os.replace`): a run killed while writing leaves the previous file. results.md and bpb.md are drawn from them.

A results file of another layout (an older version's, or a file of the user's own that happens to have the name) is
refused before the model loads, as is a results.md or bpb.md without the CSV file it would be drawn from.
"""

import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from litgpt_vocagnolm.errors import PathTaken
from litgpt_vocagnolm.evaluation.math_tasks import TASKS

RESULT_FIELDS = (
    "task",
    "accuracy",
    "questions",
    "limit",
    "max_new_tokens",
    "precision",
    "data_dir",
    "checkpoint",
    "checkpoint_sha256",
    "date",
    "predictions",
)
# What makes a row: a run with all of these equal replaces its row (and predictions file); any other adds one.
RESULT_KEY = ("checkpoint_sha256", "task", "limit", "max_new_tokens", "precision", "data_dir")
SETTINGS = ("max_new_tokens", "precision", "data_dir")
BPB_FIELDS = (
    "file",
    "documents",
    "tokens",
    "bytes",
    "nats",
    "bits_per_byte",
    "precision",
    "checkpoint",
    "checkpoint_sha256",
    "date",
)
BPB_KEY = ("checkpoint_sha256", "file", "precision")
FILES = {"results.csv": (RESULT_FIELDS, "results.md"), "bpb.csv": (BPB_FIELDS, "bpb.md")}


def check_results_files(out_dir: Path, names: list[str]) -> None:
    """Refuses, before any work, results files in `out_dir` that this command did not write: a CSV file (of `names`)
    of another layout, or its markdown view without it."""
    for name in names:
        read_rows(out_dir, name)
        view = out_dir / FILES[name][1]
        if view.exists() and not (out_dir / name).exists():
            raise PathTaken(
                f"{view} exists without the {name} it is drawn from, so `vocagnolm evaluate` did not write it: move it"
                " away to keep it, or give another --out_dir"
            )


def read_rows(out_dir: Path, name: str) -> list[dict[str, str]]:
    """The rows of `out_dir/name` (none if it does not exist), as strings; a file of another layout is refused."""
    path, fields = out_dir / name, FILES[name][0]
    if not path.exists():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise PathTaken(
            f"{path} can't be read as a results file ({error}): move it away, or give another --out_dir"
        ) from error
    if tuple(reader.fieldnames or ()) != fields:
        raise PathTaken(
            f"{path} has columns {reader.fieldnames}, not those of this version ({', '.join(fields)}): move it away to"
            " keep it, or give another --out_dir"
        )
    return rows


def predictions_name(task: str, limit: Optional[int], run: dict) -> str:
    """`<task>.<id>.jsonl`, or `<task>.limit-N.<id>.jsonl`: <id> (10 hex digits) names the checkpoint's content and the
    settings, so every row of results.csv has a predictions file of its own."""
    key = json.dumps([run["checkpoint_sha256"], *(run[name] for name in SETTINGS)])
    limited = "" if limit is None else f".limit-{limit}"
    return f"{task}{limited}.{hashlib.sha256(key.encode()).hexdigest()[:10]}.jsonl"


def record_accuracy(out_dir: Path, row: dict) -> None:
    """Merges `row` (RESULT_FIELDS) into results.csv, in place of the row of its key if there is one, and draws
    results.md again. Rows are in Table 1's task order, a task's whole runs before its `--limit` runs, the largest
    limit first, then in the order they were first written."""
    order = list(TASKS)
    rows = merge(read_rows(out_dir, "results.csv"), row, RESULT_FIELDS, RESULT_KEY)
    rows.sort(key=lambda r: (order.index(r["task"]), r["limit"] != "", -int(r["limit"] or 0)))
    write_csv(out_dir / "results.csv", RESULT_FIELDS, rows)
    (out_dir / "results.md").write_text(accuracy_markdown(rows), encoding="utf-8")


def record_bpb(out_dir: Path, row: dict) -> None:
    """Merges `row` (BPB_FIELDS) into bpb.csv, in place of the row of its checkpoint, file and precision if there is
    one, and draws bpb.md again."""
    rows = merge(read_rows(out_dir, "bpb.csv"), row, BPB_FIELDS, BPB_KEY)
    write_csv(out_dir / "bpb.csv", BPB_FIELDS, rows)
    columns = ["checkpoint", "file", "documents", "tokens", "bytes", "bits_per_byte", "precision"]
    lines = [columns, ["---"] * 2 + ["---:"] * 4 + ["---"]]
    for r in rows:
        bits = f"{float(r['bits_per_byte']):.4f}"
        lines.append([label(r, rows), *(r[c] for c in columns[1:5]), bits, r["precision"]])
    (out_dir / "bpb.md").write_text(markdown(lines), encoding="utf-8")


def merge(rows: list[dict[str, str]], row: dict, fields: tuple[str, ...], key: tuple[str, ...]) -> list[dict[str, str]]:
    """`rows` with `row`'s `fields` (as the CSV file holds them) in place of the row with the same `key` values, or
    after them all."""
    new = {name: "" if row[name] is None else str(row[name]) for name in fields}
    same = [r for r in rows if all(r[k] == new[k] for k in key)]
    if same:
        return [new if r is same[0] else r for r in rows]
    return rows + [new]


def write_csv(path: Path, fields: tuple[str, ...], rows: list[dict[str, str]]) -> None:
    """Whole or not at all: the file is written beside and then put in place."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def label(row: dict[str, str], rows: list[dict[str, str]]) -> str:
    """`row`'s checkpoint as the tables show it: its path, and the start of its sha256 where another checkpoint of
    `rows` has had the same path."""
    same_path = {r["checkpoint_sha256"] for r in rows if r["checkpoint"] == row["checkpoint"]}
    return row["checkpoint"] + (f" @{row['checkpoint_sha256'][:8]}" if len(same_path) > 1 else "")


def accuracy_markdown(rows: list[dict[str, str]]) -> str:
    """Table 1 (a row per checkpoint and settings: each task from its whole run, else from its largest `--limit` run,
    marked *; then the unweighted average) above every row of results.csv."""
    runs: dict[tuple, list[dict[str, str]]] = {}  # a Table 1 row per checkpoint and settings, the earliest first
    for r in sorted(rows, key=lambda r: r["date"]):
        runs.setdefault((r["checkpoint_sha256"], *(r[s] for s in SETTINGS)), []).append(r)
    names = [name for name in TASKS if any(r["task"] == name for r in rows)]
    table_1 = [["model", *(TASKS[name].column for name in names), "AVG"], ["---"] + ["---:"] * (len(names) + 1)]
    for (sha, max_new_tokens, precision, data_dir), group in runs.items():
        # `rows` puts a task's whole runs first, then the largest limit (`record_accuracy`): the first is shown.
        shown = [next((r for r in rows if r["task"] == name and any(r is g for g in group)), None) for name in names]
        cells = ["" if r is None else f"{float(r['accuracy']):.1f}" + "*" * (r["limit"] != "") for r in shown]
        values = [float(r["accuracy"]) for r in shown if r is not None]
        limited = any(cell.endswith("*") for cell in cells)
        name = label(group[-1], rows)
        if sum(key[0] == sha for key in runs) > 1:  # the same checkpoint under other settings has a row of its own
            name += f" (max_new_tokens {max_new_tokens}, {precision}" + (f", {data_dir}" if data_dir else "") + ")"
        table_1.append([name, *cells, f"{sum(values) / len(values):.1f}" + "*" * limited])
    settings = [list(RESULT_FIELDS), ["---", "---:", "---:", "---:", "---:", "---", "---", "---", "---", "---", "---"]]
    for r in rows:
        cells = {**r, "accuracy": f"{float(r['accuracy']):.1f}", "checkpoint_sha256": r["checkpoint_sha256"][:12]}
        settings.append([cells[c] for c in RESULT_FIELDS])
    any_limited = any(line[-1].endswith("*") for line in table_1[2:])
    note = "\n\\* A `--limit` run: its first questions only (the table below says how many).\n" if any_limited else ""
    return markdown(table_1) + note + "\n" + markdown(settings)


def markdown(lines: list[list[str]]) -> str:
    return "".join(f"| {' | '.join(line)} |\n" for line in lines)
