"""LitData's worker processes under `vocagnolm prepare`: how they start, and how they stop on Ctrl-C, when one of
them dies, and when `prepare` itself dies. Without this, a worker killed by the out-of-memory killer leaves LitData
(before 0.2.49) waiting forever, and Ctrl-C exits 0 with the data unfinished."""

import ctypes
import functools
import multiprocessing
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from litdata.processing.data_processor import DataProcessor

# spawn re-imports torch in every worker and in each of its uploader processes: about 6 s per split here, against
# 0.2 s for fork. Fork is safe: the parent has only loaded tokenizers and encoded one sample on this thread, never run
# their thread pool, and the workers tokenize on one thread each (TOKENIZERS_PARALLELISM=false, `optimize_environment`).
START_METHOD = "fork" if sys.platform == "linux" else None


STOP_SECONDS = 10  # how long an interrupted process waits for each child to stop before killing it
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def stop_children() -> None:
    """Passes SIGINT to this process's children, waits up to STOP_SECONDS for each, then kills it."""
    children = multiprocessing.active_children()
    for child in children:
        os.kill(child.pid, signal.SIGINT)
    for child in children:
        child.join(STOP_SECONDS)
        if child.is_alive():
            child.kill()


def stop_on_interrupt(processor: DataProcessor, main_pid: int, signum: int, frame: Any) -> None:
    """Replaces LitData's SIGINT handler (`DataProcessor._signal_handler`), which asks the workers to stop after their
    current item and calls `os._exit(0)`: `prepare && pretrain` would then go on without the data.

    Forked workers and their uploaders inherit it: each process passes the signal to its children (a terminal's Ctrl-C
    reaches all of them anyway, `kill -INT` only this one), waits for them, and exits 130 (128 + SIGINT); the main
    process raises KeyboardInterrupt instead, so that `prepare` unwinds and `.partial` keeps the finished splits.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the stopping
    if os.getpid() == main_pid:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the workers stopped here are no deaths to report
    stop_children()
    if os.getpid() != main_pid:
        os._exit(128 + signum)
    raise KeyboardInterrupt


def watch_workers(processor: DataProcessor, create_workers: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Wraps `DataProcessor._create_process_workers`: once LitData's workers have started, the death of one stops the
    run (`stop_on_worker_death`, on SIGCHLD)."""
    create_workers(processor, *args, **kwargs)
    handler = functools.partial(stop_on_worker_death, processor.workers)
    signal.signal(signal.SIGCHLD, handler)
    handler(signal.SIGCHLD, None)  # a worker that died before the handler was in place


def stop_on_worker_death(workers: list[multiprocessing.Process], signum: int, frame: Any) -> None:
    """SIGCHLD handler of the main process while LitData's workers run.

    A worker that ends by a signal (the out-of-memory killer's SIGKILL, a crash in native code) reports nothing to
    LitData: before 0.2.49 its main loop then waits for the worker's items forever; later releases finish the split
    without them. This stops the other workers and raises instead. (A Python exception in a worker exits it with
    status 0 after LitData has queued the traceback, which LitData raises.)
    """
    dead = next((worker for worker in workers if worker.exitcode not in (None, 0)), None)
    if dead is None:
        return
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    stop_children()
    code = dead.exitcode
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    hint = " (out of memory? Give fewer --num_workers)" if code == -signal.SIGKILL else ""
    raise RuntimeError(
        f"LitData worker {workers.index(dead)} (pid {dead.pid}) {how}{hint}; the other workers were stopped. Run the"
        " same command again to finish: the finished splits are kept."
    )


_FORK = {"active": False, "parent": 0}  # set by `optimize_environment`; each forked process inherits a copy


def _before_fork() -> None:
    _FORK["parent"] = os.getpid()


def _die_with_parent() -> None:
    """In each process forked while `litdata.optimize` runs (its workers and their uploaders): the kernel kills it when
    its parent dies, so that a killed `prepare` leaves no workers behind."""
    if not _FORK["active"]:
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != _FORK["parent"]:  # the parent died before the prctl
        os._exit(1)


if sys.platform == "linux":
    os.register_at_fork(before=_before_fork, after_in_child=_die_with_parent)


@contextmanager
def optimize_environment(cache: Path) -> Iterator[None]:
    """What `litdata.optimize` needs around it.

    Its chunk cache is one machine-wide folder that it empties at start, so two runs at once would destroy each
    other's chunks: each split gets its own. Its workers are the parallelism, so each tokenizes on one thread. Its
    SIGINT handler exits 0: ours stops the workers and raises KeyboardInterrupt (`stop_on_interrupt`). A worker that
    dies stops the run (`stop_on_worker_death`), and the workers die with this process (`_die_with_parent`). And it
    leaves the process with its start method and signal handlers: restore them.
    """
    environment = {
        "DATA_OPTIMIZER_CACHE_FOLDER": str(cache / "chunks"),
        "DATA_OPTIMIZER_DATA_CACHE_FOLDER": str(cache / "data"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    saved = {key: os.environ.get(key) for key in environment}
    start_method = multiprocessing.get_start_method(allow_none=True)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGCHLD)}
    litdata_handler, create_workers = DataProcessor._signal_handler, DataProcessor._create_process_workers
    os.environ.update(environment)
    DataProcessor._signal_handler = functools.partialmethod(stop_on_interrupt, os.getpid())
    DataProcessor._create_process_workers = functools.partialmethod(watch_workers, create_workers)
    _FORK["active"] = True
    try:
        yield
    finally:
        _FORK["active"] = False
        DataProcessor._create_process_workers = create_workers
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        DataProcessor._signal_handler = litdata_handler
        multiprocessing.set_start_method(start_method, force=True)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
