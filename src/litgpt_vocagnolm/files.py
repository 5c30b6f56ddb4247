"""Hashes and whole-or-nothing writes of the files this package writes and later trusts."""

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

WHOLE_HASH_BYTES = 1 << 20  # input files up to this size are hashed whole
HASH_SAMPLES = 16  # larger ones: this many evenly spaced samples...
SAMPLE_BYTES = 1 << 16  # ...of this many bytes each, so at most 1 MiB is read per file


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)  # releases the GIL: files hash in parallel threads
    return digest.hexdigest()


def files_sha256(paths: list[Path]) -> dict[str, str]:
    """sha256 of each file, by name, hashed in parallel threads (a checkpoint's shards: hashlib releases the GIL, so
    a node's cores share the work)."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        return dict(zip((p.name for p in paths), pool.map(file_sha256, paths)))


def inside(folder: Path, name: str) -> bool:
    """Whether `name`, as a file listing (an index, a manifest) gives it, is a file inside `folder`: relative, without
    `..`, and no link on the way that leads out of `folder`."""
    path = Path(name)
    if path.is_absolute() or ".." in path.parts:
        return False
    return (Path(folder) / path).resolve().is_relative_to(Path(folder).resolve())


class HashingWriter:
    """A binary file open for writing that hashes what goes through it: `torch.save(obj, HashingWriter(f))` leaves
    the file's sha256 in `hexdigest()` without reading the file again."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.digest = file, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def file_fingerprint(path: Path) -> dict[str, Any]:
    """What `vocagnolm prepare` records of an input file to tell, on the next run, whether it changed.

    Its path and size, and the sha256 of its content: of the whole file up to WHOLE_HASH_BYTES; above, of
    HASH_SAMPLES samples of SAMPLE_BYTES spread evenly from its first byte to its last, together with its modification
    time, since an edit between the samples would go unseen. At most 1 MiB is read per file, so a 50 GB corpus in 200
    files costs 200 MiB of reading, not 50 GB. A small file whose time changed but not its content is the same file; a
    large one is not (its content is not read whole).
    """
    path = Path(path)
    stat = path.stat()
    record: dict[str, Any] = {"path": str(path.resolve()), "bytes": stat.st_size}
    if stat.st_size <= WHOLE_HASH_BYTES:
        return {**record, "sha256": file_sha256(path)}
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for k in range(HASH_SAMPLES):
            f.seek(k * (stat.st_size - SAMPLE_BYTES) // (HASH_SAMPLES - 1))
            digest.update(f.read(SAMPLE_BYTES))
    return {**record, "mtime_ns": stat.st_mtime_ns, "sampled_sha256": digest.hexdigest()}


def write_json(path: Path, data: Any) -> None:
    """Whole or not at all: a run killed while writing leaves no half file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def same_folder(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same prepared folder: one folder spelt two ways, or a copy of it (the same
    manifest.json, which records every shard's size and the inputs' fingerprints)."""
    a, b = Path(a), Path(b)
    if a.resolve() == b.resolve():
        return True
    manifests = [a / "manifest.json", b / "manifest.json"]
    return all(m.is_file() for m in manifests) and manifests[0].read_bytes() == manifests[1].read_bytes()
