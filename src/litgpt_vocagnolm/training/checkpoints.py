"""The recipe's training checkpoints: saving them sharded, whole or not at all, finding the one to resume from,
writing the student of one as a lit_model.pth (`export` makes a LitGPT checkpoint directory of it).

Every weight file is read with `torch.load(weights_only=True)` (`weights.read_weights`, `weights.SafeReader`,
`weights.SafePlanner`): a weight file is data, and unpickling it without that restriction would run whatever code a
crafted file holds.
"""

import json
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, NamedTuple, Sequence

import lightning as L
import torch
import torch.distributed.checkpoint as dcp
import yaml
from lightning.fabric.wrappers import _unwrap_objects
from litgpt.data import DataModule
from litgpt.utils import copy_config_files, save_config
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from litgpt_vocagnolm.errors import (
    DiskFull,
    PathMissing,
    PathTaken,
    WriteFailed,
    failed_writes,
    thread_failures,
)
from litgpt_vocagnolm.files import HashingWriter, files_sha256
from litgpt_vocagnolm.models.weights import (
    CHECKSUMS,
    SafePlanner,
    SafeReader,
    UnreadableCheckpoint,
    read_weights,
)
from litgpt_vocagnolm.training.train_state import TRAIN_STATE, check_train_state, final_step

GB = 1e9
# Threads (and files) per rank that write a checkpoint's shards, and then hash them: a node's cores share the work.
WRITE_THREADS = min(4, os.cpu_count() or 1)


def previous_checkpoints(out_dir: Path) -> list[Path]:
    """The checkpoint directories (`step-*`, `final`, and their unfinished `.partial-*`) a run left in `out_dir`, and
    whatever else is there by those names (a link, a file: `check_out_dir` refuses them)."""
    if not out_dir.is_dir():
        return []
    pattern = r"(\.partial-)?(step-\d+|final)"
    return sorted(p for p in out_dir.iterdir() if re.fullmatch(pattern, p.name))


def resume_note(out_dir: Path) -> str:
    """What a run stopped now continues from: "run again with --resume auto: it continues from step-00000100"."""
    saved = saved_checkpoints(out_dir)
    return f"run again with --resume auto: it {f'continues from {saved[0][1].name}' if saved else 'starts afresh'}"


def check_out_dir(out_dir: Path, resume: bool | Literal["auto"] | Path, overwrite: bool) -> None:
    """Refuses a fresh run (no `--resume`) into an `out_dir` that holds a previous run's checkpoints: its `final/` and
    the `step-*` it saves would be overwritten, the old run's later steps kept, and a later `--resume auto` would
    continue the *old* run from them. With `overwrite` the run goes on, and deletes them (`previous_checkpoints`).

    Whatever the options, a link (or a file) where a checkpoint folder goes is refused, naming it: a run replaces and
    deletes its checkpoints, never through a link into a folder elsewhere."""
    previous = previous_checkpoints(out_dir)
    for path in previous:
        if path.is_symlink() or not path.is_dir():
            what = f"a link to {os.readlink(path)}" if path.is_symlink() else "a file"
            raise PathTaken(
                f"--out_dir {out_dir}: {path.name} is {what}, where the run keeps a checkpoint folder of its own (it"
                f" replaces and deletes them, never through a link). Remove it (rm {path}) or put a copy of the folder"
                " in its place; to resume from a checkpoint elsewhere, give --resume its folder and another --out_dir."
            )
    previous = [] if resume or overwrite else previous
    if previous:
        more = f" and {len(previous) - 5} more" if len(previous) > 5 else ""
        names = ", ".join(p.name for p in previous[:5]) + more
        raise PathTaken(
            f"--out_dir {str(out_dir)!r} holds a previous run's checkpoints ({names}). Continue that run with --resume"
            " auto, choose another --out_dir, or pass --overwrite true to delete them and start afresh."
        )


def file_checksums(directory: Path, shards_of: int | None = None, skip: Sequence[str] = ()) -> dict[str, str]:
    """sha256 of the files in a checkpoint directory, by name, hashed in parallel threads: the DCP shards that rank
    `shards_of` wrote (`__<rank>_*.distcp`), or, without it, every file but the shards, checksums.json and `skip`
    (files whose hash is already known)."""
    if shards_of is None:
        skip = {*skip, CHECKSUMS}
        paths = [p for p in directory.iterdir() if p.is_file() and p.suffix != ".distcp" and p.name not in skip]
    else:
        paths = list(directory.glob(f"__{shards_of}_*.distcp"))
    return dict(sorted(files_sha256(paths).items()))


def check_resume_path(path: Path, flag: str = "--resume") -> None:
    """`--resume PATH` (or the checkpoint that option `flag` names), before any process starts: a sharded checkpoint
    directory (or a file in one) whose index loads. Its checksums are checked once the processes run, each rank a share
    of the files (`find_resume_checkpoint`)."""
    if not os.path.exists(path):  # os.path's: False, not an error, for a name too long
        raise PathMissing(f"{flag} {str(path)!r} does not exist: pass a step-* (or final) directory the recipe saved.")
    if path.is_file():
        read_weights(path)  # a crafted or damaged weight file: refused, naming it
        path = path.parent
    if not (path / ".metadata").is_file():
        newest = ", or --resume auto for the newest in --out_dir" if flag == "--resume" else ""
        raise UnreadableCheckpoint(
            f"{flag} {str(path)!r} is not a sharded checkpoint (no .metadata): pass a step-* (or final) directory the"
            f" recipe saved{newest}."
        )
    SafeReader(path).read_metadata()


def verify_checkpoint(step_dir: Path, rank: int = 0, world_size: int = 1) -> None:
    """Raises `UnreadableCheckpoint`, naming the file, unless `step_dir` is a complete sharded checkpoint whose files
    match checksums.json (every rank hashes its share of the files: a whole checkpoint is read once over the ranks),
    whose index loads and whose train state holds what a run saves (`check_train_state`)."""
    if not (step_dir / CHECKSUMS).is_file():
        raise UnreadableCheckpoint(f"Cannot read {step_dir / CHECKSUMS}: missing, so the checkpoint is incomplete.")
    try:
        expected = json.loads((step_dir / CHECKSUMS).read_text())
        train_state = json.loads((step_dir / TRAIN_STATE).read_text())
        hparams = yaml.safe_load((step_dir / "hyperparameters.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise UnreadableCheckpoint(f"Cannot read {step_dir}: {error}") from error
    check_train_state(step_dir, train_state, hparams)
    names = sorted(expected)[rank::world_size]
    try:
        found = files_sha256([step_dir / name for name in names])
    except OSError as error:
        raise UnreadableCheckpoint(f"Cannot read {error.filename or step_dir}: {error}") from error
    for name in names:
        if found[name] != expected[name]:
            raise UnreadableCheckpoint(
                f"{step_dir / name} does not match its checksum in {CHECKSUMS}: the file is damaged."
            )
    SafeReader(step_dir).read_metadata()


def saved_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """The checkpoints in `out_dir` (`step-*` and `final`, each renamed so once complete) and the step each holds, the
    latest step first; `final` after a `step-*` of its step (they hold the same state). A `final` whose train state
    can't be read comes last."""

    def step(path: Path) -> int:
        return int(path.name.removeprefix("step-")) if path.name != "final" else final_step(path)

    found = [(step(p), p) for p in previous_checkpoints(out_dir) if not p.name.startswith(".partial-")]
    return sorted(found, key=lambda pair: (pair[0], pair[1].name != "final"), reverse=True)


def find_resume_checkpoint(fabric: L.Fabric, resume: bool | Literal["auto"] | Path, out_dir: Path) -> Path | None:
    """The checkpoint directory to resume from: the one of the latest step in `out_dir` (`saved_checkpoints`: a
    `step-*`, or the finished run's `final`, which a larger budget continues) that is complete and undamaged.

    LitGPT takes the newest step; if that one is damaged (a node lost while the file system flushed it, a full disk),
    a requeued job fails on every requeue. Here, for `--resume auto` or `True`, a checkpoint that `verify_checkpoint`
    refuses (a file missing, or not matching its checksum) is reported and skipped, newest first, and only one that
    every rank verifies is taken (one all-reduce per checkpoint tried), so all ranks resume from the same step. With
    none, `auto` starts afresh and `True` fails; with none readable both fail, saying how to start afresh (a finished
    run's `final` is kept). A `resume` path (a checkpoint directory or a file in one) is verified the same way, and
    fails if it doesn't verify.
    """
    if not resume:
        return None
    if isinstance(resume, Path):
        candidates = [resume if resume.is_dir() else resume.parent]
    else:  # rank 0's list, so that every rank tries the same directories even where one rank sees a stale listing
        candidates = [path for _, path in saved_checkpoints(out_dir)]
    candidates = fabric.broadcast(candidates)
    for path in candidates:
        try:
            verify_checkpoint(path, fabric.global_rank, fabric.world_size)
            reason = None
        except UnreadableCheckpoint as error:
            reason = str(error)
        failed = fabric.all_reduce(torch.tensor(float(reason is not None), device=fabric.device), reduce_op="sum")
        if failed.item() == 0:
            return path
        fabric.print(f"Skipping {path}: {reason or 'another rank cannot read it'}")
    if isinstance(resume, Path):
        raise UnreadableCheckpoint(f"--resume {str(candidates[0])!r} can't be resumed from: see the line above.")
    skipped = f" ({len(candidates)} unreadable, skipped)" if candidates else ""
    if out_dir / "final" in candidates:  # starting afresh would replace the finished run's final/
        raise UnreadableCheckpoint(
            f"--resume {str(resume).lower()}: no readable checkpoint in --out_dir {out_dir}{skipped}, and"
            f" {out_dir / 'final'} holds a finished run: delete it to start afresh there, or choose another --out_dir."
        )
    if resume is True:
        raise PathMissing(f"--resume true, but no readable checkpoint in --out_dir {out_dir}{skipped}.")
    if candidates:  # training from step 0 would later replace them: the user decides
        raise UnreadableCheckpoint(
            f"--resume auto: no readable checkpoint in --out_dir {out_dir}{skipped}, see the lines above. To start"
            " afresh there, pass --resume false --overwrite true (it deletes them), or choose another --out_dir."
        )
    return None


class Pending(NamedTuple):
    """A save in flight (`Checkpointer._save`)."""

    future: Future
    """Its shards' write: `dcp.async_save`'s, or a blocking save's, done (`finished`)."""
    failures: list[BaseException]
    """The failed writes of DCP's writer threads, which DCP does not report (`errors.thread_failures`)."""
    partial_dir: Path
    checkpoint_dir: Path
    export: dict | None
    """The counters a final save's lit_model.pth carries; None: no lit_model.pth."""
    needed: int
    """The bytes it writes, over all ranks."""


def finished(work: Callable[[], Any]) -> Future:
    """A done future of `work()`: its result, or what it raised (as `dcp.async_save`'s future holds it)."""
    future: Future = Future()
    try:
        future.set_result(work())
    except BaseException as error:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        future.set_exception(error)
    return future


def join_writer_threads() -> None:
    """Waits for torch.distributed.checkpoint's writer threads that still run: where the write of its calling thread
    fails, `FileSystemWriter` (torch 2.13) raises without joining the others, which go on writing into the folder
    about to be deleted (and fail there unrecorded)."""
    for thread in threading.enumerate():
        if thread.name.endswith("(_write_files_from_queue)"):  # Python names a thread after its target
            thread.join()


def new_folder(path: Path) -> None:
    """`path` as an empty folder: whatever an earlier attempt left there removed."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


class Checkpointer:
    """Sharded training checkpoints with `torch.distributed.checkpoint` (DCP), as torchtitan writes them: every rank
    writes its own shard of the student and its AdamW state (`__<rank>_0.distcp`), nobody gathers the whole state.
    A checkpoint directory holds those shards and DCP's index (`.metadata`), train_state.json (counters and the data
    position: blocks consumed over all ranks), hyperparameters.yaml, the model config, the tokenizer files and
    checksums.json.

    Fabric's `ModelParallelStrategy(save_distributed_checkpoint=True)` writes DCP too, but only under that strategy
    (not on one device), synchronously, with rank 0's loader state alone and its index unpickled without restriction;
    DCP is called directly here, the same way on one process and on many.

    A save is asynchronous where `blocking` is False (`dcp.async_save`: the state is copied to host memory, then
    written by a thread while training goes on, over a gloo group of its own so that its collectives never interleave
    with training's); the directory is written as `.partial-<name>` and renamed only once every rank's shard is on
    disk and checksums.json written (`finish`), so a job killed mid-save resumes from the previous checkpoint.
    """

    def __init__(
        self,
        fabric: L.Fabric,
        state: dict,
        out_dir: Path,
        tokenizer_dir: Path | None,
        hparams: dict,
        history: Sequence[str] = (),
    ) -> None:
        """Saves `state` (model, optimizer, counters, data position; a LitGPT data module's loader) in `out_dir` with
        `tokenizer_dir`'s files and `hparams` as hyperparameters.yaml, headed by `history` (`checks.resume_history`)."""
        self.fabric, self.state, self.out_dir = fabric, state, out_dir
        self.tokenizer_dir, self.hparams, self.history = tokenizer_dir, hparams, history
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.group = torch.distributed.new_group(backend="gloo") if distributed else None
        self.pending: Pending | None = None  # the save in flight
        self.background = ExitStack()  # while a save is written: its writer threads' failures are recorded

    def check_room(self) -> None:
        """Refuses, at the start of a run, an `out_dir` without room for its final checkpoint: the shards, AdamW's two
        moments (twice the weights, before the first step has made them) and lit_model.pth. It reads the optimizer's
        state as it is (a resumed run's): `get_state_dict` would make it with a step of zero gradients."""
        model, optimizer = _unwrap_objects(self.state["model"]), _unwrap_objects(self.state["optimizer"])
        weights = tensor_bytes(get_model_state_dict(model))
        moments = tensor_bytes(list(optimizer.state.values())) or 2 * weights
        self._check_free_space(self.out_dir / "final", 2 * weights + moments)

    def save(self, step: int, blocking: bool = True) -> Path:
        """Saves the state of step `step` in `out_dir/step-<step>` (returned), in the background unless `blocking`."""
        return self._save(self.out_dir / f"step-{step:08d}", blocking, export=False)

    def save_final(self) -> Path:
        """Writes the state to `out_dir/final`, the student also as one lit_model.pth (for `litgpt generate`)."""
        return self._save(self.out_dir / "final", blocking=True, export=True)

    def _save(self, checkpoint_dir: Path, blocking: bool, export: bool) -> Path:
        fabric, state = self.fabric, self.state
        self.finish()  # one save in flight at a time
        model, optimizer = _unwrap_objects(state["model"]), _unwrap_objects(state["optimizer"])
        model_state, optimizer_state = get_state_dict(model, optimizer)
        shard_bytes = tensor_bytes(model_state) + tensor_bytes(optimizer_state)
        export_bytes = tensor_bytes(model_state) if export else 0
        needed = shard_bytes + export_bytes
        free = self._check_free_space(checkpoint_dir, needed)
        partial_dir = checkpoint_dir.with_name(f".partial-{checkpoint_dir.name}")
        exported = f", {export_bytes / GB:.2f} GB of lit_model.pth" if export else ""
        fabric.print(
            f"Saving checkpoint to {str(checkpoint_dir)!r}: {shard_bytes / GB:.2f} GB of weights and AdamW state"
            f"{exported} ({free / GB:,.1f} GB free there)"
        )
        counters = {"iter_num": state["iter_num"], "step_count": state["step_count"]}
        loader = _unwrap_objects(state.get("train_dataloader"))  # a LitGPT data module's own stateful loader
        loaders = self._gather(loader.state_dict()) if loader is not None else None
        shards = {"model": model_state, "optimizer": optimizer_state}
        # As many files per rank as threads write them: they are hashed in parallel too (`file_checksums`).
        writer = dcp.FileSystemWriter(partial_dir, thread_count=WRITE_THREADS)
        group, no_dist = self.group, self.group is None
        t0 = time.perf_counter()
        with self._writing(partial_dir):
            self._on_rank_0(lambda: new_folder(partial_dir), needed)  # and every rank waits for it
            self._on_rank_0(lambda: self._write_state(partial_dir, counters, loaders, model.config), needed)
            failures = self.background.enter_context(thread_failures(errnos=None))
            if blocking:
                future = finished(lambda: dcp.save(shards, storage_writer=writer, process_group=group, no_dist=no_dist))
                if future.exception() is None:
                    fabric.print(f"  shards written in {time.perf_counter() - t0:.2f} s")
            else:
                future = dcp.async_save(shards, storage_writer=writer, process_group=group, no_dist=no_dist)
        self.pending = Pending(future, failures, partial_dir, checkpoint_dir, counters if export else None, needed)
        if blocking:
            self.finish(report=True)
            fabric.print(f"  saved in {time.perf_counter() - t0:.2f} s")
        return checkpoint_dir

    def _write_state(self, partial_dir: Path, counters: dict, loaders: list | None, config: Any) -> None:
        """Rank 0's files of a checkpoint besides the shards: train state, hyperparameters, tokenizer, config."""
        train_state = {**counters, "position": self.state["position"], "world_size": self.fabric.world_size}
        if loaders is not None:
            train_state["train_dataloader"] = loaders
        (partial_dir / TRAIN_STATE).write_text(json.dumps(train_state, indent=1))
        with open(partial_dir / "hyperparameters.yaml", "w", encoding="utf-8") as f:
            f.writelines(f"# {line}\n" for line in self.history)
            yaml.safe_dump(self.hparams, f, sort_keys=False)
        if self.tokenizer_dir is not None:
            copy_config_files(self.tokenizer_dir, partial_dir)
        save_config(config, partial_dir)

    def _check_free_space(self, checkpoint_dir: Path, needed: int) -> int:
        """Refuses, on every rank and before anything is written, a save that the file system of `out_dir` (shared by
        the ranks, as on a cluster) has no room for: `needed` bytes over all ranks. Returns the free bytes."""
        free = 0
        if self.fabric.global_rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.out_dir).free
        free = self.fabric.broadcast(free)
        if needed > free:
            raise DiskFull(
                f"Saving {checkpoint_dir} needs {needed / GB:.2f} GB and the file system of {self.out_dir} has"
                f" {free / GB:.2f} GB free: make room there (or give another --out_dir), then"
                f" {resume_note(self.out_dir)}."
            )
        return free

    @contextmanager
    def _writing(self, partial_dir: Path) -> Iterator[None]:
        """A checkpoint's write that fails (`_agreed`: one line, on every rank) deletes its unfinished directory, giving
        the room back; the earlier checkpoints are untouched."""
        try:
            yield
        except WriteFailed:
            if self.fabric.global_rank == 0:
                shutil.rmtree(partial_dir, ignore_errors=True)
            raise

    def poll(self) -> None:
        """Completes a background save once every rank's write is done (one all-reduce while one is in flight)."""
        if self.pending is None:
            return
        done = torch.tensor(float(self.pending.future.done()), device=self.fabric.device)
        if self.fabric.all_reduce(done, reduce_op="sum").item() == self.fabric.world_size:
            self.finish()

    def finish(self, report: bool = False) -> None:
        """Waits for the save in flight, if any; rank 0 then writes checksums.json (every rank's sha256 of its shards)
        and renames the directory. A final save's lit_model.pth is written by rank 0 while every rank hashes its
        shards in a thread. `report`: print the phase's seconds."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        with self.background:  # the writer threads' failures, recorded since the save began
            failure = pending.future.exception()
            join_writer_threads()
        failure = failure or next(iter(pending.failures), None)

        def shards_written() -> None:
            if failure is not None:
                raise failure

        with self._writing(pending.partial_dir):
            self._agreed(shards_written, pending.needed)
            self._complete(pending, report)

    def _complete(self, pending: Pending, report: bool) -> None:
        fabric, partial_dir, needed = self.fabric, pending.partial_dir, pending.needed
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=1) as pool:
            # Each rank hashes the shards it wrote (a checkpoint is read once, over all ranks), rank 0 the rest.
            hashed = pool.submit(file_checksums, partial_dir, shards_of=fabric.global_rank)
            known = {}
            if pending.export is not None:  # written by rank 0 alone
                lit_model = partial_dir / "lit_model.pth"
                sha256 = self._on_rank_0(lambda: export_lit_model(partial_dir, lit_model, extra=pending.export), needed)
                known = {lit_model.name: sha256}
            shard_sums = self._agreed(hashed.result, needed)

        def rename() -> None:
            sums = {k: v for rank in shard_sums for k, v in rank.items()} | known
            sums |= file_checksums(partial_dir, skip=known)
            (partial_dir / CHECKSUMS).write_text(json.dumps(dict(sorted(sums.items())), indent=1))
            shutil.rmtree(pending.checkpoint_dir, ignore_errors=True)
            partial_dir.rename(pending.checkpoint_dir)

        self._on_rank_0(rename, needed)  # and every rank waits for it
        if report:
            what = "checksums and lit_model.pth" if pending.export is not None else "checksums"
            fabric.print(f"  {what} in {time.perf_counter() - t0:.2f} s")

    def _agreed(self, write: Callable[[], Any], needed: int) -> list[Any]:
        """`write()` on every rank, every rank's result returned in rank order; a write that fails on any rank, of any
        errno (`errors.failed_writes`: all of it is the checkpoint's), raised on every rank as the first such rank's
        one line (an all-gather, which every rank waits on: none is left waiting for a rank that stopped, until the
        process group's timeout)."""
        result, failure = None, None
        try:
            with failed_writes(self.out_dir, needed, resume_note(self.out_dir), errnos=None):
                result = write()
        except WriteFailed as error:
            failure = (type(error), str(error))
        gathered = self._gather((result, failure))
        failures = [failure for _, failure in gathered if failure is not None]
        if failures:
            kind, message = failures[0]
            raise kind(message)
        return [result for result, _ in gathered]

    def _on_rank_0(self, write: Callable[[], Any], needed: int) -> Any:
        """`write()` on rank 0 alone, its result returned there (None elsewhere); a write that fails there raised on
        every rank (`_agreed`)."""
        return self._agreed(write if self.fabric.global_rank == 0 else lambda: None, needed)[0]

    def load(self, checkpoint_dir: Path) -> dict:
        """Restores model, optimizer and counters of the state from `checkpoint_dir` in place, resharded for this
        run's number of processes, and a LitGPT data module's own loader state (saved on as many processes, see
        `data_position`, which gives the data position). Returns the checkpoint's train state (its `world_size`)."""
        fabric, state = self.fabric, self.state
        model, optimizer = _unwrap_objects(state["model"]), _unwrap_objects(state["optimizer"])
        model_state, optimizer_state = get_state_dict(model, optimizer)
        shards = {"model": model_state, "optimizer": optimizer_state}
        reader, planner = SafeReader(checkpoint_dir), SafePlanner()
        dcp.load(shards, storage_reader=reader, planner=planner, process_group=self.group, no_dist=self.group is None)
        set_state_dict(model, optimizer, model_state_dict=shards["model"], optim_state_dict=shards["optimizer"])
        train_state = json.loads((checkpoint_dir / TRAIN_STATE).read_text())
        state["iter_num"], state["step_count"] = train_state["iter_num"], train_state["step_count"]
        loaders = train_state.get("train_dataloader")
        if "train_dataloader" in state and loaders and loaders[0] is not None:
            _unwrap_objects(state["train_dataloader"]).load_state_dict(loaders[fabric.global_rank])
        return train_state

    def _gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (an all-gather over the checkpoint group)."""
        if self.group is None:
            return [obj]
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, obj, group=self.group)
        return gathered


def export_lit_model(checkpoint_dir: Path, output: Path, extra: dict | None = None) -> str:
    """One `lit_model.pth` ({"model": state dict, **extra}) from a sharded checkpoint, as `litgpt generate` and
    `litgpt convert_from_litgpt` read it; returns its sha256, hashed as it is written. The student's tensors are read
    from the shards in one pass (the optimizer state is never read): the only whole copy in memory is the one being
    written."""
    reader = SafeReader(checkpoint_dir)
    model = {
        key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in reader.read_metadata().state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    dcp.load({"model": model}, storage_reader=reader, planner=SafePlanner(), no_dist=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "wb") as f:
        hashing = HashingWriter(f)
        torch.save({"model": model, **(extra or {})}, hashing)
    return hashing.hexdigest()


def tensor_bytes(tree: Any) -> int:
    """Bytes of the tensors in a (nested) state dict at their whole size: a sharded DTensor counts every rank's share
    (its `numel` is the whole tensor's)."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(value) for value in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(value) for value in tree)
    return 0


def import_path(cls: type) -> str:
    """`cls`'s dotted path through the shortest module that exports it: `litgpt_vocagnolm.data.VocAgnoData` (as a
    recipe's YAML names it), `litgpt.data.Alpaca`. jsonargparse names classes so in its own dumps, with a private
    function (`jsonargparse._util.get_import_path`) that this package does not import."""
    parts = cls.__module__.split(".")
    for n in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:n]))
        if getattr(module, cls.__qualname__, None) is cls:
            return f"{module.__name__}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def hyperparameters(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments of `setup` in the layout `--config` reads back (data modules as class_path/init_args)."""

    def plain(value: Any) -> Any:
        if isinstance(value, DataModule):
            init_args = {f.name: plain(getattr(value, f.name)) for f in fields(value) if f.init}
            return {"class_path": import_path(type(value)), "init_args": init_args}
        if is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in fields(value) if f.init}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return {name: plain(value) for name, value in arguments.items()}
