"""How a run ends on a signal: at the end of an optimizer step (the next log or checkpoint step, which reads the ranks'
stop vote), the same on every rank, with a checkpoint of that step.

- SIGUSR1, what `#SBATCH --signal=SIGUSR1@120` sends every process of the job before its time limit: under Slurm the
  job is requeued and exits 75; `--resume auto` continues it.
- SIGINT (Ctrl-C) and SIGTERM (`scancel`, Slurm's preemption, `kill`): the run exits with 128 + the signal's number,
  not requeued, since a user (or the scheduler) ended it. A second one while the run stops ends the process at once,
  saving nothing.
"""

import contextlib
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator, NoReturn

import lightning as L
import torch
from torch.utils.data import DataLoader

from litgpt_vocagnolm.training.checkpoints import saved_checkpoints

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGINT, signal.SIGTERM)


class StopRequest(threading.Event):
    """Set when this process was asked to stop after the current optimizer step (`step.train_step` puts it in the
    step's all-reduce, so every rank stops after the same step)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancel: signal.Signals | None = None
        """The first SIGINT or SIGTERM: the run exits without a requeue. None: SIGUSR1 alone asked."""
        self.exiting = False
        """Set once the run has saved and agreed how to exit: signals are ignored from then on."""


@contextlib.contextmanager
def stop_signal(out_dir: Path, announce: bool = True) -> Iterator[StopRequest]:
    """A `StopRequest` that SIGUSR1, SIGINT and SIGTERM set in this process; with `announce` (rank 0) the first SIGINT
    or SIGTERM prints one line saying what happens next. A second SIGINT or SIGTERM (before the run exits) ends the
    process at once, `announce` printing the newest checkpoint in `out_dir` that `--resume auto` would take.

    Loader workers forked meanwhile (fork: the default start method on Linux up to Python 3.13) inherit the handler,
    which does nothing there: the main process stops the run and the workers serve the step under way (SIGUSR1's
    default would kill them, SIGINT's would raise KeyboardInterrupt in them; either fails the loader). Torch gives its
    workers a SIGTERM handler of its own: `keep_workers` overrides it.

    On leaving, the handlers the caller had are put back; SIGUSR1's default (ending the process) is not: a warning that
    arrives once the run is over, while the process tears down its process group and exits, would otherwise kill a
    finished job, which Slurm then records as failed. It is ignored instead."""
    stop, main_pid = StopRequest(), os.getpid()

    def handler(signum: int, frame) -> None:
        if os.getpid() != main_pid or stop.exiting:
            return
        if signum != signal.SIGUSR1:
            if stop.cancel is not None:
                stop_at_once(signal.Signals(signum), out_dir, announce)
            stop.cancel = signal.Signals(signum)
            if announce:
                name = stop.cancel.name
                say(
                    f"{name}: the run stops after its next log or checkpoint step, saving it; a second {name} stops it"
                    " at once, saving nothing."
                )
        stop.set()

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for signum, before in previous.items():
            if signum == signal.SIGUSR1 and before in (signal.SIG_DFL, None):
                before = signal.SIG_IGN
            signal.signal(signum, signal.SIG_DFL if before is None else before)


def say(line: str) -> None:
    """Prints `line` from a signal handler: straight to the file descriptor, after what print() holds (a handler that
    runs while print() writes must not write through its buffer)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(1, f"{line}\n".encode())


def stop_at_once(signum: signal.Signals, out_dir: Path, announce: bool) -> NoReturn:
    """Ends the process now, with 128 + `signum`: no step finished, nothing saved or flushed but the console."""
    if announce:
        saved = saved_checkpoints(out_dir)
        if saved:
            step, newest = saved[0]
            where = f"--resume auto would continue from {str(newest)!r} (step {step})"
        else:
            where = "no checkpoint yet: --resume auto would start afresh"
        say(f"Stopped at once on a second {signum.name}, saving nothing: {where}.")
    os._exit(128 + signum)


def exit_after_stop(fabric: L.Fabric, stop: StopRequest, checkpoint: Path, step: int) -> NoReturn:
    """After the stop's checkpoint of `step`, on every rank: the ranks agree on why they stopped (one all-reduce: a
    SIGINT or SIGTERM on any rank wins over SIGUSR1), say where the run continues, and exit.

    After SIGUSR1, under Slurm, rank 0 requeues the job (`scontrol requeue`, as Lightning's SLURM connector does),
    whose `--resume auto` then continues; every rank exits with EX_TEMPFAIL (75), "run again", so that nothing chained
    after the run takes it for finished. After SIGINT or SIGTERM every rank exits with 128 + its number, as a process
    that the signal ended, and nothing is requeued: a user's Ctrl-C or scancel must not come back."""
    cancel = fabric.all_reduce(torch.tensor(stop.cancel or 0, device=fabric.device), reduce_op="max")
    stop.exiting = True  # from here the run exits by itself: a signal changes nothing (Slurm's requeue sends SIGTERM)
    signum = signal.Signals(int(cancel.item()) or signal.SIGUSR1)
    fabric.print(
        f"Stopped after step {step} on {signum.name}: saved {str(checkpoint)!r}; the same command with --resume auto"
        " continues from there."
    )
    for logger in fabric.loggers:
        logger.finalize("finished")  # flush what this run logged
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job_id = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID")
    if signum == signal.SIGUSR1 and job_id is not None and fabric.global_rank == 0:
        try:
            result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
            failure = f"exit status {result.returncode}: {result.stderr.strip()}" if result.returncode else None
        except (OSError, subprocess.TimeoutExpired) as error:
            failure = str(error)
        if failure is None:
            fabric.print(f"Requeued Slurm job {job_id}: it continues from the checkpoint (--resume auto).")
        else:
            fabric.print(
                f"`scontrol requeue {job_id}` failed ({failure}): submit the job again; --resume auto continues."
            )
    # Rank 0 requeues before any rank exits: under srun a task that ends first can end the job step.
    fabric.barrier()
    raise SystemExit(os.EX_TEMPFAIL if signum == signal.SIGUSR1 else 128 + signum)


def keep_workers(loader: DataLoader) -> DataLoader:
    """`loader` (its workers not started yet), its workers set to outlive a SIGTERM that their parent did not send
    (`ignore_others_sigterm`), so that they serve the step the main process ends on `scancel` or preemption, which
    signal every process of the job. Returns it."""
    loader.worker_init_fn = functools.partial(ignore_others_sigterm, loader.worker_init_fn)
    return loader


def ignore_others_sigterm(then: Callable[[int], None] | None, worker_id: int) -> None:
    """A loader worker's start: SIGTERM is blocked and taken by a thread that ends the worker when its parent sends
    it, as torch's own handler does (the loader shutting down a worker), and ignores it from anyone else, where torch's
    handler would kill the worker, and the main process with it (a worker's death fails the loader). Then `then`."""
    parent = multiprocessing.parent_process().pid
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started from here inherit it

    def wait() -> None:
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
            pass
        os._exit(0)

    threading.Thread(target=wait, name="sigterm", daemon=True).start()
    if then is not None:
        then(worker_id)
