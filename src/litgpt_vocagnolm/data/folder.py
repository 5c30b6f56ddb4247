"""The folder `vocagnolm prepare` writes: the names of its files, the format version its manifest records, and what an
`--output` folder holds (`output_progress`: nothing, this very data, or an unfinished run of it).

Apart from prepared.py, which reads the data back for training and so loads LitGPT, LitData and torch: `prepare`, its
checks and its refusals need none of them until a split is written.
"""

import json
from pathlib import Path
from typing import Any, Literal

from litgpt_vocagnolm.errors import PathTaken
from litgpt_vocagnolm.files import LOCK

FORMAT = "vocagnolm-blocks/1"
MANIFEST = "manifest.json"
PARTIAL = ".partial"  # where an unfinished `prepare` works; renamed into place at the end
SPLITS = ("val", "train")  # written in this order: the small split first, so an empty one fails fast


def _differences(recorded: dict, settings: dict) -> str:
    def show(value: Any) -> str:
        text = json.dumps(value)
        return text if len(text) <= 60 else "..."

    keys = [key for key in settings if recorded.get(key) != settings[key]]
    return "; ".join(
        _changed_files(key, recorded.get(key) or [], settings[key])
        if key in ("input", "val_input")
        else f"{key}: {show(recorded.get(key))} there, {show(settings[key])} now"
        for key in keys
    )


def _changed_files(key: str, recorded: list, now: list[dict]) -> str:
    """Which --input (or --val_input) files differ from those recorded (`files.file_fingerprint`), and how."""
    before = {(r["path"] if isinstance(r, dict) else r[0]): r for r in recorded}  # older versions: [path, size]
    changes = [f"{r['path']} is new" for r in now if r["path"] not in before]
    changes += [f"{path} is gone" for path in before.keys() - {r["path"] for r in now}]
    for new in now:
        old = before.get(new["path"], new)
        if isinstance(old, list):
            changes.append(f"{new['path']} was recorded without its content hash (by an older version)")
        elif old != new:
            fields = sorted(field for field in old.keys() | new.keys() if old.get(field) != new.get(field))
            changes.append(f"{new['path']} changed ({', '.join(fields)})")
    more = f"; and {len(changes) - 3} more" if len(changes) > 3 else ""
    return f"--{key}: " + ("; ".join(changes[:3]) + more if changes else "the same files in another order")


def output_progress(output: Path, settings: dict) -> Literal["new", "done", "resume"]:
    """What `--output` holds: nothing, this very dataset, or an unfinished run of it. Refuses anything else."""
    if output.exists() and not output.is_dir():
        raise PathTaken(f"--output {output} is a file; give a directory.")
    entries = sorted(p.name for p in output.iterdir() if p.name != LOCK) if output.is_dir() else []
    if not entries:
        return "new"
    if MANIFEST in entries:
        recorded = json.loads((output / MANIFEST).read_text(encoding="utf-8"))["settings"]
        if recorded == settings:
            return "done"
        raise PathTaken(
            f"--output {output} holds data prepared with other settings ({_differences(recorded, settings)})."
            f" Give another --output, or delete {output} to prepare it again."
        )
    if PARTIAL in entries and set(entries) <= {PARTIAL, *SPLITS}:
        settings_file = output / PARTIAL / "settings.json"
        recorded = json.loads(settings_file.read_text(encoding="utf-8"))["settings"] if settings_file.is_file() else {}
        if recorded == settings:
            return "resume"
        if not any((output / PARTIAL / f"{split}.json").is_file() for split in SPLITS):
            return "new"  # an unfinished run that finished no split (it failed, or was killed early): start over
        raise PathTaken(
            f"--output {output} holds an unfinished `vocagnolm prepare` with other settings"
            f" ({_differences(recorded, settings)}). Re-run that command to finish it, give another --output, or"
            f" delete {output}."
        )
    raise PathTaken(
        f"--output {output} is not empty and holds no prepared data (it has: {', '.join(entries[:5])}"
        f"{', ...' if len(entries) > 5 else ''}). Give a new or empty directory."
    )
