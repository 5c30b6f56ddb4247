"""LitGPT checkpoint directories: checking them before any model is built, fingerprinting, loading their weights;
the recipe's training checkpoints: saving them whole or not at all, finding the one to resume from.

Every weight file is read with `torch.load(weights_only=True)` (`read_weights`; Fabric's loaders get
`weights_only=True` too): a weight file is data, and unpickling it without that restriction (as LitGPT's
`load_checkpoint` and Lightning's `_lazy_load` do) would run whatever code a crafted file holds.
"""

import hashlib
import json
import pickle
import re
import shutil
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn as nn
import yaml
from litgpt.config import Config
from litgpt.data import DataModule
from litgpt.utils import copy_config_files, save_config
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from litgpt_vocagnolm.errors import InvalidArgument, PathMissing
from litgpt_vocagnolm.tokenizer_files import TOKENIZER_FILES, load_tokenizer

MODEL_FILES = ("lit_model.pth", "model_config.yaml")


class UnreadableCheckpoint(InvalidArgument):
    """A weight file that can't be loaded safely: truncated, corrupt, or holding more than tensors and plain data."""


def check_checkpoint_dir(checkpoint_dir: Path, what: str, tokenizer: bool = False) -> None:
    """Fails early, naming what is missing or unreadable, before any model is built: the weights and config, and with
    `tokenizer` the tokenizer files (what `litgpt generate` and `vocagnolm evaluate` need). The weights are opened
    (`read_weights`: memory-mapped, their pickled index read, not the tensor data), so a refused or damaged file fails
    here rather than after minutes of model building."""
    if not checkpoint_dir.is_dir():
        raise PathMissing(f"{what} {str(checkpoint_dir)!r} is not a directory. Pass a LitGPT checkpoint directory.")
    wanted = [(name,) for name in MODEL_FILES]
    if tokenizer:
        wanted += [("tokenizer.json", "tokenizer.model"), ("tokenizer_config.json",)]  # what `litgpt.Tokenizer` reads
    missing = [" or ".join(names) for names in wanted if not any((checkpoint_dir / n).is_file() for n in names)]
    if missing:
        present = sorted(p.name for p in checkpoint_dir.iterdir())
        raise PathMissing(
            f"{what} {str(checkpoint_dir)!r} lacks {missing} (it holds {present}). A LitGPT checkpoint has"
            " lit_model.pth and model_config.yaml next to the tokenizer files: run `litgpt download <repo>` (it"
            " converts), or `litgpt convert_to_litgpt` on a Hugging Face checkpoint; for a trained model, copy the"
            " tokenizer files of the model it started from next to lit_model.pth."
        )
    read_weights(checkpoint_dir / "lit_model.pth")
    if any((checkpoint_dir / name).is_file() for name in TOKENIZER_FILES):
        config = Config.from_file(checkpoint_dir / "model_config.yaml")
        check_vocab_size(config, checkpoint_dir, what, fix="tokenizer and weights do not belong together. Use the"
                         " tokenizer files that came with the checkpoint.")  # fmt: skip


def check_vocab_size(config: Config, tokenizer_dir: Path, what: str, fix: str) -> None:
    """Fails unless the model's vocabulary (`padded_vocab_size` rows of embedding and head) covers every id the
    tokenizer makes: a larger id is an IndexError on a CPU and an opaque device-side assert on a GPU, mid-run."""
    vocab_size = load_tokenizer(tokenizer_dir).get_vocab_size(with_added_tokens=True)
    if vocab_size > config.padded_vocab_size:
        raise InvalidArgument(
            f"{what} {str(tokenizer_dir)!r}: its tokenizer has {vocab_size} tokens but the model only"
            f" {config.padded_vocab_size} (padded_vocab_size of {config.name!r}): {fix}"
        )


def checkpoint_fingerprint(checkpoint_dir: Path) -> str:
    """sha256 of the model config plus the weights files' names and sizes: ties a loss cache to its teacher without
    reading gigabytes of weights."""
    digest = hashlib.sha256((checkpoint_dir / "model_config.yaml").read_bytes())
    for path in sorted(checkpoint_dir.glob("*.pth")):
        digest.update(json.dumps([path.name, path.stat().st_size]).encode())
    return digest.hexdigest()


def read_weights(path: Path) -> dict[str, Any]:
    """A `torch.save`d weight file, memory-mapped (tensor data is read when used) and unpickled with
    `weights_only=True`: tensors and plain containers only, so a crafted file can't run code.

    Raises `UnreadableCheckpoint`, naming the file, when it holds anything else (refused, nothing loaded) or can't be
    read (truncated, zeroed, not a `torch.save` zip archive).
    """
    try:
        return torch.load(path, mmap=True, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's own reason, e.g. "Unsupported global: GLOBAL posix.system was not an allowed global by default".
        reason = re.search(r"WeightsUnpickler error:\s*([^\n]+?)(?:\.\s|\n|$)", str(error))
        raise UnreadableCheckpoint(
            f"Refused to load {path}: it holds more than tensors and plain data"
            f" ({reason[1] if reason else str(error).splitlines()[0]}), and unpickling it could run code; nothing was"
            " loaded. Checkpoints written by LitGPT and this recipe load as they are: use one from a source you trust."
        ) from error
    except Exception as error:  # seen: OSError (truncated), RuntimeError (zeroed, not a zip), EOFError (empty)
        raise UnreadableCheckpoint(
            f"Cannot read {path} ({type(error).__name__}: {error}): the file is truncated, corrupt or not a"
            " `torch.save` checkpoint."
        ) from error


def load_weights(model: nn.Module, path: Path) -> None:
    """A LitGPT checkpoint's weights into a model Fabric has set up, sharded (FSDP2) or not.

    Takes a bare state dict (`litgpt download`) or a training checkpoint with the weights under "model" (what
    pretraining saves). LitGPT's `load_checkpoint` can't be used: it unpickles without restriction, and under
    ModelParallelStrategy it renames keys for LoRA layers. Every rank memory-maps the file and keeps only its own
    shard of each tensor.
    """
    state_dict = read_weights(path)
    state_dict = state_dict.get("model", state_dict)
    module = getattr(model, "module", model)  # under the Fabric wrapper
    set_model_state_dict(module, state_dict, options=StateDictOptions(full_state_dict=True, strict=True))


def find_resume_checkpoint(fabric: L.Fabric, resume: bool | Literal["auto"] | Path, out_dir: Path) -> Path | None:
    """The training checkpoint to resume from: `litgpt.utils.find_resume_path`'s, past checkpoints that can't be read.

    LitGPT takes the newest `out_dir/step-*/*.pth`; if that one is damaged (a node lost while the file system flushed
    it, a full disk), a requeued job fails on every requeue. Here, for `--resume auto` or `True`, a checkpoint that
    `read_weights` refuses or can't read is reported and skipped, newest first, and only one that every rank reads is
    taken (one all-reduce per checkpoint tried), so all ranks resume from the same step. Opening a checkpoint reads
    its pickled index, not its tensors: the one chosen is read once, by `fabric.load`. With none readable, `auto`
    starts afresh and `True` fails; a `resume` path must be readable (`check_setup` opened it).
    """
    if not resume:
        return None
    if isinstance(resume, Path):
        return resume
    # litgpt.utils.find_resume_path's choice (newest step first), here every candidate in that order; rank 0's list,
    # so that every rank tries the same files even where a shared file system shows one rank a stale directory.
    candidates = sorted(out_dir.rglob("step-*/*.pth"), key=lambda p: int(p.parent.name.split("-")[1]), reverse=True)
    candidates = fabric.broadcast(candidates)
    for path in candidates:
        try:
            read_weights(path)
            reason = None
        except UnreadableCheckpoint as error:
            reason = str(error)
        failed = fabric.all_reduce(torch.tensor(float(reason is not None), device=fabric.device), reduce_op="sum")
        if failed.item() == 0:
            return path
        fabric.print(f"Skipping {path}: {reason or 'another rank cannot read it'}")
    skipped = f" ({len(candidates)} unreadable, skipped)" if candidates else ""
    if resume is True:
        raise PathMissing(f"--resume true, but no readable checkpoint in --out_dir {out_dir}{skipped}.")
    if candidates:
        fabric.print(f"No readable checkpoint in {out_dir}{skipped}: starting afresh.")
    return None


def save_checkpoint(fabric: L.Fabric, state: dict, tokenizer_dir: Path | None, checkpoint_file: Path, hparams: dict) -> None:
    """litgpt.pretrain.save_checkpoint, changed twice: hyperparameters.yaml is written from the parsed arguments
    (LitGPT's version re-parses `sys.argv` against its own `setup` and exits on our extra flags), and the directory
    appears only once complete (written as `.partial-<name>`, then renamed), so a job killed mid-save resumes from
    the previous checkpoint instead of a truncated file."""
    final_dir = checkpoint_file.parent
    partial_dir = final_dir.with_name(f".partial-{final_dir.name}")
    if fabric.global_rank == 0:
        shutil.rmtree(partial_dir, ignore_errors=True)
        partial_dir.mkdir(parents=True)
    fabric.barrier()
    fabric.print(f"Saving checkpoint to {str(checkpoint_file)!r}")
    fabric.save(partial_dir / checkpoint_file.name, state)
    if fabric.global_rank == 0:
        with open(partial_dir / "hyperparameters.yaml", "w", encoding="utf-8") as f:
            yaml.safe_dump(hparams, f, sort_keys=False)
        if tokenizer_dir is not None:
            copy_config_files(tokenizer_dir, partial_dir)
        save_config(state["model"].config, partial_dir)
        shutil.rmtree(final_dir, ignore_errors=True)
        partial_dir.rename(final_dir)
    fabric.barrier()


def hyperparameters(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments of `setup` in the layout `--config` reads back (data modules as class_path/init_args)."""

    def plain(value: Any) -> Any:
        if isinstance(value, DataModule):
            init_args = {f.name: plain(getattr(value, f.name)) for f in fields(value) if f.init}
            return {"class_path": f"{type(value).__module__}.{type(value).__qualname__}", "init_args": init_args}
        if is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in fields(value) if f.init}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return {name: plain(value) for name, value in arguments.items()}
