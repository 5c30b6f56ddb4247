"""The frozen teachers: their settings (`TeacherArgs`), one `Teacher` per teacher (`teachers_of`, which decides once
how each runs: online, from its cache or not at all) and the per-token loss that scores a batch.

The teacher's whole contribution to VocAgnoLM is one number per teacher token: its cross-entropy on that token. The
same function computes it online (inside the training step) and offline (`vocagnolm score-teacher`), so the two cannot
drift. The teacher is never put in the training `state`: it has no optimizer state and is reloaded, never saved.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from jsonargparse.typing import register_type

from litgpt_vocagnolm.data.prepared import TeacherSide, byte_table
from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.loss.methods import GuidanceMethod
from litgpt_vocagnolm.models.gpt import GPT, load_model

PRECISIONS = ("bf16-true", "16-true", "32-true")  # a teacher only runs forward passes: no mixed precision
Mode = Literal["online", "cached"]


class Paths(list):
    """One path or several, a list of `Path` either way: the one place where one-or-many is normalised, as the
    arguments enter. `--teacher.checkpoint_dir DIR`, `--teacher.checkpoint_dir '[A, B]'` and a YAML list all read as
    a list (jsonargparse refuses a single value for `list[Path]`; it parses "[A, B]" before `of` sees it)."""

    @classmethod
    def of(cls, value: "str | Path | Sequence[str | Path] | None") -> "Paths":
        """`value` as a list of paths: None is none, a path one, a sequence of them a list."""
        if value is None:
            return cls()
        return cls([Path(value)] if isinstance(value, (str, Path)) else [Path(v) for v in value])


register_type(Paths, serializer=lambda paths: [str(p) for p in paths], deserializer=Paths.of)


@dataclass
class TeacherArgs:
    """The frozen teacher that guides the student."""

    checkpoint_dir: Paths | None = None
    """A LitGPT checkpoint directory (lit_model.pth, model_config.yaml and the tokenizer files): `litgpt download`
    then use the directory it prints. Not needed for `ce`, nor with `cache`. Several teachers: a list, one per
    prepared dataset (`--data.path`, then `--data.other_teachers`), all run on every batch."""
    precision: str | None = None
    """Teacher dtype: "bf16-true" (default on GPU), "16-true" or "32-true" (default on CPU). The teacher only runs
    forward passes under no_grad, so half precision halves its memory at no cost to the student."""
    cache: Paths | None = None
    """A teacher loss cache written by `vocagnolm score-teacher` for the prepared data: then no teacher is loaded.
    Several teachers: a list, one cache per prepared dataset, in the order of the data."""

    def __post_init__(self) -> None:
        check_precision(self.precision, "--teacher.precision")
        self.checkpoint_dir = Paths.of(self.checkpoint_dir) if self.checkpoint_dir is not None else None
        self.cache = Paths.of(self.cache) if self.cache is not None else None

    @property
    def checkpoint_dirs(self) -> Paths:
        """`checkpoint_dir`, one per teacher; empty without one."""
        return self.checkpoint_dir or Paths()

    @property
    def caches(self) -> Paths:
        """`cache`, one per teacher; empty without one."""
        return self.cache or Paths()


def default_precision(device: torch.device) -> str:
    """A teacher's precision when none is given: "bf16-true" on a GPU, "32-true" elsewhere."""
    return "bf16-true" if device.type == "cuda" else "32-true"


def precision_dtype(precision: str | None, device: torch.device) -> torch.dtype:
    """The dtype a teacher runs in on `device` at `precision` (one of PRECISIONS; None: `default_precision`)."""
    precision = precision or default_precision(device)
    return {"bf16-true": torch.bfloat16, "16-true": torch.float16, "32-true": torch.float32}[precision]


def check_precision(precision: str | None, flag: str) -> None:
    """A teacher precision, as option `flag` gave it: one of PRECISIONS, or None for the device's default."""
    if precision not in (None, *PRECISIONS):
        raise InvalidArgument(f"{flag} must be one of {', '.join(PRECISIONS)}, got {precision!r}.")


@dataclass
class Teacher:
    """One frozen teacher of a run: where it comes from, how it runs and, once loaded online, its model."""

    checkpoint_dir: Path | None = None
    """Its LitGPT checkpoint: its weights when it runs online, its tokenizer (identity, byte table) always; None
    when only its cache is given."""
    cache: Path | None = None
    """Its loss cache (`vocagnolm score-teacher`), or None."""
    mode: Mode | None = None
    """How it scores a batch: "online" (its model runs), "cached" (its losses are read with the batch) or None (it
    does not score: the method needs no teacher)."""
    precision: str | None = None
    """Its precision when online (one of PRECISIONS; None: `default_precision`)."""
    model: GPT | None = field(default=None, repr=False)
    """The frozen model, once `load` has built it (online only)."""

    def load(self, fabric: L.Fabric) -> GPT:
        """Builds the frozen model from `checkpoint_dir` in its precision under `fabric`'s strategy (`gpt.load_model`,
        which marks it frozen for `distributed.parallelize`) and keeps it."""
        self.model = load_model(self.checkpoint_dir, fabric, precision_dtype(self.precision, fabric.device))
        return self.model

    def byte_table(self, device: torch.device) -> torch.Tensor:
        """The UTF-8 bytes each of its token ids covers, (V_t,) int64 on `device`, from its tokenizer
        (`--guidance.compare byte`: `prepared.byte_table`)."""
        return byte_table(self.checkpoint_dir, device)

    def score(self, side: TeacherSide) -> torch.Tensor:
        """Its per-token losses on its side of a batch, (B, M) float32 (`teacher_token_loss`): computed by its model
        online (call under no_grad), read from the batch when cached."""
        if self.mode == "cached":
            return side.loss
        return teacher_token_loss(self.model, side.ids, side.valid)


def teacher_mode(args: TeacherArgs, method: GuidanceMethod) -> Mode | None:
    """How the teachers of a run score its batches, decided here alone: from their caches when `--teacher.cache` is
    given (`random` reads them too, to tell mapped tokens); online when the method needs their scores and no cache is
    given; else not at all."""
    if args.caches:
        return "cached"
    return "online" if method.needs_teacher else None


def teachers_of(args: TeacherArgs, method: GuidanceMethod) -> list[Teacher]:
    """The run's teachers, one per `--teacher.checkpoint_dir` or `--teacher.cache` (in the order of the prepared
    data; `checks.check_setup` refuses lists of different lengths), each running as `teacher_mode` decides."""
    dirs, caches, mode = args.checkpoint_dirs, args.caches, teacher_mode(args, method)
    return [
        Teacher(dirs[k] if dirs else None, caches[k] if caches else None, mode, args.precision)
        for k in range(max(len(dirs), len(caches)))
    ]


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
