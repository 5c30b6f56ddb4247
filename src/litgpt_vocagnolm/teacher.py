"""The frozen teacher: loading it beside the student, and its per-token loss.

The teacher's whole contribution to VocAgnoLM is one number per teacher token: its cross-entropy on that token. The
same function computes it online (inside the training step) and offline (`vocagnolm score-teacher`), so the two cannot
drift. The teacher is never put in the training `state`: it has no optimizer state and is reloaded, never saved.
"""

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric.strategies import DDPStrategy
from litgpt.config import Config
from litgpt.model import GPT
from litgpt.utils import parse_devices
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from tqdm import tqdm

from litgpt_vocagnolm.data import MANIFEST, VocAgnoData, file_sha256, open_split
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
    if isinstance(fabric.strategy, DDPStrategy):
        # Data-parallel scoring: every rank holds the whole teacher (DDP refuses a module without gradients).
        model.to(fabric.device)
    else:
        # setup_module, not setup: no optimizer; under FSDP the frozen teacher is sharded like the student.
        model = fabric.setup_module(model)
    load_weights(model, checkpoint_dir / "lit_model.pth")
    return model


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
    # Shift the targets, not the logits: `logits[:, :-1]` is not contiguous and would copy the whole (B, M, V) tensor.
    targets = F.pad(teacher_ids[:, 1:].masked_fill(~teacher_valid[:, 1:], -100), (0, 1), value=-100)  # (B, M)
    loss = per_token_cross_entropy(logits, targets)  # loss[:, j]: token j + 1, predicted at position j
    loss = F.pad(loss[:, :-1], (1, 0), value=float("nan"))
    return loss.masked_fill(~teacher_valid, float("nan"))


# ----------------------------------------------------------------------------------------------------------------
# The teacher loss cache: score the corpus once, train many times without the teacher.
#
# Layout of a cache directory (written by `vocagnolm score-teacher`):
#   manifest.json                 the teacher's fingerprint, the data manifest's sha256, counts, bytes per token
#   <split>/<shard>.losses.npy    float16: every block's window losses, concatenated, without each window's first
#                                 token (never predicted: NaN by definition)
#   <split>/<shard>.offsets.npy   uint32 (blocks + 1,): where each block's losses start in the shard
# A shard holds `blocks_per_shard` consecutive blocks (by index in the prepared split) and appears atomically.

CACHE_FORMAT = "vocagnolm-teacher-loss/1"
CACHE_MANIFEST = "manifest.json"


def shard_files(cache: Path, split: str, shard: int) -> tuple[Path, Path]:
    return cache / split / f"{shard:06d}.losses.npy", cache / split / f"{shard:06d}.offsets.npy"


class TeacherLossCache:
    """Reads one split of a cache: `cache[i]` is block i's teacher loss, float32 (M_i,) with NaN first."""

    def __init__(self, cache: Path, split: str) -> None:
        manifest = load_cache_manifest(cache)
        self.cache, self.split, self.blocks_per_shard = Path(cache), split, manifest["blocks_per_shard"]
        self._shards: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # memory-mapped, opened lazily per process

    def __getitem__(self, index: int) -> np.ndarray:
        shard, row = divmod(index, self.blocks_per_shard)
        if shard not in self._shards:
            losses, offsets = shard_files(self.cache, self.split, shard)
            self._shards[shard] = (np.load(losses, mmap_mode="r"), np.load(offsets))
        losses, offsets = self._shards[shard]
        return np.concatenate([[np.nan], losses[offsets[row] : offsets[row + 1]]]).astype(np.float32)


def load_cache_manifest(cache: Path) -> dict:
    path = Path(cache) / CACHE_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{cache} is not a teacher loss cache (no {CACHE_MANIFEST}), or its scoring has not finished."
            " Run `vocagnolm score-teacher --data DIR --teacher CHECKPOINT_DIR --output CACHE` (again: it resumes)."
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != CACHE_FORMAT:
        raise ValueError(f"{path} has format {manifest.get('format')!r}, this version reads {CACHE_FORMAT!r}.")
    return manifest


def check_cache(cache: Path, data_manifest: Path, teacher_dir: Path | None) -> dict:
    """Fails unless the cache was scored on exactly this prepared data (and by this teacher, when one is given)."""
    manifest = load_cache_manifest(cache)
    data_sha = file_sha256(data_manifest)
    if manifest["data"]["manifest_sha256"] != data_sha:
        raise ValueError(
            f"The teacher loss cache {cache} was scored on other data: its data manifest sha256 is"
            f" {manifest['data']['manifest_sha256']} ({manifest['data']['path']}), {data_manifest} has {data_sha}."
            " Score this data: `vocagnolm score-teacher --data ... --output NEW_CACHE`."
        )
    if teacher_dir is not None and manifest["teacher"]["fingerprint"] != checkpoint_fingerprint(teacher_dir):
        raise ValueError(
            f"The teacher loss cache {cache} was scored by {manifest['teacher']['checkpoint_dir']}, whose config and"
            f" weights differ from --teacher.checkpoint_dir {teacher_dir}. Drop one of the two, or score again."
        )
    return manifest


def score_teacher(
    *,
    data: Path,
    teacher: Path,
    output: Path | None = None,
    devices: int | str = 1,
    num_nodes: int = 1,
    precision: str | None = None,
    batch_size: int = 8,
    blocks_per_shard: int = 1024,
) -> None:
    """Run the frozen teacher once over prepared data and store its per-token losses (16-bit) for training.

    Training with `--teacher.cache OUTPUT` then loads no teacher: every guided run (top-k, aggregation, unmapped,
    chunk ablations) costs what plain cross-entropy costs. Data-parallel over devices and nodes (each rank holds the
    whole teacher and scores its own shards); killed and run again, it scores only the missing shards.

    Arguments:
        data: The output directory of `vocagnolm prepare`.
        teacher: The teacher's LitGPT checkpoint directory (the tokenizer the data was prepared with).
        output: The cache directory. Default: DATA/teacher_loss/<teacher directory name>.
        devices: Devices per node.
        num_nodes: Number of nodes.
        precision: "bf16-true" (default on GPU), "16-true" or "32-true" (default on CPU).
        batch_size: Blocks per teacher forward pass.
        blocks_per_shard: Blocks per cache file: the unit of resumption.
    """
    data, teacher = Path(data), Path(teacher)
    output = Path(output) if output is not None else data / "teacher_loss" / teacher.name
    check_checkpoint_dir(teacher, what="--teacher")
    prepared = VocAgnoData(path=data)
    prepared.check_tokenizers(None, teacher)  # the teacher's tokenizer must be the one the data was prepared with
    settings = {
        "format": CACHE_FORMAT,
        "teacher": {"checkpoint_dir": str(teacher), "fingerprint": checkpoint_fingerprint(teacher)},
        "data": {"path": str(data), "manifest_sha256": file_sha256(data / MANIFEST)},
        "dtype": "float16",
        "blocks_per_shard": blocks_per_shard,
    }
    if (output / CACHE_MANIFEST).is_file():
        done = json.loads((output / CACHE_MANIFEST).read_text())
        if {k: done.get(k) for k in settings} == settings:
            print(f"{output} already holds this teacher's losses on this data: nothing to do.")
            return
        raise ValueError(f"{output} holds a cache of another teacher, data or setting. Choose another --output.")
    if output.exists() and any(p.name not in ("train", "val", ".settings.json") for p in output.iterdir()):
        raise ValueError(f"--output {output} holds something else. Choose a new or empty directory.")

    world_size = parse_devices(devices) * num_nodes
    fabric = L.Fabric(devices=devices, num_nodes=num_nodes, strategy="ddp" if world_size > 1 else "auto")
    fabric.launch()
    if fabric.global_rank == 0:
        output.mkdir(parents=True, exist_ok=True)
        settings_file = output / ".settings.json"
        if settings_file.is_file() and json.loads(settings_file.read_text()) != settings:
            raise ValueError(f"{output} holds a partial cache of another teacher or data. Choose another --output.")
        settings_file.write_text(json.dumps(settings, indent=2))
    fabric.barrier()

    model = load_teacher(fabric, teacher, TeacherArgs(precision=precision).dtype(fabric.device))
    manifest = prepared.manifest
    splits = {}
    for split in ("train", "val"):
        dataset = open_split(data, split, manifest)
        num_blocks = len(dataset)
        shards = range(fabric.global_rank, -(-num_blocks // blocks_per_shard), fabric.world_size)
        todo = [s for s in shards if not shard_files(output, split, s)[0].is_file()]
        (output / split).mkdir(parents=True, exist_ok=True)
        bar = tqdm(todo, desc=f"{split} shards (rank {fabric.global_rank})", unit="shard", disable=fabric.global_rank != 0)
        tokens, t0 = 0, time.perf_counter()
        for shard in bar:
            indices = range(shard * blocks_per_shard, min((shard + 1) * blocks_per_shard, num_blocks))
            pieces = []
            for start in range(0, len(indices), batch_size):
                items = [dataset[i] for i in indices[start : start + batch_size]]
                windows = [torch.from_numpy(item["teacher_ids"].astype(np.int64)) for item in items]
                ids = nn.utils.rnn.pad_sequence(windows, batch_first=True).to(fabric.device)  # (B, M)
                lengths = torch.tensor([len(w) for w in windows], device=ids.device)
                valid = torch.arange(ids.shape[1], device=ids.device) < lengths[:, None]  # (B, M)
                with torch.no_grad():
                    loss = teacher_token_loss(model(ids), ids, valid).cpu()  # (B, M)
                pieces += [loss[row, 1 : len(w)] for row, w in enumerate(windows)]
                tokens += sum(len(w) for w in windows)
            losses_file, offsets_file = shard_files(output, split, shard)
            offsets = np.zeros(len(pieces) + 1, dtype=np.uint32)
            offsets[1:] = np.cumsum([len(p) for p in pieces])
            # offsets first: a shard counts as done once its losses file exists, and that appears last and whole.
            np.save(offsets_file, offsets)
            tmp = losses_file.with_suffix(".partial.npy")
            np.save(tmp, torch.cat(pieces).numpy().astype(np.float16) if pieces else np.zeros(0, np.float16))
            tmp.rename(losses_file)
            bar.set_postfix(tokens_per_sec=f"{tokens / (time.perf_counter() - t0):,.0f}")
        splits[split] = num_blocks
    fabric.barrier()

    if fabric.global_rank == 0:
        counts = {}
        for split, num_blocks in splits.items():
            files = sorted((output / split).glob("*.npy"))
            teacher_tokens = manifest["splits"][split]["teacher_tokens"]
            size = sum(f.stat().st_size for f in files)
            counts[split] = {"blocks": num_blocks, "teacher_tokens": teacher_tokens, "bytes": size,
                             "bytes_per_teacher_token": size / max(teacher_tokens, 1)}  # fmt: skip
        (output / ".settings.json").unlink()
        cache_manifest = {**settings, "splits": counts}
        (output / CACHE_MANIFEST).write_text(json.dumps(cache_manifest, indent=2))
        for split, c in counts.items():
            print(f"{split}: {c['blocks']:,} blocks, {c['teacher_tokens']:,} teacher tokens,"
                  f" {c['bytes_per_teacher_token']:.3f} bytes per teacher token on disk")  # fmt: skip
        print(f"Wrote {output / CACHE_MANIFEST}. Train with --teacher.cache {output}")
