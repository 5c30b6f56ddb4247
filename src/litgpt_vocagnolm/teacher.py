"""The frozen teacher: its settings (`TeacherArgs`) and its per-token loss; `gpt.load_model` loads it beside the
student.

The teacher's whole contribution to VocAgnoLM is one number per teacher token: its cross-entropy on that token. The
same function computes it online (inside the training step) and offline (`vocagnolm score-teacher`), so the two cannot
drift. The teacher is never put in the training `state`: it has no optimizer state and is reloaded, never saved.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from litgpt_vocagnolm.errors import InvalidArgument

PRECISIONS = ("bf16-true", "16-true", "32-true")  # a teacher only runs forward passes: no mixed precision


@dataclass
class TeacherArgs:
    """The frozen teacher that guides the student."""

    checkpoint_dir: Path | list[Path] | None = None
    """A LitGPT checkpoint directory (lit_model.pth, model_config.yaml and the tokenizer files): `litgpt download`
    then use the directory it prints. Not needed for `ce`, nor with `cache`. Several teachers: a list, one per
    prepared dataset (`--data.path`, then `--data.other_teachers`), all run on every batch."""
    precision: str | None = None
    """Teacher dtype: "bf16-true" (default on GPU), "16-true" or "32-true" (default on CPU). The teacher only runs
    forward passes under no_grad, so half precision halves its memory at no cost to the student."""
    cache: Path | list[Path] | None = None
    """A teacher loss cache written by `vocagnolm score-teacher` for the prepared data: then no teacher is loaded.
    Several teachers: a list, one cache per prepared dataset, in the order of the data."""

    def __post_init__(self) -> None:
        check_precision(self.precision, "--teacher.precision")

    @property
    def checkpoint_dirs(self) -> list[Path]:
        """`checkpoint_dir` as a list, one per teacher; empty without one."""
        return as_list(self.checkpoint_dir)

    @property
    def caches(self) -> list[Path]:
        """`cache` as a list, one per teacher; empty without one."""
        return as_list(self.cache)

    def dtype(self, device: torch.device) -> torch.dtype:
        precision = self.precision or ("bf16-true" if device.type == "cuda" else "32-true")
        return {"bf16-true": torch.bfloat16, "16-true": torch.float16, "32-true": torch.float32}[precision]


def check_precision(precision: str | None, flag: str) -> None:
    """A teacher precision, as option `flag` gave it: one of PRECISIONS, or None for the device's default."""
    if precision not in (None, *PRECISIONS):
        raise InvalidArgument(f"{flag} must be one of {', '.join(PRECISIONS)}, got {precision!r}.")


def as_list(value: Path | list[Path] | None) -> list[Path]:
    if value is None:
        return []
    return [Path(value)] if isinstance(value, (str, Path)) else [Path(v) for v in value]


def teacher_token_loss(teacher: nn.Module, teacher_ids: torch.Tensor, teacher_valid: torch.Tensor) -> torch.Tensor:
    """Per-token loss of the teacher on its own tokens; call under no_grad.

    The teacher (a `gpt.GPT`) runs its transformer once and its head and loss a tile of rows at a time, so the
    extra memory is that of one tile of logits, not (B, M, V): a 152k-vocabulary teacher at micro-batch 8 and window
    1,888 would otherwise hold 4.6 GB of bf16 logits and, under `bf16-mixed`, 9.2 GB more of their float32 copy.

    Args:
        teacher: the frozen teacher, a `gpt.GPT` from `gpt.load_model`.
        teacher_ids: (B, M) teacher token ids of each window (padding: any id).
        teacher_valid: (B, M) bool, False on padding.

    Returns:
        (B, M) float32: `lt[b, j]` = -log p(teacher_ids[b, j] | teacher_ids[b, :j]); NaN where unavailable: the first
        token of each window (no context inside the window) and padding.
    """
    targets = F.pad(teacher_ids[:, 1:].masked_fill(~teacher_valid[:, 1:], -100), (0, 1), value=-100)  # (B, M)
    loss = teacher(teacher_ids, targets=targets)  # loss[:, j]: token j + 1, predicted at position j
    loss = F.pad(loss[:, :-1], (1, 0), value=float("nan"))
    return loss.masked_fill(~teacher_valid, float("nan"))
