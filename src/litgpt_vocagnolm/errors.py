"""User errors: what was asked can't be done as asked. The message says what is wrong and what to do instead.

The command lines (`vocagnolm ...`, `litgpt pretrain --recipe vocagnolm`) print such an error as one line and exit
with status 1, without a traceback (`--debug` or VOCAGNOLM_DEBUG=1 shows it); every other exception is a bug and keeps
its traceback. Each kind is also the built-in exception a caller of the Python API would catch.
"""

import errno
import os
import re
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# A full disk in a library's words: LitData's workers report the error as text.
FULL_WORDS = r"No space left on device|Disk quota exceeded"
# A short write, as numpy's `tofile` and torch's zip writer report one: a full disk, where the disk is (nearly) full.
SHORT_WRITE = r"\d+ requested and \d+ written|unexpected pos \d+ vs \d+"
NEARLY_FULL_BYTES = 1 << 20


class UserError(Exception):
    """The one type the command lines catch."""


class InvalidArgument(UserError, ValueError):
    """A value out of range, or values that contradict each other."""


class PathMissing(UserError, FileNotFoundError):
    """A file or folder the command reads is not there."""


class PathTaken(UserError, FileExistsError):
    """A folder the command writes holds something it must not replace."""


class DiskFull(UserError, OSError):
    """A file system without room for what the command would write."""


class NotFinite(UserError, RuntimeError):
    """A loss or gradient that is NaN or infinite: a teacher that can't guide, or a run whose weights diverged."""


class Unguided(UserError, RuntimeError):
    """A training step the teacher guides (almost) nothing of: too few of its tokens mapped, or none trained."""


class FolderInUse(UserError, BlockingIOError):
    """A folder another command is writing into (`files.hold_folder`), or one whose file system can't lock it."""


def at_least(flag: str, value: float, minimum: float) -> None:
    """Refuses `value` below `minimum`, naming the option: `at_least("--num_workers", 0, 1)`."""
    if value < minimum:
        raise InvalidArgument(f"{flag} must be at least {minimum}, got {value}.")


def check_writable(folder: Path, flag: str) -> None:
    """Refuses a folder this process can't create or write into, before any work: its nearest existing ancestor must
    be a writable directory (a read-only disk or another user's folder fails here, not after hours of work)."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise PathTaken(f"{flag} {folder}: {existing} is a file, not a folder. Give a folder path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == folder else f"can't be created: {existing} is not writable"
        raise InvalidArgument(f"{flag} {folder} {what} by this user. Give a folder you can write to.")


def check_devices(devices: int | str, flag: str = "--devices") -> None:
    """Refuses a device count Lightning would refuse later, in its own words: "auto" or a positive number."""
    if devices != "auto" and (not isinstance(devices, int) or devices < 1):
        raise InvalidArgument(f"{flag} must be 'auto' or a positive number of devices per node, got {devices!r}.")


def check_output_file(path: Path, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """Refuses, before any work, an output file that can't be written: a folder where the file is due, a suffix not
    among `suffixes` (when given), a folder that can't be created or written into; creates its folder. Returns it."""
    path = Path(path)
    if path.is_dir():
        example = path / ("out" + "".join(suffixes[:1]))
        raise PathTaken(f"{flag} {path} is a folder: give a file path, such as {example}.")
    if suffixes and path.suffix.lower() not in suffixes:
        raise InvalidArgument(
            f"{flag} {path}: the file must end in {', '.join(suffixes)}, not {path.suffix or 'nothing'}."
        )
    check_writable(path.parent, flag)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def given_by(flag: str, fix: str) -> Iterator[None]:
    """What a library (LitGPT, Lightning, torch, pyarrow...) raises for a value the user gave, as one `InvalidArgument`
    naming the option and the fix: `with given_by("--data.path", "Run `vocagnolm prepare` again."): ...`."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, TypeError, OSError, RuntimeError, KeyError, AttributeError, ImportError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InvalidArgument(f"{flag}: {reason}. {fix}") from error


def no_space_left(error: BaseException, disk_is_full: bool = False) -> bool:
    """Whether `error` is a full file system (ENOSPC, or a user's quota spent: EDQUOT): itself, its cause or context, a
    per-rank failure that torch.distributed.checkpoint's `CheckpointException` wraps (`failures`: rank -> exception, or
    (exception, traceback)), or a library's error that says so only in words (`FULL_WORDS`; a short write,
    `SHORT_WRITE`, where `disk_is_full`)."""
    seen, todo = set(), [error]
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or re.search(FULL_WORDS, str(error)):
            return True
        if disk_is_full and re.search(SHORT_WRITE, str(error)):
            return True
        failures = getattr(error, "failures", None)
        wrapped = failures.values() if isinstance(failures, dict) else ()
        todo += [f[0] if isinstance(f, tuple) else f for f in wrapped] + [error.__cause__, error.__context__]
    return False


def size_text(num_bytes: float) -> str:
    """2.40 GB, 61.2 MB."""
    return f"{num_bytes / 1e9:.2f} GB" if num_bytes >= 1e8 else f"{num_bytes / 1e6:.1f} MB"


@contextmanager
def quiet_full_disk_threads() -> Iterator[None]:
    """While inside, a thread that dies of a full disk (a writer thread of torch.distributed.checkpoint) prints no
    traceback: the thread that waits for it says it in one line (`disk_full`)."""
    thread_hook = threading.excepthook

    def quiet(args: threading.ExceptHookArgs) -> None:
        if not no_space_left(args.exc_value, disk_is_full=True):
            thread_hook(args)

    threading.excepthook = quiet
    try:
        yield
    finally:
        threading.excepthook = thread_hook


@contextmanager
def disk_full(folder: Path, needed: int | None, then: str) -> Iterator[None]:
    """A full file system (`no_space_left`) while writing into `folder` as one `DiskFull` naming the folder, the bytes
    it needed (where known) and what to do once there is room (`then`: "run again with --resume auto: it continues
    from step-00000100"); a writer thread's full disk prints nothing (`quiet_full_disk_threads`)."""
    try:
        with quiet_full_disk_threads():
            yield
    except UserError:
        raise
    except BaseException as error:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        free = shutil.disk_usage(folder).free if Path(folder).exists() else 0
        if not no_space_left(error, disk_is_full=free < NEARLY_FULL_BYTES):
            raise
        need = f" needs {size_text(needed)} and" if needed else ""
        raise DiskFull(
            f"No space left on device: writing into {folder}{need} its file system has {size_text(free)} free. Make"
            f" room there (or choose another folder), then {then}."
        ) from error
