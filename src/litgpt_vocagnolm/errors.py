"""User errors: what was asked can't be done as asked. The message says what is wrong and what to do instead.

The command lines (`vocagnolm ...`, `litgpt pretrain --recipe vocagnolm`) print such an error as one line and exit
with status 1, without a traceback (`--debug` or VOCAGNOLM_DEBUG=1 shows it); every other exception is a bug and keeps
its traceback. Each kind is also the built-in exception a caller of the Python API would catch.
"""

import os
from pathlib import Path


class UserError(Exception):
    """The one type the command lines catch."""


class InvalidArgument(UserError, ValueError):
    """A value out of range, or values that contradict each other."""


class PathMissing(UserError, FileNotFoundError):
    """A file or folder the command reads is not there."""


class PathTaken(UserError, FileExistsError):
    """A folder the command writes holds something it must not replace."""


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
