"""Hashes and whole-or-nothing writes of the files this package writes and later trusts; the lock that keeps one
command at a time in a folder; the folders of data files (no code) that come with the package."""

import errno
import fcntl
import hashlib
import json
import os
import socket
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from litgpt_vocagnolm.errors import FolderInUse, PathTaken, failed_writes

LOCK = ".vocagnolm.lock"  # in a folder a command writes into: who holds it, under an OS lock
NO_LOCK_ENV = (
    "VOCAGNOLM_NO_LOCK"  # =1: hold no folder (a file system without locks, where one writer is the user's care)
)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")  # torchrun's, Fabric's launcher's, srun's
HELD: set[Path] = set()  # the folders this process holds
WHOLE_HASH_BYTES = 1 << 20  # input files up to this size are hashed whole
HASH_SAMPLES = 16  # larger ones: this many evenly spaced samples...
SAMPLE_BYTES = 1 << 16  # ...of this many bytes each, so at most 1 MiB is read per file
PACKAGE = Path(__file__).resolve().parent


def shipped(in_wheel: str, in_clone: str) -> Path:
    """A folder of data files that comes with the package: `in_wheel` inside the package where a wheel installed it
    (pyproject.toml's force-include puts it there), else `in_clone` at the root of the clone the package runs from
    (an editable install, or src/ on the path), the one copy in the repository."""
    packaged = PACKAGE / in_wheel
    return packaged if packaged.is_dir() else PACKAGE.parents[1] / in_clone


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


def first_process() -> bool:
    """Whether this process is its run's first (rank 0), the one that holds the run's folder: the later ranks that
    torchrun, Fabric's launcher or srun start (by their environment) hold none."""
    return all(os.environ.get(name, "0") in ("", "0") for name in RANK_VARIABLES)


def holder_record(command: str) -> dict[str, Any]:
    """Who holds a folder: what a refusal names, and what a requeued Slurm job (the same SLURM_JOB_ID, a higher
    SLURM_RESTART_COUNT) recognises as its own earlier attempt."""
    return {
        "command": command,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def read_holder(lock: Path) -> dict[str, Any]:
    try:
        return json.loads(lock.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # gone, or written this very moment
        return {}


def holder_text(holder: dict[str, Any]) -> str:
    """`vocagnolm prepare` (pid 4242 on node-7, Slurm job 1234, since 2025-01-01 12:00:00 UTC)"""
    job = f", Slurm job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    where = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}{job}, since {holder.get('since', '?')}"
    return f"`{holder.get('command', 'another command')}` ({where})"


def earlier_attempt(holder: dict[str, Any]) -> bool:
    """Whether `holder` is an earlier attempt of this Slurm job, requeued since: its lock may outlive it on a shared
    file system (a node lost holds an NFS lock until its lease ends), and is taken back."""
    job = os.environ.get("SLURM_JOB_ID")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    return bool(job) and holder.get("slurm_job_id") == job and holder.get("slurm_restart_count", 0) < restarts


def open_lock(lock: Path) -> int:
    """`lock` opened (created) for reading and writing, never through a link: a lock that is not a regular file (a
    link, whose target may be anything anywhere, a folder) is refused in one line, and nothing is written through it."""
    refusal = PathTaken(
        f"{lock} is not a regular file (a link, a folder...): it is where a command records that it writes into"
        f" {lock.parent}, and nothing is written through it. Remove it (rm -r {lock}), then run again."
    )
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # a link, a folder, a socket
            raise refusal from error
        raise
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)  # a named pipe, a device
    raise refusal


def lock_file(lock: Path) -> int | None:
    """An open descriptor of `lock` that this process holds an exclusive POSIX lock on, or None if another process
    holds it. POSIX (fcntl) locks are what NFS (lockd for v3, leases for v4) and Lustre (mounted with `flock`) keep
    across nodes; the kernel drops them when their process dies, even by kill -9. A `lock` that is not a regular file
    (a link, which would be followed out of the folder, a folder) is refused, naming it."""
    while True:
        fd = open_lock(lock)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EACCES, errno.EAGAIN):
                return None
            raise FolderInUse(
                f"{lock.parent}: its file system can't lock files ({error.strerror}), so two commands could write"
                " into it at once. Mount it with locks (Lustre: -o flock; NFSv3: run rpc.statd and lockd, or use"
                f" NFSv4), or set {NO_LOCK_ENV}=1 to go on without the lock, making sure yourself that one command at"
                " a time writes there."
            ) from error
        try:
            if os.lstat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder released it (and deleted the file) while this process opened it: again


@contextmanager
def hold_folder(folder: Path, command: str) -> Iterator[None]:
    """Holds `folder` (created) for `command` while inside: a second command into it is refused in one line that
    names who holds it (`holder_record`). A holder that died (kill -9, a node lost) holds nothing: the OS drops its
    lock, and a requeued Slurm job takes back its earlier attempt's (`earlier_attempt`). Only a run's first process
    holds it (`first_process`); with VOCAGNOLM_NO_LOCK=1, none."""
    if os.environ.get(NO_LOCK_ENV, "") not in ("", "0") or not first_process():
        yield
        return
    folder = Path(folder).absolute()
    if folder in HELD:  # a POSIX lock is the process's: taken twice, the inner release would drop the outer
        raise FolderInUse(f"{folder} is in use by this process already: give each command its own folder.")
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK
    fd = lock_file(lock)
    if fd is None:
        holder = read_holder(lock)
        if not earlier_attempt(holder):
            raise FolderInUse(
                f"{folder} is in use by {holder_text(holder)}: wait for it to end, or choose another folder. (If it"
                f" died with a lost node, its lock lasts until the file server notices; delete {lock} to go on now.)"
            )
        print(f"Taking {folder} back from this job's earlier attempt (restart {holder['slurm_restart_count']}).")
        lock.unlink(missing_ok=True)  # its lock stays with the old file; new commands find the new one
        fd = lock_file(lock)
        if fd is None:
            raise FolderInUse(f"{folder} was taken by another command while this job took it back: run again.")
    HELD.add(folder)
    try:
        with failed_writes(folder, None, "run the command again", errnos=None):
            os.ftruncate(fd, 0)  # a record left by a holder killed with kill -9 may be longer than this one
            os.write(fd, json.dumps(holder_record(command)).encode())
            os.fsync(fd)
        yield
    finally:
        HELD.discard(folder)
        lock.unlink(missing_ok=True)  # while still locked: a command waiting on this file sees it is gone
        os.close(fd)
