"""Waiting on a job by its progress, not by a fixed time.

On a loaded machine a correct job is slow, not stuck: under a load of 10-18 on 2 cores, a job warned and requeued eight
times went from step 27 to step 84 of 160 in the 600 s that a fixed wait gave it. So a wait ends in failure only when
nothing has changed for `stall_s` (no new checkpoint, no new cache file, no new line in the job's log, no change of its
state), or after `cap_s` in all, and says what it waited for and what it saw last.
"""

import time
from typing import Callable, TypeVar

T = TypeVar("T")

STALL_S = 600.0  # a job that logs every step, or writes a file every few steps, is never silent this long
CAP_S = 45 * 60.0  # the whole wait, however the job progresses: `make test-slurm` must end


def wait_for(
    done: Callable[[], T | None],
    progress: Callable[[], object],
    what: str,
    stall_s: float = STALL_S,
    cap_s: float = CAP_S,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """What `done()` returns once it returns something other than None, polled every `poll_s`. Each change of
    `progress()` (compared with `==`: a tuple or dict of what the job has written) restarts the stall clock. Raises
    TimeoutError after `stall_s` without a change, or `cap_s` in all, naming `what` and the last progress seen."""
    start = changed = clock()
    seen = progress()
    while (result := done()) is None:
        now = clock()
        if now - changed > stall_s:
            raise TimeoutError(f"{what}: no progress for {now - changed:.0f} s (the last: {seen})")
        if now - start > cap_s:
            raise TimeoutError(f"{what}: not done after {now - start:.0f} s, still progressing (the last: {seen})")
        sleep(poll_s)
        if (now_seen := progress()) != seen:
            seen, changed = now_seen, clock()
    return result
