"""LitGPT checkpoint directories: checking them before any model is built, fingerprinting, loading their weights.

Weights are loaded with `torch.load(weights_only=True)`: a weight file is data, and unpickling it without that
restriction (as LitGPT's `load_checkpoint` does) would run whatever code a crafted file holds.
"""

import hashlib
import json
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

MODEL_FILES = ("lit_model.pth", "model_config.yaml")


def check_checkpoint_dir(checkpoint_dir: Path, what: str, tokenizer: bool = False) -> None:
    """Fails early, naming what is missing, before any model is built: the weights and config, and with `tokenizer`
    the tokenizer files (what `litgpt generate` and `vocagnolm evaluate` need)."""
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"{what} {str(checkpoint_dir)!r} is not a directory. Pass a LitGPT checkpoint directory.")
    wanted = [(name,) for name in MODEL_FILES]
    if tokenizer:
        wanted += [("tokenizer.json", "tokenizer.model"), ("tokenizer_config.json",)]  # what `litgpt.Tokenizer` reads
    missing = [" or ".join(names) for names in wanted if not any((checkpoint_dir / n).is_file() for n in names)]
    if missing:
        present = sorted(p.name for p in checkpoint_dir.iterdir())
        raise FileNotFoundError(
            f"{what} {str(checkpoint_dir)!r} lacks {missing} (it holds {present}). A LitGPT checkpoint has"
            " lit_model.pth and model_config.yaml next to the tokenizer files: run `litgpt download <repo>` (it"
            " converts), or `litgpt convert_to_litgpt` on a Hugging Face checkpoint; for a trained model, copy the"
            " tokenizer files of the model it started from next to lit_model.pth."
        )


def checkpoint_fingerprint(checkpoint_dir: Path) -> str:
    """sha256 of the model config plus the weights files' names and sizes: ties a loss cache to its teacher without
    reading gigabytes of weights."""
    digest = hashlib.sha256((checkpoint_dir / "model_config.yaml").read_bytes())
    for path in sorted(checkpoint_dir.glob("*.pth")):
        digest.update(json.dumps([path.name, path.stat().st_size]).encode())
    return digest.hexdigest()


def load_weights(model: nn.Module, path: Path) -> None:
    """A LitGPT checkpoint's weights into a model Fabric has set up, sharded (FSDP2) or not.

    Takes a bare state dict (`litgpt download`) or a training checkpoint with the weights under "model" (what
    pretraining saves). LitGPT's `load_checkpoint` can't be used under ModelParallelStrategy: it renames keys for
    LoRA layers. Every rank memory-maps the file and keeps only its own shard of each tensor.
    """
    state_dict = torch.load(path, mmap=True, map_location="cpu", weights_only=True)
    state_dict = state_dict.get("model", state_dict)
    module = getattr(model, "module", model)  # under the Fabric wrapper
    set_model_state_dict(module, state_dict, options=StateDictOptions(full_state_dict=True, strict=True))
