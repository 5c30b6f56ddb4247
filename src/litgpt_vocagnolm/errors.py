"""User errors: what was asked can't be done as asked. The message says what is wrong and what to do instead.

The command lines (`vocagnolm ...`, `litgpt pretrain --recipe vocagnolm`) print such an error as one line and exit
with status 1, without a traceback (`--debug` or VOCAGNOLM_DEBUG=1 shows it); every other exception is a bug and keeps
its traceback. Each kind is also the built-in exception a caller of the Python API would catch.
"""

import errno
import os
import re
import resource
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator

# What only a write meets: a full disk or quota, a file past its size limit (`ulimit -f`), a read-only file system.
# Where a command also reads (its inputs), only these are its writes' failures; another (EIO, EACCES) may be a read's.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
# Each in a library's words ("No space left on device"): LitData's workers report their errors as text.
ERRNO_WORDS = {number: os.strerror(number) for number in WRITE_ERRNOS}
# A short write, as numpy's `tofile` and torch's zip writer report one: a full disk where the disk is (nearly) full,
# else a file past this process's size limit where it has one.
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


class WriteFailed(UserError, OSError):
    """A write the file system refused: a file past its size limit (EFBIG), a read-only or failing disk (EROFS, EIO)."""


class DiskFull(WriteFailed):
    """A file system without room for what the command would write: full, or the user's quota spent (EDQUOT)."""


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
    too_long = name_too_long(folder)
    if too_long:
        raise InvalidArgument(f"{flag} {folder}: {too_long}. Give a shorter one.")
    existing = nearest_existing(folder)
    if not existing.is_dir():
        raise PathTaken(f"{flag} {folder}: {existing} is a file, not a folder. Give a folder path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == folder else f"can't be created: {existing} is not writable"
        raise InvalidArgument(f"{flag} {folder} {what} by this user. Give a folder you can write to.")


def nearest_existing(path: Path) -> Path:
    """`path` (absolute), or the nearest folder above it, that exists."""
    return next(p for p in (path, *path.parents) if os.path.exists(p))  # os.path's: False for a name too long


def name_too_long(path: Path) -> str | None:
    """Why the file system under `path` can't name it (ENAMETOOLONG: a name of more bytes than it takes, 255 on most,
    or a whole path of more than its PATH_MAX), or None where it can."""
    path = Path(path).absolute()
    existing = nearest_existing(path)
    most = os.pathconf(existing, "PC_NAME_MAX")
    for name in path.relative_to(existing).parts:
        if len(os.fsencode(name)) > most:
            shown = name if len(name) <= 40 else f"{name[:40]}..."
            return f"the name {shown} is {len(os.fsencode(name))} bytes long, and its file system takes at most {most}"
    most = os.pathconf(existing, "PC_PATH_MAX")
    if len(os.fsencode(path)) >= most:
        return f"the path is {len(os.fsencode(path))} bytes long, and its file system takes fewer than {most}"
    return None


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


def failed_write(
    error: BaseException, errnos: Collection[int] | None, disk_is_full: bool = False
) -> tuple[int, str | None] | None:
    """The errno of a failed write that `error` holds, if one of `errnos` (None: any), and the file it names (None
    where it names none): in itself, its cause or context, a per-rank failure that torch.distributed.checkpoint's
    `CheckpointException` wraps (`failures`: rank -> exception, or (exception, traceback)), or only in words, as
    LitData's workers report it (`[Errno 28]`, a write errno's text: `ERRNO_WORDS`; a short write, `SHORT_WRITE`: a
    full disk where `disk_is_full`, else a file past this process's size limit where it has one). None where it holds
    none."""
    seen, todo, words = set(), [error], []
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(getattr(error, "errno", None), int):
            # A copy's error names its source file, then its target (`filename2`): the target is the write's.
            found = (error.errno, getattr(error, "filename2", None) or getattr(error, "filename", None))
            return found if errnos is None or found[0] in errnos else None
        words.append(str(error))
        failures = getattr(error, "failures", None)
        wrapped = failures.values() if isinstance(failures, dict) else ()
        todo += [f[0] if isinstance(f, tuple) else f for f in wrapped] + [error.__cause__, error.__context__]
    text = "\n".join(words)
    numbered = re.search(r"\[Errno (\d+)\]", text)
    named = [number for number, name in ERRNO_WORDS.items() if name in text]
    number = int(numbered[1]) if numbered else named[0] if named else None
    if number is None and re.search(SHORT_WRITE, text):
        number = errno.ENOSPC if disk_is_full or file_size_limit() is None else errno.EFBIG
    return (number, None) if number is not None and (errnos is None or number in errnos) else None


def file_size_limit() -> int | None:
    """The most bytes this process may write into one file (`ulimit -f`: RLIMIT_FSIZE), None where unlimited. Python
    ignores SIGXFSZ, so a write past it fails with EFBIG instead of killing the process."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def size_text(num_bytes: float) -> str:
    """2.40 GB, 61.2 MB."""
    return f"{num_bytes / 1e9:.2f} GB" if num_bytes >= 1e8 else f"{num_bytes / 1e6:.1f} MB"


def free_bytes(folder: Path) -> int:
    """The bytes free on `folder`'s file system; 0 where it can't say (gone, or failing)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


@contextmanager
def thread_failures(errnos: Collection[int] | None) -> Iterator[list[BaseException]]:
    """While inside, a thread that dies of a failed write (`failed_write`, one of `errnos`; None: any) prints no
    traceback, and its error joins the list this yields, for the thread that waits on it to raise: torch.distributed.
    checkpoint's writer threads die so, and its `FileSystemWriter` (torch 2.13) joins them without looking, then
    writes an index without the files they failed to write."""
    thread_hook, failures = threading.excepthook, []

    def keep(args: threading.ExceptHookArgs) -> None:
        if failed_write(args.exc_value, errnos, disk_is_full=True) is None:
            thread_hook(args)
        else:
            failures.append(args.exc_value)

    threading.excepthook = keep
    try:
        yield failures
    finally:
        threading.excepthook = thread_hook


@contextmanager
def failed_writes(
    folder: Path, needed: int | None, then: str, errnos: Collection[int] | None = WRITE_ERRNOS
) -> Iterator[None]:
    """A write into `folder` that fails, here or in a thread (`thread_failures`), as one `WriteFailed` (`DiskFull` for
    a full disk or quota) naming its cause, `needed` bytes where known, and what to do once it is fixed (`then`: "run
    again with --resume auto: it continues from step-00000100"). `errnos`: the errors that are the writes' (by default
    those only a write meets, `WRITE_ERRNOS`: where the work also reads, another may be a read's); None: every one."""
    try:
        with thread_failures(errnos) as failures:
            yield
        if failures:
            raise failures[0]
    except UserError:
        raise
    except BaseException as error:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        free = free_bytes(folder)
        failure = failed_write(error, errnos, disk_is_full=free < NEARLY_FULL_BYTES)
        if failure is None:
            raise
        raise write_failure(*failure, folder, needed, free, then) from error


def write_failure(
    number: int, filename: str | None, folder: Path, needed: int | None, free: int, then: str
) -> WriteFailed:
    """The one line of a write into `folder` that failed with errno `number` (on `filename`, where known): the cause,
    what to do about it, `then`."""
    need = f" needs {size_text(needed)} and" if needed else ""
    if number == errno.ENOSPC:
        return DiskFull(
            f"No space left on device: writing into {folder}{need} its file system has {size_text(free)} free. Make"
            f" room there (or choose another folder), then {then}."
        )
    if number == errno.EDQUOT:
        return DiskFull(
            f"Disk quota exceeded: writing into {folder}{need} this user's quota there is spent. Make room within it"
            f" (or choose another folder), then {then}."
        )
    limit = file_size_limit()
    reasons = {  # why, and what to do
        errno.EFBIG: (
            (
                f"a file outgrew this process's limit of {size_text(limit)} per file (`ulimit -f`, set by the shell or"
                " job that started it)",
                "Lift the limit (`ulimit -f unlimited` before the command)",
            )
            if limit is not None
            else ("a file outgrew the largest its file system takes", "Choose a folder on another file system")
        ),
        errno.EROFS: (
            "its file system is read-only (mounted so, or remounted after a disk error)",
            "Have it made writable (or choose another folder)",
        ),
        errno.EIO: (
            "the disk or the network file system under it failed",
            "Check it (the node's `dmesg`, the cluster's status) or choose another folder",
        ),
        errno.EACCES: ("this user may not write there", "Give it the right to (or choose another folder)"),
    }
    reasons[errno.EPERM] = reasons[errno.EACCES]
    reason, fix = reasons.get(number, (None, "Fix that (or choose another folder)"))
    code = errno.errorcode.get(number, f"errno {number}")
    file = f" ({filename})" if filename else ""
    return WriteFailed(
        f"{os.strerror(number)} ({code}): writing into {folder}{file}{f', {reason}' if reason else ''}. {fix}, then"
        f" {then}."
    )
