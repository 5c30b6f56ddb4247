"""The teacher loss cache: score the corpus once (`vocagnolm score-teacher`), train many times without the teacher.

Layout of a cache directory (written by `vocagnolm score-teacher`):
  manifest.json                 the teacher's fingerprint, the data manifest's sha256, counts, bytes per token
  <split>/<shard>.losses.npy    float16: every block's window losses, concatenated, without each window's first
                                token (never predicted: NaN by definition)
  <split>/<shard>.offsets.npy   uint32 (blocks + 1,): where each block's losses start in the shard
A shard holds `blocks_per_shard` consecutive blocks (by index in the prepared split) and appears atomically.
"""

import json
from pathlib import Path

import numpy as np

from litgpt_vocagnolm.checkpoints import checkpoint_fingerprint
from litgpt_vocagnolm.files import file_sha256

CACHE_FORMAT = "vocagnolm-teacher-loss/1"
CACHE_MANIFEST = "manifest.json"


def shard_files(cache: Path, split: str, shard: int) -> tuple[Path, Path]:
    return cache / split / f"{shard:06d}.losses.npy", cache / split / f"{shard:06d}.offsets.npy"


class TeacherLossCache:
    """Reads one split of a cache: `cache[i]` is block i's teacher loss, float32 (M_i,) with NaN first."""

    def __init__(self, cache: Path, split: str) -> None:
        manifest = load_cache_manifest(cache)
        self.cache, self.split, self.blocks_per_shard = Path(cache), split, manifest["blocks_per_shard"]
        self._shards: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # memory-mapped, opened lazily per process

    def __getitem__(self, index: int) -> np.ndarray:
        shard, row = divmod(index, self.blocks_per_shard)
        if shard not in self._shards:
            losses, offsets = shard_files(self.cache, self.split, shard)
            self._shards[shard] = (np.load(losses, mmap_mode="r"), np.load(offsets))
        losses, offsets = self._shards[shard]
        return np.concatenate([[np.nan], losses[offsets[row] : offsets[row + 1]]]).astype(np.float32)


def load_cache_manifest(cache: Path) -> dict:
    path = Path(cache) / CACHE_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{cache} is not a teacher loss cache (no {CACHE_MANIFEST}), or its scoring has not finished."
            " Run `vocagnolm score-teacher --data DIR --teacher CHECKPOINT_DIR --output CACHE` (again: it resumes)."
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != CACHE_FORMAT:
        raise ValueError(f"{path} has format {manifest.get('format')!r}, this version reads {CACHE_FORMAT!r}.")
    return manifest


def check_cache(cache: Path, data_manifest: Path, teacher_dir: Path | None) -> dict:
    """Fails unless the cache was scored on exactly this prepared data (and by this teacher, when one is given)."""
    manifest = load_cache_manifest(cache)
    data_sha = file_sha256(data_manifest)
    if manifest["data"]["manifest_sha256"] != data_sha:
        raise ValueError(
            f"The teacher loss cache {cache} was scored on other data: its data manifest sha256 is"
            f" {manifest['data']['manifest_sha256']} ({manifest['data']['path']}), {data_manifest} has {data_sha}."
            " Score this data: `vocagnolm score-teacher --data ... --output NEW_CACHE`."
        )
    if teacher_dir is not None and manifest["teacher"]["fingerprint"] != checkpoint_fingerprint(teacher_dir):
        raise ValueError(
            f"The teacher loss cache {cache} was scored by {manifest['teacher']['checkpoint_dir']}, whose config and"
            f" weights differ from --teacher.checkpoint_dir {teacher_dir}. Drop one of the two, or score again."
        )
    return manifest
