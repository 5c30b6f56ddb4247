"""Prepared data, read back: the blocks of a split, and `VocAgnoData`, the DataModule training streams.

`vocagnolm prepare` (prepare.py) writes DIR/manifest.json (read and checked by manifest.py), DIR/train and DIR/val
(LitData shards of blocks; packing.py describes a stored block). Here they are checked against the manifest, decoded to
plain arrays (`iter_blocks`, the contract of docs/design.md, "Prepared data") and batched for training
(`collate_blocks`), with the teacher's cached per-token losses attached when training reads a loss cache
(teacher_cache.py).
"""

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, NamedTuple, Optional, Sequence

import litdata.helpers
import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.sampler import ChunkedIndex
from litgpt.data import DataModule

from litgpt_vocagnolm.alignment.lexical import chunk_align, token_byte_lengths
from litgpt_vocagnolm.alignment.tokenizer_files import (
    find_tokenizer_file,
    load_tokenizer,
    same_vocabulary,
    tokenizer_sha256,
)
from litgpt_vocagnolm.data.manifest import MANIFEST, SPLITS, copy_again, load_manifest
from litgpt_vocagnolm.data.teacher_cache import TeacherLossCache
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing
from litgpt_vocagnolm.files import file_sha256, inside

# LitData asks PyPI for a newer version of itself whenever a dataset is written or opened (30 s timeout): a network
# call in every run and loader worker, which stalls firewalled cluster nodes. Nothing here should reach the network.
litdata.helpers._get_newer_version = lambda version: None

WINDOW_MULTIPLE = 64  # teacher windows are padded to a multiple of this: one shape per run, friendly to matmul tiles


def block_tokens(manifest: dict) -> int:
    """Student tokens per stored block: max_seq_length + 1 (inputs and shifted targets)."""
    return manifest["max_seq_length"] + 1


def byte_table(tokenizer_dir: Path, device: torch.device) -> torch.Tensor:
    """The UTF-8 bytes each token id of a tokenizer covers (`lexical.token_byte_lengths`), (V,) int64 on `device`;
    `selection.TokenBytes.look_up` reads a batch's from the student's and each teacher's (`--guidance.compare byte`)."""
    return torch.from_numpy(token_byte_lengths(load_tokenizer(tokenizer_dir))).to(device)


def padded_window(manifest: dict, teacher_block_size: Optional[int] = None) -> int:
    """The one teacher window length M of every batch of a run: the prepared data's `teacher_max_length` rounded up
    to a multiple of WINDOW_MULTIPLE, at most the teacher's block size. A fixed M gives `torch.compile` one shape to
    compile (a window padded to each batch's longest recompiles on every new length); the teacher's forward on
    padding is the price."""
    rounded = -(-manifest["teacher_max_length"] // WINDOW_MULTIPLE) * WINDOW_MULTIPLE
    return min(rounded, teacher_block_size or rounded)


class BlockDataset(StreamingDataset):
    """A split's stored blocks; with a teacher loss cache, each item also carries its block's cached `teacher_loss`
    (looked up by the block's index in the split, in the loader's worker processes).

    With further teachers (`others`: for each, its prepared data and loss cache or None), each item also carries, as
    "others", their blocks at the same index: the same student tokens (checked on every read; a mismatch fails,
    naming the block) with that teacher's window, ranges and cached losses.
    """

    def __init__(
        self,
        path: Path,
        split: str,
        shuffle: bool,
        seed: int,
        teacher_cache: Optional[Path] = None,
        others: Sequence[tuple[Path, Optional[Path]]] = (),
    ) -> None:
        super().__init__(input_dir=str(Path(path) / split), shuffle=shuffle, seed=seed)
        self.path, self.split = Path(path), split
        self.teacher_losses = None if teacher_cache is None else TeacherLossCache(teacher_cache, split)
        self.others = [
            BlockDataset(other, split, shuffle=False, seed=seed, teacher_cache=teacher_cache)
            for other, teacher_cache in others
        ]

    def __getitem__(self, index: Any) -> Any:
        position = index.index if isinstance(index, ChunkedIndex) else index
        try:
            item = super().__getitem__(index)
        except (IndexError, ValueError, OverflowError) as error:  # LitData on a chunk damaged in place (same size)
            raise InvalidArgument(
                f"Block {position} of {self.path / self.split} can't be read (LitData raised {type(error).__name__}):"
                f" {chunk_file(self.path / self.split, position)} is damaged. {copy_again(self.path)}"
            ) from error
        if self.teacher_losses is not None:
            item["teacher_loss"] = self.teacher_losses[position]
        if self.others:
            item["others"] = [other[position] for other in self.others]
            for other, block in zip(self.others, item["others"]):
                if not np.array_equal(block["student_ids"], item["student_ids"]):
                    raise InvalidArgument(
                        f"Block {position} of {other.path / self.split} holds other student tokens than block"
                        f" {position} of {self.path / self.split}: the data of every teacher must be prepared from"
                        " the same --input, --val_input, --student, --max_seq_length and --text_key."
                    )
        return item


def chunk_file(folder: Path, position: int) -> Path:
    """The chunk file of a split's `folder` that holds block number `position` (chunks hold consecutive blocks)."""
    end = 0
    for chunk in json.loads((folder / "index.json").read_text(encoding="utf-8"))["chunks"]:
        end += chunk["chunk_size"]
        if position < end:
            return folder / chunk["filename"]
    raise IndexError(f"{folder} holds {end} blocks, not {position + 1}.")


def check_split(path: Path, split: str, manifest: dict) -> None:
    """Fails, naming the file and the fix, unless the split's index is the one the manifest recorded, is one that
    `prepare` writes (`check_index`) and holds as many blocks as the manifest says, and every chunk file it lists is
    inside the split's folder, there with the size it records: a missing or cut chunk would otherwise surface only when
    the loader reaches it, maybe hours into training. Costs a `stat` per chunk (64 MB each)."""
    folder = Path(path) / split
    index = folder / "index.json"
    if not index.is_file() or file_sha256(index) != manifest["splits"][split]["index_sha256"]:
        raise InvalidArgument(
            f"{index} is missing or not the one {Path(path) / MANIFEST} recorded: the folder mixes two preparations."
            " Prepare the data again into a new --output."
        )
    fix = copy_again(path)
    listing = json.loads(index.read_text(encoding="utf-8"))
    check_index(index, listing, fix)
    indexed, recorded = sum(chunk["chunk_size"] for chunk in listing["chunks"]), manifest["splits"][split]["blocks"]
    if indexed != recorded:
        raise InvalidArgument(
            f"{Path(path) / MANIFEST} records {recorded:,} {split} blocks, and {index} lists {indexed:,}: the manifest"
            f" was edited or damaged. {fix}"
        )
    for chunk in listing["chunks"]:
        file, recorded = folder / chunk["filename"], chunk["chunk_bytes"]
        if not file.is_file():
            raise PathMissing(f"{file} is missing: {index} lists it ({recorded:,} bytes). {fix}")
        if file.stat().st_size != recorded:
            size = file.stat().st_size
            raise InvalidArgument(f"{file} has {size:,} bytes, {index} records {recorded:,}: it is damaged. {fix}")


def check_index(index: Path, listing: dict, fix: str) -> None:
    """Fails, naming `index` (a split's LitData index.json, read as `listing`), unless it is one `prepare` writes: every
    chunk it lists of a whole number of blocks, a file inside its folder (a name without `..`, not absolute, not a link
    out of it), and its blocks rebuilt by LitData's own loader as plain dicts (LitData imports whatever callable the
    `data_spec` names)."""
    folder = index.parent
    for chunk in listing["chunks"]:
        size = chunk.get("chunk_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise InvalidArgument(f"{index} lists a chunk of {size!r} blocks, not a whole number above 0. {fix}")
        if not inside(folder, chunk["filename"]):
            raise InvalidArgument(
                f"{index} lists the chunk {chunk['filename']!r}, which is not a file inside {folder}: prepared data is"
                f" read only from its own folder. {fix}"
            )
    config = listing.get("config") or {}
    if config.get("item_loader") != "PyTreeLoader" or not flat_dict_spec(config.get("data_spec")):
        raise InvalidArgument(
            f"{index} is not an index `vocagnolm prepare` writes: its blocks would be rebuilt by"
            f" {config.get('item_loader')!r} from the data_spec {str(config.get('data_spec'))[:80]!r}, not as LitData's"
            f" plain dicts. {fix}"
        )


def flat_dict_spec(data_spec: Any) -> bool:
    """Whether a LitData `data_spec` (torch's pytree spec, as JSON) is a dict of leaves: what `prepare` writes."""
    leaf = {"type": None, "context": None, "children_spec": []}
    try:
        _, root = json.loads(data_spec)
        return root["type"] == "builtins.dict" and all(child == leaf for child in root["children_spec"])
    except (TypeError, ValueError, KeyError):
        return False


def open_split(
    path: Path, split: str, manifest: dict, shuffle: bool = False, seed: int = 42, teacher_cache: Optional[Path] = None
) -> BlockDataset:
    """The split's blocks, after checking its files against the manifest (`check_split`); see `BlockDataset`."""
    check_split(path, split, manifest)
    return BlockDataset(path, split, shuffle=shuffle, seed=seed, teacher_cache=teacher_cache)


def student_side(manifest: dict) -> dict[str, Any]:
    """What decides a prepared dataset's student blocks: the same in the data of every teacher of one run. Input files
    by content (size and hash), not by path."""
    settings = manifest["settings"]

    def content(files: list) -> list:
        # A file by what it holds, not where it lies; data prepared before content hashes recorded [path, size].
        return [
            {k: v for k, v in f.items() if k not in ("path", "mtime_ns")} if isinstance(f, dict) else f[1:]
            for f in files
        ]

    counts = {f"{split} {k}": manifest["splits"][split][k] for split in SPLITS for k in ("blocks", "student_tokens")}
    return {
        "student tokenizer": settings["student"]["sha256"],
        "input files": content(settings["input"]),
        "val_input files": content(settings["val_input"]),
        **{k: settings[k] for k in ("max_seq_length", "text_key", "val_fraction")},
        **counts,
    }


def decode_block(item: dict[str, Any], block_tokens: int) -> dict[str, Any]:
    """A stored block in plain form, padded to `block_tokens` = max_seq_length + 1 (padding: id 0, ranges `(0, 0)`).

    Returns: `student_ids` (T + 1,) int64, `teacher_ids` (M,) int64, `ranges` (T + 1, 2) int64 `[a, b)` into
    `teacher_ids` (`a == b` unmapped), `num_tokens` (the student tokens that are not padding), `num_bytes`.
    """
    n = len(item["student_ids"])
    student_ids = np.zeros(block_tokens, dtype=np.int64)
    student_ids[:n] = item["student_ids"]
    ranges = np.zeros((block_tokens, 2), dtype=np.int64)
    ranges[:n, 0] = item["range_starts"]
    ranges[:n, 1] = ranges[:n, 0] + item["range_lengths"]
    return {
        "student_ids": student_ids,
        "teacher_ids": item["teacher_ids"].astype(np.int64),
        "ranges": ranges,
        "num_tokens": n,
        "num_bytes": int(item["num_bytes"]),
    }


def iter_blocks(path: Path, split: Literal["train", "val"] = "train") -> Iterator[dict[str, Any]]:
    """The blocks of a prepared dataset's split in stored order, decoded (see `decode_block`)."""
    manifest = load_manifest(path)
    for item in open_split(path, split, manifest):
        yield decode_block(item, block_tokens(manifest))


class TeacherSide(NamedTuple):
    """One teacher's part of a batch (B = batch size, T = max_seq_length, M = that teacher's padded window)."""

    ids: torch.Tensor
    """(B, M) long: the teacher's windows, padded with 0."""
    valid: torch.Tensor
    """(B, M) bool: False on that padding."""
    ranges: torch.Tensor
    """(B, T, 2) long: for each target token, the range `[a, b)` of window positions in its row whose characters
    cover it; `a == b`: unmapped."""
    loss: Optional[torch.Tensor] = None
    """(B, M) float32, from a teacher loss cache (`VocAgnoData.connect`'s `teacher_caches`): its per-token losses, NaN
    where unavailable; None without a cache."""


class Batch(NamedTuple):
    """A training micro-batch: the student's tokens and one side per teacher, the same for one teacher and several."""

    input_ids: torch.Tensor
    """(B, T) long: student tokens."""
    targets: torch.Tensor
    """(B, T) long: the next student tokens, -100 on padding."""
    teachers: list[TeacherSide]
    """One per teacher, in the order of `VocAgnoData.paths`; empty for plain LitGPT data."""
    num_bytes: Optional[torch.Tensor] = None
    """(B,) long: UTF-8 bytes of the text the targets cover (for bits per byte); None for plain LitGPT data."""

    @classmethod
    def of(cls, loaded: Any) -> "Batch":
        """What a loader yields, as a batch: `VocAgnoData`'s are; a plain LitGPT data module's (B, T + 1) token
        blocks (`ce` only) have no teacher side."""
        if isinstance(loaded, Batch):
            return loaded
        return cls(loaded[:, :-1].long(), loaded[:, 1:].long(), [])

    def to(self, device: torch.device) -> "Batch":
        """The batch with every tensor on `device`."""

        def move(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if tensor is None else tensor.to(device)

        teachers = [TeacherSide(*map(move, side)) for side in self.teachers]
        return Batch(move(self.input_ids), move(self.targets), teachers, move(self.num_bytes))


def collate_blocks(
    items: list[dict[str, Any]],
    block_tokens: int,
    num_chunks: Optional[int] = None,
    windows: Optional[Sequence[int]] = None,
) -> Batch:
    """Stored blocks, as `BlockDataset` yields them (each with its further teachers' blocks under "others") -> a batch;
    see `batch_of_blocks`."""
    teachers = [items, *map(list, zip(*(item.get("others", ()) for item in items)))]
    return batch_of_blocks(teachers, block_tokens, num_chunks, windows)


def batch_of_blocks(
    teachers: Sequence[Sequence[dict[str, Any]]],
    block_tokens: int,
    num_chunks: Optional[int] = None,
    windows: Optional[Sequence[int]] = None,
) -> Batch:
    """One list of stored blocks per teacher (the same student tokens row by row, each teacher's windows) -> a batch.
    `num_chunks` replaces the ranges by chunk alignment (the `chunk` baseline); `windows` pads each teacher's windows
    to that length (one per teacher, `padded_window`), by default to the batch's longest."""
    windows = windows or [None] * len(teachers)
    blocks = [[decode_block(item, block_tokens) for item in items] for items in teachers]
    student_ids = torch.from_numpy(np.stack([block["student_ids"] for block in blocks[0]]))  # (B, T + 1)
    padding = torch.arange(block_tokens) >= torch.tensor([block["num_tokens"] for block in blocks[0]])[:, None]
    return Batch(
        input_ids=student_ids[:, :-1],
        targets=student_ids[:, 1:].masked_fill(padding[:, 1:], -100),
        teachers=[
            teacher_side(items, decoded, num_chunks, width)
            for items, decoded, width in zip(teachers, blocks, windows, strict=True)
        ],
        num_bytes=torch.tensor([block["num_bytes"] for block in blocks[0]]),
    )


def teacher_side(
    items: Sequence[dict[str, Any]], blocks: list[dict[str, Any]], num_chunks: Optional[int], width: Optional[int]
) -> TeacherSide:
    """One teacher's part of a batch: its windows padded to `width` (default: the longest), their padding, the student
    tokens' ranges into them and, from a loss cache, its per-token losses."""
    if num_chunks is not None:
        for block in blocks:
            n = block["num_tokens"]
            block["ranges"][:] = 0
            block["ranges"][:n] = chunk_align(n, len(block["teacher_ids"]), num_chunks)
    longest = max(len(block["teacher_ids"]) for block in blocks)
    if width is not None and width < longest:
        raise ValueError(f"A teacher window of {longest} tokens does not fit the run's padded window of {width}.")
    width = width or max(1, longest)  # M >= 1 keeps the teacher's forward defined
    teacher_ids = torch.zeros(len(blocks), width, dtype=torch.long)  # (B, M)
    teacher_valid = torch.zeros(len(blocks), width, dtype=torch.bool)  # (B, M)
    for row, block in enumerate(blocks):
        teacher_ids[row, : len(block["teacher_ids"])] = torch.from_numpy(block["teacher_ids"])
        teacher_valid[row, : len(block["teacher_ids"])] = True
    ranges = torch.from_numpy(np.stack([block["ranges"][1:] for block in blocks]))  # (B, T, 2)
    loss = None
    if "teacher_loss" in items[0]:  # from a teacher loss cache
        loss = torch.full((len(blocks), width), float("nan"))  # (B, M)
        for row, item in enumerate(items):
            loss[row, : len(item["teacher_loss"])] = torch.from_numpy(item["teacher_loss"])
    return TeacherSide(teacher_ids, teacher_valid, ranges, loss)


@dataclass
class VocAgnoData(DataModule):
    """Blocks prepared by `vocagnolm prepare`, streamed with LitData: `--data VocAgnoData --data.path DIR`.

    Loaders yield `Batch`es: the student's input_ids and targets, num_bytes, and one `TeacherSide` per teacher (its
    windows padded to the run's `padded_window`, their validity, the ranges into them and, with `teacher_caches`
    connected, the cached losses): `path`'s teacher first, then each of `other_teachers`.
    The recipe reads both splits through `order.train_loader` and `order.val_loader`: one global order of the blocks
    from the seed, consumed by a count of blocks whatever the number of processes. `train_dataloader` and
    `val_dataloader` are LitData's own streaming loaders (its shuffle, blocks dealt to ranks by their number), for
    LitGPT's tools and `benchmarks/bench_order.py`'s comparison.
    """

    path: Path
    """Output directory of `vocagnolm prepare` (manifest.json, train/, val/)."""
    num_workers: int = 4
    """Loader worker processes."""
    seed: int = 42
    """Seed of the training data's order: one permutation of the train split per epoch (`order.GlobalOrder`)."""
    other_teachers: list[Path] = field(default_factory=list)
    """Several teachers: the data of each further teacher, prepared from the same input with the same student
    tokenizer and settings (`vocagnolm prepare --teacher T2 --output DIR2`), so that its blocks hold the same student
    tokens; `path` holds the first teacher's. Their loss caches follow in `--teacher.cache`, in this order."""
    batch_size: int = field(default=1, init=False, repr=False)
    num_chunks: Optional[int] = field(default=None, init=False, repr=False)
    teacher_caches: Optional[list[Path]] = field(default=None, init=False, repr=False)
    teacher_block_size: Optional[int] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__init__()

    @property
    def paths(self) -> list[Path]:
        """The prepared data of each teacher, the first teacher's (`path`) first."""
        return [Path(self.path), *map(Path, self.other_teachers)]

    @functools.cached_property
    def manifests(self) -> list[dict]:
        return [load_manifest(path) for path in self.paths]

    @property
    def manifest(self) -> dict:
        return self.manifests[0]

    def connect(
        self,
        tokenizer: Any = None,
        batch_size: int = 1,
        max_seq_length: Optional[int] = None,
        *,
        num_chunks: Optional[int] = None,
        teacher_caches: Optional[list[Path]] = None,
        teacher_block_size: Optional[int] = None,
    ) -> None:
        """LitGPT's late arguments, and three of the recipe's: `num_chunks` replaces every block's ranges by chunk
        alignment (`--guidance.method chunk`), `teacher_caches` attach each block's cached teacher losses
        (`--teacher.cache`: one cache per teacher, in the order of `paths`), `teacher_block_size` caps the padded
        window (`padded_window`) at the online teachers' smallest block size."""
        # Both checked where they enter: `num_chunks` by `GuidanceArgs`, one cache per teacher by `checks.check_setup`.
        self.batch_size, self.num_chunks, self.teacher_caches = batch_size, num_chunks, teacher_caches
        self.teacher_block_size = teacher_block_size
        prepared = self.manifest["max_seq_length"]
        if max_seq_length is not None and max_seq_length != prepared:
            raise InvalidArgument(
                f"{self.path} holds blocks for max_seq_length {prepared}, but training asks for {max_seq_length}."
                f" Prepare it again with `vocagnolm prepare --max_seq_length {max_seq_length}`, or train with"
                f" --train.max_seq_length {prepared} (a student whose block size is {prepared} or more)."
            )

    def check_files(self) -> None:
        """Fails, naming the file and the fix, unless the manifests and both splits' files are as prepared, and every
        teacher's data holds the same student blocks as the first's (`check_same_blocks`)."""
        for path, manifest in zip(self.paths, self.manifests):
            for split in SPLITS:
                check_split(path, split, manifest)
        self.check_same_blocks()

    def check_same_blocks(self, samples: int = 16) -> None:
        """With several teachers: fails, saying what differs, unless each further teacher's data was prepared with the
        first's student tokenizer, input files and settings, holds as many blocks and student tokens per split, and
        the same student tokens in `samples` blocks spread over each split. Loading checks every block again."""
        if len(self.paths) == 1:
            return
        expected = student_side(self.manifest)
        for path, manifest in zip(self.paths[1:], self.manifests[1:]):
            found = student_side(manifest)
            differ = [name for name in expected if expected[name] != found[name]]
            if not differ:  # the files were checked: read the blocks without checking them again
                for split in SPLITS:
                    first, other = BlockDataset(self.path, split, False, 0), BlockDataset(path, split, False, 0)
                    for i in np.linspace(0, len(first) - 1, min(samples, len(first))).astype(int).tolist():
                        if not np.array_equal(first[i]["student_ids"], other[i]["student_ids"]):
                            differ.append(f"the student tokens of {split} block {i}")
                            break
            if differ:
                raise InvalidArgument(
                    f"{path} (--data.other_teachers) does not hold the student blocks of {self.path} (--data.path):"
                    f" {', '.join(differ)} differ. Prepare every teacher's data with the same --input, --val_input,"
                    " --student, --max_seq_length, --text_key and --val_fraction; only --teacher and"
                    " --teacher_max_length may change."
                )

    def check_tokenizers(self, student_dir: Optional[Path], teacher_dir: Optional[Path], teacher: int = 0) -> None:
        """Fails unless the tokenizers in these dirs are the files the data was prepared with (the teacher's: that
        of the data of teacher number `teacher`, in the order of `paths`)."""
        for side, given in (("student", student_dir), ("teacher", teacher_dir)):
            if given is None:
                continue
            k = teacher if side == "teacher" else 0  # the student is the same in every teacher's data
            path, recorded, file = self.paths[k], self.manifests[k][side], find_tokenizer_file(given)
            sha256 = tokenizer_sha256(file)
            if sha256 != recorded["sha256"]:
                raise InvalidArgument(
                    f"The {side} tokenizer is not the one {path} was prepared with: {str(given)!r} has {file} (sha256"
                    f" {sha256}), its manifest records {recorded['path']} (sha256 {recorded['sha256']}). Pass the"
                    f" {side} the data was prepared with, or prepare the data with this one (`vocagnolm prepare"
                    f" --{side} {given}` and the data's other arguments, into a new --output)."
                )

    def same_vocabulary(self, student_dir: Path, teacher_dir: Optional[Path], teacher: int = 0) -> bool:
        """Whether every student token has the same id in the teacher's vocabulary (what `rho1` and `kld` need).

        Derived from the tokenizer files in these dirs (call `check_tokenizers` first: they are then the data's), not
        read from the manifest: data prepared before a larger teacher vocabulary was accepted recorded False for
        TinyLlama with Llemma, and rewriting a manifest would orphan the loss caches scored on it (keyed on its
        sha256). Without a teacher dir (a loss cache alone) the manifest's record stands; an old True (identical
        vocabularies) still holds.
        """
        if teacher_dir is None:
            return self.manifests[teacher]["same_vocabulary"]
        return same_vocabulary(load_tokenizer(student_dir), load_tokenizer(teacher_dir))

    def dataset(self, split: str, shuffle: bool = False) -> BlockDataset:
        """The split's blocks with every teacher's data and connected loss cache at the same index (`BlockDataset`).
        No file checks here (a stat per chunk, each split's index hashed): call `check_files` once before training,
        as the recipe's `check_setup` does."""
        teacher_caches = self.teacher_caches or [None] * len(self.paths)
        others = list(zip(self.paths[1:], teacher_caches[1:]))
        return BlockDataset(self.path, split, shuffle, self.seed, teacher_caches[0], others)

    def _loader(self, split: str, shuffle: bool) -> StreamingDataLoader:
        return StreamingDataLoader(
            self.dataset(split, shuffle),
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            collate_fn=functools.partial(
                collate_blocks,
                block_tokens=block_tokens(self.manifest),
                num_chunks=self.num_chunks,
                windows=[padded_window(manifest, self.teacher_block_size) for manifest in self.manifests],
            ),
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> StreamingDataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> StreamingDataLoader:
        return self._loader("val", shuffle=False)
