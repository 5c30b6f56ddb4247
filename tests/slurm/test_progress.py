"""`progress.wait_for`, the Slurm tests' wait, on a simulated clock (no Slurm needed: `make test` runs these)."""

import pytest
from progress import wait_for


class Job:
    """A simulated job: a clock that `sleep` advances, and the step it has reached, one step every `step_s`."""

    def __init__(self, step_s: float, steps: int) -> None:
        self.now, self.step_s, self.steps = 0.0, step_s, steps

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def step(self) -> int:
        return min(int(self.now // self.step_s), self.steps)

    def done(self) -> str | None:
        return "COMPLETED" if self.step() == self.steps else None

    def wait(self, **kwargs) -> str:
        return wait_for(self.done, self.step, "the job", clock=self.clock, sleep=self.sleep, **kwargs)


def test_a_slow_job_that_progresses_is_waited_for_beyond_any_stall_limit():
    """160 steps of 20 s each: 3,200 s in all, far beyond the 60 s without progress that fails a wait."""
    job = Job(step_s=20, steps=160)
    assert job.wait(stall_s=60, cap_s=4000) == "COMPLETED"
    assert 3200 <= job.now <= 3202


def test_a_job_that_stops_progressing_fails_once_the_stall_limit_has_passed():
    job = Job(step_s=20, steps=160)
    job.step = lambda: min(int(job.now // 20), 5)  # stuck at step 5, from 100 s on
    with pytest.raises(TimeoutError, match=r"^the job: no progress for 6\d s \(the last: 5\)$"):
        job.wait(stall_s=60, cap_s=4000)
    assert 160 <= job.now <= 162


def test_a_job_progressing_forever_ends_at_the_cap():
    job = Job(step_s=1, steps=10**9)
    with pytest.raises(TimeoutError, match=r"^the job: not done after 100\d s, still progressing"):
        job.wait(stall_s=60, cap_s=1000, poll_s=5)
    assert job.now <= 1010
