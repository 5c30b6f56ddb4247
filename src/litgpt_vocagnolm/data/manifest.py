"""The manifest of prepared data: what `vocagnolm prepare` records in DIR/manifest.json, read back and checked.

A reader trusts nothing of it unchecked: every number against what `prepare` writes (`check_manifest_numbers`; the
block counts against the splits' indexes: `prepared.check_split`), its format version, and a folder without one is
named for what it is (`run_record`: a training run's). A rerun of `prepare` compares what it would write with what
the output holds by content, not by path (`differences`): a copy of the data, its tokenizers and its input elsewhere
is the same data.
"""

import json
import os
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml

from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, PathTaken, name_too_long
from litgpt_vocagnolm.files import LOCK

# 2: the student's EOS maps to the teacher's EOS, and `mapped_share` counts prediction targets (`documents.Stats`).
FORMAT = "vocagnolm-blocks/2"
MANIFEST = "manifest.json"
PARTIAL = ".partial"  # where an unfinished `prepare` works; renamed into place at the end
SPLITS = ("val", "train")  # written in this order: the small split first, so an empty one fails fast
# What a split's manifest entry counts (`documents.Stats`), each a whole number.
SPLIT_COUNTS = ("documents", "characters", "bytes", "student_tokens", "teacher_tokens", "mapped", "overflow_unmapped")
SPLIT_COUNTS += ("blocks", "padding", "shard_bytes")
RUN_RECORD = "hyperparameters.yaml"  # in each checkpoint of a training run, with the data it trained on


def load_manifest(path: Path) -> dict:
    """The manifest of the prepared data in `path`, its numbers checked (`check_manifest_numbers`). Refuses, saying
    what to give instead, a file, a folder without one (a training run's: naming the data it trained on), a manifest
    of another format or one edited by hand."""
    path = Path(path)
    if os.path.isfile(path):  # os.path's: False, not an error, for a name too long
        raise InvalidArgument(
            f"{path} is a file, not prepared data: give the folder `vocagnolm prepare --output DIR` wrote (a text file"
            f" such as this one is what it reads: `vocagnolm prepare ... --input {path} --output DIR`)."
        )
    too_long = name_too_long(path)
    if too_long:
        raise PathMissing(f"No prepared data in {path}: {too_long}. Give the folder `vocagnolm prepare` wrote.")
    if not os.path.isfile(path / MANIFEST):
        run = run_record(path)
        if run is not None:
            raise PathMissing(f"{path} is a training run's folder, not prepared data (no {MANIFEST}): {run}")
        unfinished = " An interrupted run left it unfinished: run it again." if os.path.exists(path / PARTIAL) else ""
        raise PathMissing(
            f"No prepared data in {path} (no {MANIFEST}). Make it with `vocagnolm prepare ... --output {path}`."
            + unfinished
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except ValueError as error:  # UnicodeDecodeError is one too
        raise InvalidArgument(f"{path / MANIFEST} is not JSON ({error}): it is damaged. {copy_again(path)}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise InvalidArgument(
            f"{path / MANIFEST} is format {found!r}; this version of litgpt-vocagnolm reads"
            f" {FORMAT!r}. Prepare the data again: `vocagnolm prepare` with the arguments it was prepared with (its"
            f' "settings" in the manifest) and a new --output (or delete {path} first).'
        )
    check_manifest_numbers(path, manifest)
    return manifest


def check_manifest_numbers(path: Path, manifest: dict) -> None:
    """Fails, naming the field, unless every number of `path`'s manifest is one `prepare` writes: counts whole and at
    least their least, shares between 0 and 1, blocks one token longer than max_seq_length, and each split's student
    tokens and padding filling its blocks exactly, mapping no more tokens than it holds. An edited manifest fails at
    start, not at the step that reads past the blocks (its count of blocks is checked against the split's index by
    `check_split`)."""

    def refuse(field: str, value: Any, should: str) -> NoReturn:
        raise InvalidArgument(
            f"{path / MANIFEST}: {field} is {value!r}, where `vocagnolm prepare` writes {should}: the manifest was"
            " edited or damaged."
            f" {copy_again(path)}"
        )

    def whole(field: str, value: Any, least: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            refuse(field, value, f"a whole number of at least {least}")
        return value

    def share(field: str, value: Any) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
            refuse(field, value, "a share between 0 and 1")

    length = whole("max_seq_length", manifest.get("max_seq_length"), 1)
    if manifest.get("block_size") != length + 1:
        refuse("block_size", manifest.get("block_size"), f"max_seq_length + 1 = {length + 1}")
    whole("teacher_max_length", manifest.get("teacher_max_length"), 1)
    for side in ("student", "teacher"):
        whole(f"{side}.vocab_size", (manifest.get(side) or {}).get("vocab_size"), 1)
    share("mapped_share", manifest.get("mapped_share"))
    for split in SPLITS:
        counts = (manifest.get("splits") or {}).get(split) or {}
        for name in SPLIT_COUNTS:
            whole(f"splits.{split}.{name}", counts.get(name), 1 if name == "blocks" else 0)
        share(f"splits.{split}.mapped_share", counts.get("mapped_share"))
        tokens, padding, blocks = counts["student_tokens"], counts["padding"], counts["blocks"]
        if tokens + padding != blocks * (length + 1):
            refuse(
                f"splits.{split}.blocks",
                blocks,
                f"the blocks of {length + 1} tokens that its {tokens:,} student tokens and {padding:,} of padding fill,"
                f" {(tokens + padding) / (length + 1):g}",
            )
        if counts["mapped"] + counts["overflow_unmapped"] > tokens:
            refuse(
                f"splits.{split}.mapped",
                counts["mapped"],
                f"at most its {tokens:,} student tokens less overflow_unmapped",
            )


def copy_again(path: Path) -> str:
    """The way on from prepared data that is damaged or was edited."""
    return f"Copy {path} again, whole, or prepare the data again: `vocagnolm prepare ... --output NEW_DIR`."


def run_record(path: Path) -> str | None:
    """Where `path` is a training run's folder, or one of its checkpoints (the recipe writes a `RUN_RECORD` into each
    `step-*/` and `final/`): which data the newest of them trained on, as a sentence. None elsewhere."""
    if not path.is_dir():
        return None
    records = [path / RUN_RECORD] if os.path.isfile(path / RUN_RECORD) else list(path.glob(f"*/{RUN_RECORD}"))
    if not records:
        return None
    newest = max(records, key=lambda record: record.stat().st_mtime)
    try:
        hparams = yaml.safe_load(newest.read_text(encoding="utf-8"))
        data = hparams["data"]["init_args"]["path"]
    except (OSError, ValueError, yaml.YAMLError, TypeError, KeyError):  # another data module's, or damaged
        return f"{newest} records the run, not the data it trained on. Give the folder `vocagnolm prepare` wrote."
    return f"{newest} records that the run trained on {data}: give that folder."


def output_progress(output: Path, settings: dict) -> Literal["new", "done", "resume"]:
    """What `--output` holds: nothing, this very dataset, or an unfinished run of it. Refuses anything else."""
    if output.exists() and not output.is_dir():
        raise PathTaken(f"--output {output} is a file; give a directory.")
    entries = sorted(p.name for p in output.iterdir() if p.name != LOCK) if output.is_dir() else []
    if not entries:
        return "new"
    if MANIFEST in entries:
        recorded = json.loads((output / MANIFEST).read_text(encoding="utf-8"))["settings"]
        changes = differences(recorded, settings)
        if not changes:
            return "done"
        raise PathTaken(
            f"--output {output} holds data prepared with other settings ({'; '.join(changes)})."
            f" Give another --output, or delete {output} to prepare it again."
        )
    if PARTIAL in entries and set(entries) <= {PARTIAL, *SPLITS}:
        settings_file = output / PARTIAL / "settings.json"
        recorded = json.loads(settings_file.read_text(encoding="utf-8"))["settings"] if settings_file.is_file() else {}
        changes = differences(recorded, settings)
        if not changes:
            return "resume"
        if not any((output / PARTIAL / f"{split}.json").is_file() for split in SPLITS):
            return "new"  # an unfinished run that finished no split (it failed, or was killed early): start over
        raise PathTaken(
            f"--output {output} holds an unfinished `vocagnolm prepare` with other settings"
            f" ({'; '.join(changes)}). Re-run that command to finish it, give another --output, or"
            f" delete {output}."
        )
    raise PathTaken(
        f"--output {output} is not empty and holds no prepared data (it has: {', '.join(entries[:5])}"
        f"{', ...' if len(entries) > 5 else ''}). Give a new or empty directory."
    )


def differences(recorded: dict, settings: dict) -> list[str]:
    """What differs between the settings data was prepared with and those given now, by content: the tokenizers by
    their sha256, the input files by `same_file`, wherever each lies (a copy of the data, of its tokenizers and of its
    input is the same data); every other setting as recorded. Empty: the same data."""

    def show(value: Any) -> str:
        text = json.dumps(value)
        return text if len(text) <= 60 else "..."

    found = []
    for key, now in settings.items():
        before = recorded.get(key)
        if key in ("student", "teacher"):
            if (before or {}).get("sha256") != now["sha256"]:
                found.append(f"{key}: {_tokenizer_text(before)} there, {_tokenizer_text(now)} now")
        elif key in ("input", "val_input"):
            found += _changed_files(key, before or [], now)
        elif before != now:
            found.append(f"{key}: {show(before)} there, {show(now)} now")
    return found


def _tokenizer_text(record: dict | None) -> str:
    """A recorded tokenizer: its file and the start of its sha256."""
    return f"{record['path']} (sha256 {record['sha256'][:12]}...)" if record else "none"


def same_file(recorded: dict, now: dict) -> bool:
    """Whether an input file is the one recorded (`files.file_fingerprint`): its size and content hash, wherever it
    lies. A large file's time counts only where it lies where it was recorded (its content is sampled, not read whole,
    and an edit in place changes its time); a copy elsewhere has a time of its own."""
    ignored = {"path"} if recorded.get("path") == now.get("path") else {"path", "mtime_ns"}
    return {k: v for k, v in recorded.items() if k not in ignored} == {k: v for k, v in now.items() if k not in ignored}


def _changed_files(key: str, recorded: list, now: list[dict]) -> list[str]:
    """How the --input (or --val_input) files differ from those recorded, if they do: each file now matched to a
    recorded one by its path, else by its content (`same_file`: a copy elsewhere is the same file), else to the one
    recorded in its place in the list, if unmatched (a copy since edited)."""
    before = list(recorded)
    matched, changes = [], []
    for place, new in enumerate(now):
        # Older versions recorded [path, size], without a content hash.
        old = next((r for r in before if (r["path"] if isinstance(r, dict) else r[0]) == new["path"]), None)
        if old is None:
            old = next((r for r in before if isinstance(r, dict) and same_file(r, new)), None)
        if old is None and place < len(recorded) and recorded[place] in before and isinstance(recorded[place], dict):
            old = recorded[place]
        if old is None:
            changes.append(f"{new['path']} is new")
            continue
        before.remove(old)
        matched.append(old)
        if isinstance(old, list):
            changes.append(f"{new['path']} was recorded without its content hash (by an older version)")
        elif not same_file(old, new):
            fields = sorted(f for f in old.keys() | new.keys() if f != "path" and old.get(f) != new.get(f))
            elsewhere = f", recorded as {old['path']}" if old["path"] != new["path"] else ""
            changes.append(f"{new['path']} changed ({', '.join(fields)}{elsewhere})")
    changes += [f"{r['path'] if isinstance(r, dict) else r[0]} is gone" for r in before]
    if not changes and matched != list(recorded):
        changes.append("the same files in another order")
    more = [f"and {len(changes) - 3} more"] if len(changes) > 3 else []
    return [f"--{key}: " + "; ".join(changes[:3] + more)] if changes else []
