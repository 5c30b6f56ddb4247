"""The frozen teacher: loading it beside the student, and its per-token loss.

The teacher's whole contribution to VocAgnoLM is one number per teacher token: its cross-entropy on that token. The
same function computes it online (inside the training step) and offline (`vocagnolm score-teacher`), so the two cannot
drift. The teacher is never put in the training `state`: it has no optimizer state and is reloaded, never saved.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import torch.nn as nn
from litgpt.config import Config
from litgpt.model import GPT
from litgpt.utils import load_checkpoint

from litgpt_vocagnolm.loss import per_token_cross_entropy


@dataclass
class TeacherArgs:
    """The frozen teacher that guides the student."""

    checkpoint_dir: Path | None = None
    """A LitGPT checkpoint directory (lit_model.pth, model_config.yaml and the tokenizer files): `litgpt download`
    then use the directory it prints. Not needed for `ce`, nor with `cache`."""
    precision: str | None = None
    """Teacher dtype: "bf16-true" (default on GPU), "16-true" or "32-true" (default on CPU). The teacher only runs
    forward passes under no_grad, so half precision halves its memory at no cost to the student."""
    cache: Path | None = None
    """A teacher loss cache written by `vocagnolm score-teacher` for the prepared data: then no teacher is loaded."""

    def __post_init__(self) -> None:
        if self.precision not in (None, "bf16-true", "16-true", "32-true"):
            raise ValueError(f"--teacher.precision must be bf16-true, 16-true or 32-true, got {self.precision!r}")

    def dtype(self, device: torch.device) -> torch.dtype:
        precision = self.precision or ("bf16-true" if device.type == "cuda" else "32-true")
        return {"bf16-true": torch.bfloat16, "16-true": torch.float16, "32-true": torch.float32}[precision]


REQUIRED_FILES = ("lit_model.pth", "model_config.yaml")


def check_checkpoint_dir(checkpoint_dir: Path, what: str = "--teacher.checkpoint_dir") -> None:
    """Fails early, naming what is missing, before any model is built."""
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"{what} {str(checkpoint_dir)!r} is not a directory. Pass a LitGPT checkpoint directory.")
    missing = [name for name in REQUIRED_FILES if not (checkpoint_dir / name).is_file()]
    if missing:
        present = sorted(p.name for p in checkpoint_dir.iterdir())
        raise FileNotFoundError(
            f"{what} {str(checkpoint_dir)!r} lacks {missing} (it holds {present}). A LitGPT checkpoint has"
            " lit_model.pth and model_config.yaml: run `litgpt download <repo>` (it converts), or"
            " `litgpt convert_to_litgpt` on a Hugging Face checkpoint."
        )


def checkpoint_fingerprint(checkpoint_dir: Path) -> str:
    """sha256 of the model config plus the weights files' names and sizes: ties a loss cache to its teacher without
    reading gigabytes of weights."""
    digest = hashlib.sha256((checkpoint_dir / "model_config.yaml").read_bytes())
    for path in sorted(checkpoint_dir.glob("*.pth")):
        digest.update(json.dumps([path.name, path.stat().st_size]).encode())
    return digest.hexdigest()


def load_teacher(fabric: L.Fabric, checkpoint_dir: Path, dtype: torch.dtype) -> nn.Module:
    """Builds the teacher under the run's strategy (sharded like the student under FSDP), loads its weights, freezes it."""
    config = Config.from_file(checkpoint_dir / "model_config.yaml")
    with fabric.init_module(empty_init=True):
        model = GPT(config)
    model.to(dtype=dtype)  # before sharding: on the meta device under FSDP, so this costs nothing
    model.requires_grad_(False)
    model.eval()
    # setup_module, not setup: no optimizer, and under FSDP the frozen teacher is sharded the same way as the student.
    model = fabric.setup_module(model)
    load_checkpoint(fabric, model, checkpoint_dir / "lit_model.pth")
    return model


def teacher_token_loss(logits: torch.Tensor, teacher_ids: torch.Tensor, teacher_valid: torch.Tensor) -> torch.Tensor:
    """Per-token loss of the teacher on its own tokens, from its logits (`teacher(teacher_ids)` under no_grad).

    Args:
        logits: (B, M, V) teacher logits over its windows.
        teacher_ids: (B, M) teacher token ids of each window (padding: any id).
        teacher_valid: (B, M) bool, False on padding.

    Returns:
        (B, M) float32: `lt[b, j]` = -log p(teacher_ids[b, j] | teacher_ids[b, :j]); NaN where unavailable: the first
        token of each window (no context inside the window) and padding.
    """
    targets = teacher_ids[:, 1:].masked_fill(~teacher_valid[:, 1:], -100)
    loss = per_token_cross_entropy(logits[:, :-1], targets)  # (B, M - 1)
    loss = torch.cat([torch.full_like(loss[:, :1], float("nan")), loss], dim=1)
    return loss.masked_fill(~teacher_valid, float("nan"))
