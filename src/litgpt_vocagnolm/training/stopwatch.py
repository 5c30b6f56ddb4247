"""Time spent in one part of a step (the teacher's forward), measured without stopping the GPU."""

import time

import torch


class Stopwatch:
    """Seconds spent inside `with stopwatch:` blocks, summed, without stopping the GPU: on CUDA each block records two
    events, read (a host sync) only by `seconds()`, which the loop calls on log steps."""

    def __init__(self, device: torch.device) -> None:
        self.cuda, self.spans, self.total = device.type == "cuda", [], 0.0

    def __enter__(self) -> None:
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.perf_counter()

    def __exit__(self, *exc_info) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans.append((self.start, end))
        else:
            self.total += time.perf_counter() - self.start

    def seconds(self) -> float:
        for start, end in self.spans:
            end.synchronize()
            self.total += start.elapsed_time(end) / 1000
        self.spans = []
        return self.total
