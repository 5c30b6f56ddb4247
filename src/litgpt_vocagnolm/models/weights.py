"""LitGPT checkpoint directories: checking them before any model is built, their weights' checksums and
fingerprint, loading their weights.

Every weight file is read with `torch.load(weights_only=True)` (`read_weights`; a sharded training checkpoint's with
`SafeReader` and `SafePlanner`): a weight file is data, and unpickling
it without that restriction (as LitGPT's `load_checkpoint` and Lightning's `_lazy_load` do) would run whatever code a
crafted file holds.
"""

import hashlib
import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import yaml
from litgpt.config import Config
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from litgpt_vocagnolm.alignment.tokenizer_files import TOKENIZER_FILES, load_tokenizer
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing
from litgpt_vocagnolm.files import file_sha256

MODEL_FILES = ("lit_model.pth", "model_config.yaml")
CHECKSUMS = "checksums.json"


class UnreadableCheckpoint(InvalidArgument):
    """A weight file that can't be loaded safely: truncated, corrupt, or holding more than tensors and plain data."""


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` is a pickle that `FileSystemReader` loads without restriction: here only the classes a
    checkpoint's index holds (DCP's metadata dataclasses, paths, sizes, dtypes) may be built."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            module == "torch.distributed.checkpoint.metadata"
            or (module, name)
            in {
                ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                ("torch.serialization", "_get_layout"),
                ("pathlib", "PosixPath"),
                ("pathlib", "WindowsPath"),
                ("torch", "Size"),
                ("collections", "OrderedDict"),
            }
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's index")
        return super().find_class(module, name)


class SafeReader(dcp.FileSystemReader):
    """`FileSystemReader` whose index is unpickled by `_MetadataUnpickler` (the tensors already load with
    `weights_only=True`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as error:
            raise UnreadableCheckpoint(f"Refused to load {path}: {error}; nothing was loaded.") from error
        except Exception as error:
            raise UnreadableCheckpoint(f"Cannot read {path} ({type(error).__name__}: {error}).") from error
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's loader of non-tensor values (the optimizer's `param_groups`): `weights_only=True`, unlike the default."""

    def load_bytes(self, read_item, value) -> None:
        self.original_state_dict[read_item.dest_index.fqn] = torch.load(value, weights_only=True)


def check_checkpoint_dir(checkpoint_dir: Path, what: str, tokenizer: bool = False, verify: bool = True) -> None:
    """Fails early, naming what is missing or unreadable, before any model is built: the weights and config, and with
    `tokenizer` the tokenizer files (what `litgpt generate` and `vocagnolm evaluate` need). The weights are opened
    (`read_weights`: memory-mapped, their pickled index read, not the tensor data), so a refused or damaged file fails
    here rather than after minutes of model building; where checksums.json records them, they must match it (unless
    `verify` is False: for a caller that runs `verified_weights_sha256` itself, so that the weights are read once)."""
    if not checkpoint_dir.is_dir():
        raise PathMissing(f"{what} {str(checkpoint_dir)!r} is not a directory. Pass a LitGPT checkpoint directory.")
    wanted = [(name,) for name in MODEL_FILES]
    if tokenizer:
        wanted += [("tokenizer.json", "tokenizer.model"), ("tokenizer_config.json",)]  # what `litgpt.Tokenizer` reads
    missing = [" or ".join(names) for names in wanted if not any((checkpoint_dir / n).is_file() for n in names)]
    if missing and (checkpoint_dir / ".metadata").is_file():  # a training checkpoint: sharded, weights and optimizer
        raise PathMissing(
            f"{what} {str(checkpoint_dir)!r} is a training checkpoint (sharded, with the optimizer's state), not a"
            f" LitGPT checkpoint directory: export it first, `vocagnolm export {checkpoint_dir} DIR`, and"
            " pass DIR."
        )
    if missing:
        present = sorted(p.name for p in checkpoint_dir.iterdir())
        if any(Path(name).suffix in (".safetensors", ".bin") for name in present):  # Hugging Face weights, unconverted
            fix = f"convert its Hugging Face weights first, `vocagnolm convert_to_litgpt {checkpoint_dir}`"
        else:
            fix = (
                "run `litgpt download <repo>` (it converts), or `vocagnolm convert_to_litgpt DIR` on a Hugging Face"
                " checkpoint; for a trained model, copy the tokenizer files of the model it started from next to"
                " lit_model.pth"
            )
        raise PathMissing(
            f"{what} {str(checkpoint_dir)!r} lacks {missing} (it holds {present}). A LitGPT checkpoint has"
            f" lit_model.pth and model_config.yaml next to the tokenizer files: {fix}."
        )
    config = read_config(checkpoint_dir, what)
    read_weights(checkpoint_dir / "lit_model.pth")
    if verify and (checkpoint_dir / CHECKSUMS).is_file():  # a run's final/ or an exported checkpoint: damaged since?
        verified_weights_sha256(checkpoint_dir)
    if any((checkpoint_dir / name).is_file() for name in TOKENIZER_FILES):
        fix = "tokenizer and weights do not belong together. Use the tokenizer files that came with the checkpoint."
        check_vocab_size(config, checkpoint_dir, what, fix=fix)


def read_config(checkpoint_dir: Path, what: str) -> Config:
    """The checkpoint's model_config.yaml as LitGPT's `Config`, with the classes it names looked up; one that can't
    be read (YAML refused by the safe loader, such as a `!!python/...` tag: nothing of it runs), holds fields LitGPT's
    Config lacks, or names a class LitGPT lacks is refused in one line naming the file, before any model is built."""
    path = checkpoint_dir / "model_config.yaml"
    try:
        config = Config.from_file(path)
        config.mlp_class, config.norm_class  # noqa: B018 - looked up now, not when the model is built
    except (yaml.YAMLError, TypeError, ValueError, AttributeError) as error:
        reason = " ".join(str(error).split())[:200]
        raise UnreadableCheckpoint(
            f"{what} {str(checkpoint_dir)!r}: {path} is not a LitGPT model config ({type(error).__name__}: {reason})."
            " Use the model_config.yaml that came with the checkpoint (`litgpt download` or `vocagnolm"
            " convert_to_litgpt` writes it)."
        ) from error
    return config


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


def verified_weights_sha256(checkpoint_dir: Path) -> str:
    """sha256 of a LitGPT checkpoint directory's lit_model.pth: the checkpoint's identity by content. Where the
    directory's checksums.json records its lit_model.pth and model_config.yaml (a training checkpoint's `final/`, an
    exported one), they must match it: a file damaged since is refused, naming it, before any model is built."""
    path = checkpoint_dir / CHECKSUMS
    try:
        recorded = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as error:
        raise UnreadableCheckpoint(f"Cannot read {path}: {error}") from error
    sums = {name: file_sha256(checkpoint_dir / name) for name in MODEL_FILES}
    for name, digest in sums.items():
        if name in recorded and recorded[name] != digest:
            raise UnreadableCheckpoint(
                f"{checkpoint_dir / name} does not match its checksum in {CHECKSUMS}: the file is damaged."
            )
    return sums["lit_model.pth"]
