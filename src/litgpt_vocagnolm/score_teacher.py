"""`vocagnolm score-teacher`: run the frozen teacher once over prepared data and store its per-token losses."""

import json
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn as nn
from litgpt.utils import parse_devices
from tqdm import tqdm

from litgpt_vocagnolm.checkpoints import check_checkpoint_dir, checkpoint_fingerprint
from litgpt_vocagnolm.data import MANIFEST, VocAgnoData, open_split
from litgpt_vocagnolm.files import file_sha256, write_json
from litgpt_vocagnolm.gpt import load_model
from litgpt_vocagnolm.teacher import TeacherArgs, teacher_token_loss
from litgpt_vocagnolm.teacher_cache import CACHE_FORMAT, CACHE_MANIFEST, checksum_file, file_record, shard_files


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

    model = load_model(teacher, fabric, TeacherArgs(precision=precision).dtype(fabric.device))
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
                    loss = teacher_token_loss(model, ids, valid).cpu()  # (B, M)
                pieces += [loss[row, 1 : len(w)] for row, w in enumerate(windows)]
                tokens += sum(len(w) for w in windows)
            losses_file, offsets_file = shard_files(output, split, shard)
            offsets = np.zeros(len(pieces) + 1, dtype=np.uint32)
            offsets[1:] = np.cumsum([len(p) for p in pieces])
            # offsets and checksums first: a shard counts as done once its losses file exists, and that appears last
            # and whole.
            np.save(offsets_file, offsets)
            tmp = losses_file.with_suffix(".partial.npy")
            np.save(tmp, torch.cat(pieces).numpy().astype(np.float16) if pieces else np.zeros(0, np.float16))
            records = {f"{split}/{losses_file.name}": file_record(tmp)}
            records[f"{split}/{offsets_file.name}"] = file_record(offsets_file)
            write_json(checksum_file(output, split, shard), records)
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
        files = {}  # every shard's checksums, from the rank that scored it
        for split, num_blocks in splits.items():
            for shard in range(-(-num_blocks // blocks_per_shard)):
                files.update(json.loads(checksum_file(output, split, shard).read_text()))
        (output / ".settings.json").unlink()
        cache_manifest = {**settings, "splits": counts, "files": files}
        (output / CACHE_MANIFEST).write_text(json.dumps(cache_manifest, indent=2))
        for split, c in counts.items():
            print(f"{split}: {c['blocks']:,} blocks, {c['teacher_tokens']:,} teacher tokens,"
                  f" {c['bytes_per_teacher_token']:.3f} bytes per teacher token on disk")  # fmt: skip
        print(f"Wrote {output / CACHE_MANIFEST}. Train with --teacher.cache {output}")
