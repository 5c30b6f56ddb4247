"""`vocagnolm score-teacher`: run the frozen teacher once over prepared data and store its per-token losses."""

import functools
import json
import queue
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import numpy as np
import torch
from litgpt.utils import parse_devices
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from litgpt_vocagnolm.data.prepared import MANIFEST, BlockDataset, VocAgnoData, check_split, padded_window
from litgpt_vocagnolm.data.teacher_cache import (
    CACHE_FORMAT,
    CACHE_MANIFEST,
    check_cache,
    checksum_file,
    file_record,
    shard_files,
    weights_sha256,
)
from litgpt_vocagnolm.errors import (
    InvalidArgument,
    NotFinite,
    UserError,
    at_least,
    check_devices,
    check_writable,
    failed_writes,
)
from litgpt_vocagnolm.files import LOCK, file_sha256, write_json
from litgpt_vocagnolm.models.weights import check_checkpoint_dir
from litgpt_vocagnolm.training.checks import check_teacher_config
from litgpt_vocagnolm.training.distributed import compile_blocks, hold_run_folder
from litgpt_vocagnolm.training.teacher import Teacher, check_precision, default_precision, teacher_token_loss


def score_teacher(
    *,
    data: Path,
    teacher: Path,
    output: Path | None = None,
    devices: int | str = 1,
    num_nodes: int = 1,
    precision: str | None = None,
    batch_size: int = 8,
    blocks_per_shard: int = 1024,
    num_workers: int = 2,
    compile: bool | None = None,
) -> None:
    """Run the frozen teacher once over prepared data and store its per-token losses (16-bit) for training.

    Training with `--teacher.cache OUTPUT` then loads no teacher: every guided run (top-k, aggregation, unmapped,
    chunk ablations) costs what plain cross-entropy costs. Data-parallel over devices and nodes: each rank holds the
    whole teacher and scores every world_size-th shard, so every block is scored once whatever the number of
    processes, and the cache is the same bytes. Killed and run again, it scores only the missing shards; a run again
    with another teacher (by the hash of its weights), precision or shard size is refused, naming both values.
    Stopped by SIGTERM (`scancel`, a time limit) it says so in one line, and a rerun continues. A teacher whose losses
    are NaN or infinite can't guide: the run stops at the first such batch, naming the teacher and the blocks.

    The GPU does not wait on the host: loader workers read and pad the windows into pinned memory, batches are copied
    without blocking, every forward has the same shape (batch_size x the data's padded window), the losses come back
    asynchronously and a writer thread writes and hashes the shards.

    Arguments:
        data: The output directory of `vocagnolm prepare`.
        teacher: The teacher's LitGPT checkpoint directory (the tokenizer the data was prepared with).
        output: The cache directory. Default: DATA/teacher_loss/<teacher directory name>.
        devices: Devices per node, at least 1 ("auto": every GPU).
        num_nodes: Number of nodes.
        precision: "bf16-true" (default on GPU), "16-true" or "32-true" (default on CPU).
        batch_size: Blocks per teacher forward pass, at least 1; above the blocks one forward can take (those of a
            shard, of the larger split) it is capped there, with a note.
        blocks_per_shard: Blocks per cache file, at least 1: the unit of resumption.
        num_workers: Loader worker processes per rank (0: read in the main process).
        compile: `torch.compile` the teacher's transformer blocks (one static shape: compiled once; the tiled head
            and its loss stay eager, see `distributed.compile_blocks`). Default: on a GPU, where it scores a quarter
            faster (60.7% of an H100's bf16 peak against 48.7% eager, docs/performance.md); off on a CPU,
            where compiling takes tens of seconds before the first batch.
    """
    # Every argument checked before anything is written (a refused run leaves no settings behind).
    for name, value, least in (
        ("batch_size", batch_size, 1),
        ("blocks_per_shard", blocks_per_shard, 1),
        ("num_workers", num_workers, 0),
        ("num_nodes", num_nodes, 1),
    ):
        at_least(f"--{name}", value, least)
    check_devices(devices)
    check_precision(precision, "--precision")
    job = Scoring.checked(Path(data), Path(teacher), output, precision, batch_size, blocks_per_shard)
    if job is None:
        return
    fabric = launch(devices, num_nodes)
    # One run per --output (rank 0 holds it); a full disk in one line, the shards written so far kept.
    with (
        stop_on_sigterm(job.output),
        failed_writes(job.output, job.bytes_needed(), "run the same command again: it scores only the missing shards"),
        hold_run_folder(fabric, job.output, "vocagnolm score-teacher"),
    ):
        model = load_teacher(fabric, job, compile)
        for split in ("train", "val"):
            score_split(fabric, model, job, split, num_workers)
        fabric.barrier()
        if fabric.global_rank == 0:
            report(job)


@dataclass
class Scoring:
    """What one `score-teacher` run scores, and how: its arguments checked (`checked`)."""

    data: Path
    """The prepared data."""
    teacher: Path
    """The teacher's checkpoint directory."""
    output: Path
    """The cache directory."""
    batch_size: int
    """Blocks per forward, capped where a forward can't take more (`usable_batch_size`)."""
    blocks_per_shard: int
    """Blocks per cache file."""
    manifest: dict
    """The prepared data's manifest."""
    settings: dict
    """What the cache records of its scoring (`cache_settings`)."""

    @property
    def precision(self) -> str:
        return self.settings["precision"]

    @classmethod
    def checked(
        cls,
        data: Path,
        teacher: Path,
        output: Path | None,
        precision: str | None,
        batch_size: int,
        blocks_per_shard: int,
    ) -> "Scoring | None":
        """The run, after every check that needs no model: the teacher, the data (its files inside their folder) and
        its tokenizer, the output and a killed run's settings there. None, with a note, when `output` already holds
        this teacher's losses on this data."""
        output = Path(output) if output is not None else data / "teacher_loss" / teacher.name
        check_checkpoint_dir(teacher, what="--teacher")
        prepared = VocAgnoData(path=data)
        prepared.check_tokenizers(None, teacher)  # the teacher's tokenizer must be the one the data was prepared with
        check_teacher_config(prepared.manifest, teacher, "--teacher", data)
        for split in ("train", "val"):
            check_split(data, split, prepared.manifest)
        check_writable(output, "--output")
        batch_size = usable_batch_size(batch_size, blocks_per_shard, prepared.manifest)
        precision = precision or default_precision(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        settings = cache_settings(teacher, data, precision, blocks_per_shard)
        if (output / CACHE_MANIFEST).is_file():
            check_same_settings(json.loads((output / CACHE_MANIFEST).read_text()), settings, output)
            check_cache(output, data / MANIFEST, None)  # every shard file there, at its recorded size
            print(f"{output} already holds this teacher's losses on this data: nothing to do.")
            return None
        if output.exists() and any(p.name not in ("train", "val", ".settings.json", LOCK) for p in output.iterdir()):
            raise InvalidArgument(f"--output {output} holds something else. Choose a new or empty directory.")
        if (output / ".settings.json").is_file():  # a killed run's: resume it only with the same settings
            check_same_settings(json.loads((output / ".settings.json").read_text()), settings, output)
        return cls(data, teacher, output, batch_size, blocks_per_shard, prepared.manifest, settings)

    def shards(self, split: str) -> int:
        """The number of shards of a split."""
        return -(-self.manifest["splits"][split]["blocks"] // self.blocks_per_shard)

    def bytes_needed(self) -> int:
        """The cache's size on disk: a float16 loss per teacher token of both splits."""
        return 2 * sum(split["teacher_tokens"] for split in self.manifest["splits"].values())


class ScoringStopped(UserError):
    """`score-teacher` stopped by SIGTERM (Slurm's `scancel`, a time limit, a preemption)."""


@contextmanager
def stop_on_sigterm(output: Path) -> Iterator[None]:
    """SIGTERM, while scoring, as a `ScoringStopped` naming what a rerun does (shards written so far are kept, each
    whole or absent: `ShardWriter`), instead of a silent death. Only the main thread can catch signals: elsewhere
    (a test's thread, say) SIGTERM keeps its default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise ScoringStopped(
            f"score-teacher stopped by SIGTERM: the shards written to {output} are kept; run the same command again"
            " to continue (it scores only the missing shards)."
        )

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(devices: int | str, num_nodes: int) -> L.Fabric:
    """The processes: one per device, data-parallel."""
    world_size = parse_devices(devices) * num_nodes
    fabric = L.Fabric(devices=devices, num_nodes=num_nodes, strategy="ddp" if world_size > 1 else "auto")
    fabric.launch()
    return fabric


def load_teacher(fabric: L.Fabric, job: Scoring, compile: bool | None) -> torch.nn.Module:
    """The output's settings written (a killed run's kept: the same, checked), then the teacher, loaded on every rank
    and compiled where asked (`compiles_by_default`)."""
    if fabric.global_rank == 0:
        job.output.mkdir(parents=True, exist_ok=True)
        write_json(job.output / ".settings.json", job.settings)
    fabric.barrier()
    model = Teacher(job.teacher, mode="online", precision=job.precision).load(fabric)
    if compiles_by_default(fabric.device) if compile is None else compile:
        compile_blocks(model)
    return model


def score_split(fabric: L.Fabric, model: torch.nn.Module, job: Scoring, split: str, num_workers: int) -> None:
    """Scores this rank's missing shards of a split (every world_size-th shard, from its rank) and writes each whole
    (`ShardWriter`): one forward per batch of consecutive blocks, all of one shape (batch_size x the data's padded
    window), read from `num_workers` loader workers."""
    # The block count of the manifest, not `len()` of a LitData dataset, which is a rank's share under DDP.
    num_blocks = job.manifest["splits"][split]["blocks"]
    shards = range(fabric.global_rank, job.shards(split), fabric.world_size)
    todo = [s for s in shards if not shard_files(job.output, split, s)[0].is_file()]
    (job.output / split).mkdir(parents=True, exist_ok=True)
    width = padded_window(job.manifest, model.max_seq_length)
    batches = [
        (shard, start, min(start + job.batch_size, end))
        for shard in todo
        for end in [min((shard + 1) * job.blocks_per_shard, num_blocks)]
        for start in range(shard * job.blocks_per_shard, end, job.batch_size)
    ]  # (shard, first block, end block) of each forward, in order
    loader = DataLoader(
        TeacherWindows(job.data, split, width),
        batch_sampler=[range(start, end) for _, start, end in batches],
        collate_fn=functools.partial(collate_windows, batch_size=job.batch_size),
        num_workers=num_workers,
        pin_memory=fabric.device.type == "cuda",
    )
    bar = tqdm(
        total=len(batches), desc=f"{split} (rank {fabric.global_rank})", unit="batch", disable=fabric.global_rank != 0
    )
    with ShardWriter(job.output, split, job.blocks_per_shard, num_blocks, job.teacher) as writer:
        tokens, t0 = 0, time.perf_counter()
        for (shard, start, end), (ids, lengths) in zip(batches, loader, strict=True):
            ids = ids.to(fabric.device, non_blocking=True)  # (batch_size, M)
            valid = torch.arange(ids.shape[1]) < lengths[:, None]  # (batch_size, M), built on the host
            valid = valid.to(fabric.device, non_blocking=True)
            with torch.no_grad():
                loss = teacher_token_loss(model, ids, valid).half()  # (batch_size, M)
            writer.put(shard, start, end, to_host(loss), lengths)
            tokens += int(lengths.sum())
            bar.update()
            bar.set_postfix(tokens_per_sec=f"{tokens / (time.perf_counter() - t0):,.0f}", refresh=False)
    bar.close()


def report(job: Scoring) -> None:
    """Rank 0, once every rank has written its shards: the cache's manifest (every shard's checksums, from the rank
    that scored it), in place of the run's settings, and a line per split."""
    counts = {}
    for split in ("train", "val"):
        teacher_tokens = job.manifest["splits"][split]["teacher_tokens"]
        size = sum(f.stat().st_size for f in (job.output / split).glob("*.npy"))
        counts[split] = {
            "blocks": job.manifest["splits"][split]["blocks"],
            "teacher_tokens": teacher_tokens,
            "bytes": size,
            "bytes_per_teacher_token": size / max(teacher_tokens, 1),
        }
    files = {}
    for split in counts:
        for shard in range(job.shards(split)):
            files.update(json.loads(checksum_file(job.output, split, shard).read_text()))
    write_json(job.output / CACHE_MANIFEST, {**job.settings, "splits": counts, "files": files})
    (job.output / ".settings.json").unlink()
    for split, c in counts.items():
        print(
            f"{split}: {c['blocks']:,} blocks, {c['teacher_tokens']:,} teacher tokens,"
            f" {c['bytes_per_teacher_token']:.3f} bytes per teacher token on disk"
        )
    print(f"Wrote {job.output / CACHE_MANIFEST}. Train with --teacher.cache {job.output}")


def usable_batch_size(batch_size: int, blocks_per_shard: int, manifest: dict) -> int:
    """`batch_size`, or, with a note, the most blocks one forward can take: a forward never spans two shards, nor more
    blocks than the larger split holds (the rest of a larger batch would be padding rows, scored for nothing)."""
    largest_split = max(split["blocks"] for split in manifest["splits"].values())
    usable = min(blocks_per_shard, largest_split)
    if batch_size > usable:
        print(
            f"--batch_size {batch_size} capped at {usable}: the most blocks a forward can take here (a shard holds"
            f" {blocks_per_shard}, the larger split {largest_split})."
        )
    return min(batch_size, usable)


def compiles_by_default(device: torch.device) -> bool:
    """Whether `score-teacher` compiles the teacher without `--compile`: on CUDA devices only (see its help)."""
    return device.type == "cuda"


def cache_settings(teacher: Path, data: Path, precision: str, blocks_per_shard: int) -> dict:
    """What a cache holds and how it was scored; `check_same_settings` compares all but the paths."""
    return {
        "format": CACHE_FORMAT,
        "teacher": {"checkpoint_dir": str(teacher.resolve()), "weights_sha256": weights_sha256(teacher)},
        "data": {"path": str(data.resolve()), "manifest_sha256": file_sha256(data / MANIFEST)},
        "dtype": "float16",
        "precision": precision,
        "blocks_per_shard": blocks_per_shard,
    }


def check_same_settings(recorded: dict, settings: dict, output: Path) -> None:
    """Fails, naming each old and new value, unless a cache (or a killed run's partial one) was scored with these
    settings. Paths are not compared: the same teacher and data by another path are the same."""
    differ = []
    for keys in (
        ("format",),
        ("teacher", "weights_sha256"),
        ("data", "manifest_sha256"),
        ("dtype",),
        ("precision",),
        ("blocks_per_shard",),
    ):
        old, new = recorded, settings
        for key in keys:
            old, new = (old or {}).get(key), new[key]
        if old != new:
            differ.append(f"{'.'.join(keys)}: {old} in the cache, {new} now")
    if differ:
        raise InvalidArgument(
            f"{output} holds losses scored otherwise ({'; '.join(differ)}). Score into another --output, or run with"
            " the cache's settings."
        )


class TeacherWindows(Dataset):
    """The teacher windows of a split's blocks, by the block's index in the split: `windows[i]` is block i's window
    (width,) long, padded with 0, and its length. Opens the blocks in each loader worker."""

    def __init__(self, path: Path, split: str, width: int) -> None:
        self.path, self.split, self.width = path, split, width
        self.blocks: BlockDataset | None = None

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.blocks is None:
            self.blocks = BlockDataset(self.path, self.split, shuffle=False, seed=0)
        window = torch.from_numpy(self.blocks[index]["teacher_ids"].astype(np.int64))
        return torch.nn.functional.pad(window, (0, self.width - len(window))), len(window)


def collate_windows(items: list[tuple[torch.Tensor, int]], batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of windows, padded with empty rows to `batch_size`: every forward has the same shape. Returns ids
    (batch_size, width) long and lengths (batch_size,) long, 0 on the padding rows."""
    ids = torch.zeros(batch_size, items[0][0].shape[0], dtype=torch.long)
    lengths = torch.zeros(batch_size, dtype=torch.long)
    for row, (window, length) in enumerate(items):
        ids[row], lengths[row] = window, length
    return ids, lengths


def to_host(loss: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Starts copying a device tensor to pinned host memory without waiting for it; returns the host tensor and the
    event that marks the copy done (None on the CPU, where there is nothing to copy)."""
    if loss.device.type != "cuda":
        return loss, None
    host = torch.empty(loss.shape, dtype=loss.dtype, pin_memory=True)
    host.copy_(loss, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


class ShardWriter:
    """A background thread that gathers each shard's losses as their copies land and writes the shard: offsets and
    checksums first, then the losses file renamed into place whole, so a shard counts as done (its losses file exists)
    only once everything is on disk. A failure in the thread is raised in the caller's thread, at the next `put` or
    at exit; a non-finite loss of `teacher` is one (`check_finite`): its shard is not written."""

    def __init__(self, output: Path, split: str, blocks_per_shard: int, num_blocks: int, teacher: Path) -> None:
        self.output, self.split, self.blocks_per_shard, self.num_blocks = output, split, blocks_per_shard, num_blocks
        self.teacher = teacher
        self.jobs: queue.Queue = queue.Queue(maxsize=8)  # batches in flight: the host memory they hold is bounded
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> "ShardWriter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.jobs.put(None)
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error

    def put(self, shard: int, start: int, end: int, loss: tuple, lengths: torch.Tensor) -> None:
        """Blocks `start`..`end` of `shard`: their losses (batch_size, M) float16 as `to_host` returned them."""
        if self.error is not None:
            raise self.error
        self.jobs.put((shard, start, end, loss, lengths))

    def run(self) -> None:
        pieces: list[np.ndarray] = []
        while (job := self.jobs.get()) is not None:
            if self.error is not None:
                continue  # drain, so that `put` never blocks on a dead writer
            try:
                shard, start, end, (loss, done), lengths = job
                if done is not None:
                    done.synchronize()
                loss = loss.numpy()
                pieces += [loss[row, 1:n] for row, n in enumerate(lengths[: end - start].tolist())]
                self.check_finite(pieces[-(end - start) :], start)
                if end == min((shard + 1) * self.blocks_per_shard, self.num_blocks):
                    self.write(shard, pieces)
                    pieces = []
            except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
                self.error = error

    def check_finite(self, pieces: list[np.ndarray], start: int) -> None:
        """Refuses the losses of blocks `start`, `start + 1`... unless all are finite: a teacher whose weights hold
        NaN, or whose losses overflow its precision, can't guide, and a cache of such losses would train plain
        cross-entropy. Checked on the host, in this thread: the device never waits for it."""
        bad = [start + row for row, piece in enumerate(pieces) if not np.isfinite(piece).all()]
        if bad:
            shard = start // self.blocks_per_shard
            raise NotFinite(
                f"The teacher {self.teacher} gives non-finite losses (NaN or inf) on {self.split} blocks"
                f" {bad[0]}..{bad[-1]} (shard {shard}, not written): it can't guide. Check its weights (`litgpt"
                f" generate {self.teacher}`), or score in --precision 32-true if its losses overflow 16 bits. The"
                f" shards written to {self.output} before hold finite losses; another teacher needs a new --output."
            )

    def write(self, shard: int, pieces: list[np.ndarray]) -> None:
        losses_file, offsets_file = shard_files(self.output, self.split, shard)
        offsets = np.zeros(len(pieces) + 1, dtype=np.uint32)
        offsets[1:] = np.cumsum([len(p) for p in pieces])
        np.save(offsets_file, offsets)
        tmp = losses_file.with_suffix(".partial.npy")
        np.save(tmp, np.concatenate(pieces) if pieces else np.zeros(0, np.float16))
        records = {f"{self.split}/{losses_file.name}": file_record(tmp)}
        records[f"{self.split}/{offsets_file.name}"] = file_record(offsets_file)
        write_json(checksum_file(self.output, self.split, shard), records)
        tmp.rename(losses_file)
