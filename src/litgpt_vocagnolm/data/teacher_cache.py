"""The teacher loss cache: score the corpus once (`vocagnolm score-teacher`), train many times without the teacher.

Layout of a cache directory (written by `vocagnolm score-teacher`):
  manifest.json                 the teacher's fingerprint, the data manifest's sha256, counts, bytes per token, and
                                under "files" the size and sha256 of every shard file
  <split>/<shard>.losses.npy    float16: every block's window losses, concatenated, without each window's first
                                token (never predicted: NaN by definition)
  <split>/<shard>.offsets.npy   uint32 (blocks + 1,): where each block's losses start in the shard
  <split>/<shard>.sha256.json   the two files' sizes and sha256, written by the rank that scored the shard
A shard holds `blocks_per_shard` consecutive blocks (by index in the prepared split) and appears atomically.

A shard's files are checked against the manifest when a process first opens the shard: one sha256 pass over them
(a few MB), so that a damaged file fails naming itself instead of training on wrong losses. Caches scored before
the manifest recorded checksums are read without that check.
"""

import hashlib
import json
from pathlib import Path
from typing import Optional

import numpy as np

from litgpt_vocagnolm.errors import InvalidArgument, NotFinite, PathMissing
from litgpt_vocagnolm.files import file_sha256, inside
from litgpt_vocagnolm.models.weights import checkpoint_fingerprint

CACHE_FORMAT = "vocagnolm-teacher-loss/1"
CACHE_MANIFEST = "manifest.json"
WHOLE_WEIGHTS_BYTES = 1 << 28  # weight files up to 256 MiB are hashed whole...
WEIGHT_SAMPLES = 256  # ...larger ones by this many evenly spaced samples...
WEIGHT_SAMPLE_BYTES = 1 << 18  # ...of 256 KiB each: 64 MiB read of a 15 GB teacher


def weights_sha256(checkpoint_dir: Path) -> str:
    """The teacher's identity: sha256 of its model config and of its weight files' content, wherever it lies.

    A weight file up to WHOLE_WEIGHTS_BYTES is hashed whole; a larger one by its size and WEIGHT_SAMPLES samples spread
    from its first byte to its last (a teacher's weights differ from another's everywhere, so samples tell them
    apart), which keeps the check at start-up under a second.
    """
    digest = hashlib.sha256(Path(checkpoint_dir, "model_config.yaml").read_bytes())
    for path in sorted(Path(checkpoint_dir).glob("*.pth")):
        size = path.stat().st_size
        digest.update(json.dumps([path.name, size]).encode())
        with open(path, "rb") as f:
            if size <= WHOLE_WEIGHTS_BYTES:
                digest.update(f.read())
                continue
            for k in range(WEIGHT_SAMPLES):
                f.seek(k * (size - WEIGHT_SAMPLE_BYTES) // (WEIGHT_SAMPLES - 1))
                digest.update(f.read(WEIGHT_SAMPLE_BYTES))
    return digest.hexdigest()


def shard_files(cache: Path, split: str, shard: int) -> tuple[Path, Path]:
    return cache / split / f"{shard:06d}.losses.npy", cache / split / f"{shard:06d}.offsets.npy"


def checksum_file(cache: Path, split: str, shard: int) -> Path:
    return cache / split / f"{shard:06d}.sha256.json"


def file_record(path: Path) -> dict:
    """What the manifest records of a shard file, keyed by `split/name`."""
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def rescore_hint(cache: Path) -> str:
    return f"The cache is damaged: score again into a new --output, or delete {cache} and run the same command."


class TeacherLossCache:
    """Reads one split of a cache: `cache[i]` is block i's teacher loss, float32 (M_i,) with NaN first."""

    def __init__(self, cache: Path, split: str) -> None:
        manifest = load_cache_manifest(cache)
        self.cache, self.split, self.blocks_per_shard = Path(cache), split, manifest["blocks_per_shard"]
        self.files: Optional[dict] = manifest.get("files")  # None for caches scored before checksums
        self._shards: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # memory-mapped, opened lazily per process

    def __getitem__(self, index: int) -> np.ndarray:
        shard, row = divmod(index, self.blocks_per_shard)
        if shard not in self._shards:
            self._shards[shard] = self._open(shard)
        losses, offsets = self._shards[shard]
        return np.concatenate([[np.nan], losses[offsets[row] : offsets[row + 1]]]).astype(np.float32)

    def _open(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        losses_file, offsets_file = shard_files(self.cache, self.split, shard)
        for file in (losses_file, offsets_file) if self.files is not None else ():
            recorded = self.files.get(f"{self.split}/{file.name}")
            if recorded is None or not file.is_file() or file_record(file) != recorded:
                raise InvalidArgument(
                    f"{file} is missing or not the file `vocagnolm score-teacher` wrote: its size or sha256 differs"
                    f" from {self.cache / CACHE_MANIFEST}. {rescore_hint(self.cache)}"
                )
        try:
            losses, offsets = np.load(losses_file, mmap_mode="r"), np.load(offsets_file)
        except (OSError, ValueError) as error:
            hint = rescore_hint(self.cache)
            raise InvalidArgument(f"Can't read {losses_file} or {offsets_file}: {error}. {hint}") from None
        if len(losses) != offsets[-1]:
            raise InvalidArgument(
                f"{losses_file} holds {len(losses):,} losses, {offsets_file} says {offsets[-1]:,}."
                f" {rescore_hint(self.cache)}"
            )
        check_finite_losses(losses, offsets, losses_file, shard * self.blocks_per_shard)
        return losses, offsets


def check_finite_losses(losses: np.ndarray, offsets: np.ndarray, losses_file: Path, first_block: int) -> None:
    """Refuses a shard holding a NaN or infinite loss (scored by a teacher whose weights hold NaN, before
    `score-teacher` refused such a teacher): training on it would count those tokens unmapped, guided by nothing. One
    pass over the shard, when a process first opens it."""
    finite = np.isfinite(losses)
    if not finite.all():
        row = int(np.searchsorted(offsets, np.argmin(finite), side="right")) - 1
        raise NotFinite(
            f"{losses_file} holds non-finite teacher losses (NaN or inf), the first in block {first_block + row}:"
            " the teacher that scored it can't guide. Score a sound teacher into a new --output"
            " (`vocagnolm score-teacher` now refuses such a teacher)."
        )


def load_cache_manifest(cache: Path) -> dict:
    path = Path(cache) / CACHE_MANIFEST
    if not path.is_file():
        raise PathMissing(
            f"{cache} is not a teacher loss cache (no {CACHE_MANIFEST}), or its scoring has not finished."
            " Run `vocagnolm score-teacher --data DIR --teacher CHECKPOINT_DIR --output CACHE` (again: it resumes)."
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != CACHE_FORMAT:
        data = manifest.get("data", {}).get("path", "DIR")
        teacher = manifest.get("teacher", {}).get("checkpoint_dir", "CHECKPOINT_DIR")
        raise InvalidArgument(
            f"{path} has format {manifest.get('format')!r}; this version of litgpt-vocagnolm reads {CACHE_FORMAT!r}."
            f" Score the teacher again: `vocagnolm score-teacher --data {data} --teacher {teacher} --output NEW_CACHE`"
            f" (or delete {cache} and give it as --output)."
        )
    return manifest


def check_cache(cache: Path, data_manifest: Path, teacher_dir: Path | None, precision: str | None = None) -> dict:
    """Fails unless the cache was scored on exactly this prepared data (and by this teacher, by the hash of its
    weights, and in this teacher precision, when they are given)."""
    manifest = load_cache_manifest(cache)
    data_sha = file_sha256(data_manifest)
    if manifest["data"]["manifest_sha256"] != data_sha:
        raise InvalidArgument(
            f"The teacher loss cache {cache} was scored on other data: its data manifest sha256 is"
            f" {manifest['data']['manifest_sha256']} ({manifest['data']['path']}), {data_manifest} has {data_sha}."
            " Score this data: `vocagnolm score-teacher --data ... --output NEW_CACHE`."
        )
    for name, recorded in manifest.get("files", {}).items():  # a stat per file; the sha256 waits for first use
        file = Path(cache) / name
        if not inside(cache, name):
            raise InvalidArgument(
                f"{Path(cache) / CACHE_MANIFEST} lists {name!r}, which is not a file inside {cache}: a teacher loss"
                f" cache is read only from its own folder. {rescore_hint(cache)}"
            )
        if not file.is_file() or file.stat().st_size != recorded["bytes"]:
            found = f"has {file.stat().st_size:,} bytes" if file.is_file() else "is missing"
            raise InvalidArgument(
                f"{file} {found}; {Path(cache) / CACHE_MANIFEST} records {recorded['bytes']:,}. {rescore_hint(cache)}"
            )
    recorded = manifest["teacher"]
    if teacher_dir is not None and (
        recorded["weights_sha256"] != weights_sha256(teacher_dir)
        if "weights_sha256" in recorded  # caches scored before: the config and the weight files' names and sizes
        else recorded["fingerprint"] != checkpoint_fingerprint(teacher_dir)
    ):
        raise InvalidArgument(
            f"The teacher loss cache {cache} was scored by {recorded['checkpoint_dir']}, whose config and"
            f" weights differ from --teacher.checkpoint_dir {teacher_dir}. Drop one of the two, or score again."
        )
    if precision is not None and manifest.get("precision", precision) != precision:
        raise InvalidArgument(
            f"The teacher loss cache {cache} was scored in {manifest['precision']}, --teacher.precision is {precision}."
            f" Train with --teacher.precision {manifest['precision']}, or score again in {precision}."
        )
    return manifest
