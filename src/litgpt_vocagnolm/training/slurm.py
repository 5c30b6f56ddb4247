"""A Slurm job's end: SIGUSR1 (what Slurm sends before a job's time limit) stops the run after the current optimizer
step on every rank, with a checkpoint of that step; under Slurm the job is requeued, and `--resume auto` continues it.
"""

import contextlib
import os
import signal
import subprocess
import threading
from typing import Iterator, NoReturn

import lightning as L


@contextlib.contextmanager
def stop_signal() -> Iterator[threading.Event]:
    """An event set when this process gets SIGUSR1, which `#SBATCH --signal=SIGUSR1@120` sends every process of the
    job's steps before its time limit. Loader workers forked meanwhile (fork: the default start method on Linux up to
    Python 3.13) inherit the handler: the signal sets their own copy of the event instead of killing them (SIGUSR1's
    default).

    On leaving, a handler the caller had is put back; SIGUSR1's default (ending the process) is not: a warning that
    arrives once the run is over, while the process tears down its process group and exits, would otherwise kill a
    finished job, which Slurm then records as failed. It is ignored instead."""
    requested = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: requested.set())
    try:
        yield requested
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN if previous in (signal.SIG_DFL, None) else previous)


def requeue_and_exit(fabric: L.Fabric) -> NoReturn:
    """After a stop on SIGUSR1: under Slurm rank 0 requeues the job (`scontrol requeue`, as Lightning's SLURM
    connector does), whose `--resume auto` then continues; every rank exits with EX_TEMPFAIL (75), "run again", so
    that nothing chained after the run takes it for finished."""
    for logger in fabric.loggers:
        logger.finalize("finished")  # flush what this run logged
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job_id = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID")
    if job_id is None:
        fabric.print("Not a Slurm job: run the same command with --resume auto to continue.")
    elif fabric.global_rank == 0:
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
    raise SystemExit(os.EX_TEMPFAIL)
