"""The device `plan --measure` runs on, as its report names it: a GPU by its name and memory, or the CPU, where one of
the run's devices is one process of the recipe (its hours CPU-hours, not GPU-hours)."""

import os

import torch

GB = 1e9


def device_name(device: torch.device) -> str:
    """The device, by name, with its memory: "NVIDIA H100 80GB HBM3 (cuda:0, 85.0 GB)", "cpu (2 threads, 134.9 GB)"."""
    if device.type == "cuda":
        name, memory = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory
        return f"{name} ({device}, {memory / GB:.1f} GB)"
    threads, memory = torch.get_num_threads(), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"cpu ({threads} thread{'s' * (threads > 1)}, {memory / GB:.1f} GB)"


def gpus(count: int) -> str:
    """A count of GPUs in words: "1 GPU", "32 GPUs"."""
    return f"{count} GPU{'s' * (count != 1)}"


def devices(count: int, device: torch.device) -> str:
    """`count` of the run's devices, measured on `device`: GPUs, or on a CPU the processes the recipe runs there."""
    return gpus(count) if device.type == "cuda" else f"{count} CPU process{'es' * (count != 1)}"


def device_hours(device: torch.device) -> str:
    """What an hour of one of the run's devices is called, measured on `device`."""
    return "GPU-hours" if device.type == "cuda" else "CPU-hours"
