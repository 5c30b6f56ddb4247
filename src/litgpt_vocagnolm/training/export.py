"""`vocagnolm export`: a training checkpoint (sharded) as a LitGPT checkpoint directory, written whole or not at all."""

import json
import os
import shutil
from pathlib import Path

from litgpt.utils import copy_config_files
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from litgpt_vocagnolm.errors import PathTaken, WriteFailed, check_writable, failed_writes
from litgpt_vocagnolm.files import file_sha256, hold_folder
from litgpt_vocagnolm.models.weights import CHECKSUMS, MODEL_FILES, SafeReader
from litgpt_vocagnolm.training.checkpoints import check_resume_path, export_lit_model, verify_checkpoint
from litgpt_vocagnolm.training.train_state import TRAIN_STATE


def export(checkpoint_dir: Path, out_dir: Path) -> None:
    """Write a training checkpoint (``out_dir/step-*`` of the recipe, saved sharded) as a LitGPT checkpoint directory:
    one lit_model.pth with the student's weights (read tensor by tensor: the optimizer state is never read), its
    model_config.yaml, hyperparameters.yaml, tokenizer files and checksums.json (of the weights and config), for
    ``litgpt generate``, ``litgpt convert_from_litgpt`` and ``vocagnolm evaluate``.

    Arguments:
        checkpoint_dir: The sharded checkpoint: a ``step-*`` (or ``final``) directory the recipe saved.
        out_dir: Where to write the LitGPT checkpoint directory (created; a file it would write that is there already
            is refused, naming it). The files are written in its `.partial-export/` and moved out of it once all are
            whole: an export killed while it writes leaves nothing that the same command, run again, would refuse.
    """
    check_resume_path(checkpoint_dir, "checkpoint_dir")  # a sharded checkpoint, its index safe to read
    check_writable(out_dir, "--out_dir")
    # What it writes (the config and tokenizer files that `copy_config_files` finds beside the shards): none replaced.
    copied = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    written = [*MODEL_FILES, "hyperparameters.yaml", CHECKSUMS, *(n for n in copied if (checkpoint_dir / n).exists())]
    with hold_folder(out_dir, "vocagnolm export"):
        taken = [name for name in written if (out_dir / name).exists() or (out_dir / name).is_symlink()]
        if taken:
            raise PathTaken(
                f"--out_dir {out_dir} holds {', '.join(taken)}, which the export would replace: choose another"
                " --out_dir, or delete them first."
            )
        verify_checkpoint(checkpoint_dir)  # complete, every file matching its checksum
        partial = out_dir / ".partial-export"
        remove(partial)  # what an export killed while writing left
        partial.mkdir()
        try:
            with failed_writes(out_dir, model_bytes(checkpoint_dir), "run the same command again"):
                step = write_export(checkpoint_dir, partial)
        except WriteFailed:
            remove(partial)  # a rerun finds the folder as this one did
            raise
        for name in written:
            os.replace(partial / name, out_dir / name)
        partial.rmdir()
    print(f"Wrote {out_dir / 'lit_model.pth'} (step {step}): `litgpt generate {out_dir}` reads it.")


def remove(path: Path) -> None:
    """Whatever is at `path`, removed: a folder and what it holds, a file, a link (never what it links to)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def model_bytes(checkpoint_dir: Path) -> int:
    """The bytes of the student's weights in a sharded checkpoint, by its index."""
    metadata = SafeReader(checkpoint_dir).read_metadata().state_dict_metadata
    return sum(
        meta.size.numel() * meta.properties.dtype.itemsize
        for key, meta in metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    )


def write_export(checkpoint_dir: Path, out_dir: Path) -> int:
    """`export`'s files: lit_model.pth, the config and tokenizer files, hyperparameters.yaml, checksums.json. Returns
    the checkpoint's step."""
    train_state = json.loads((checkpoint_dir / TRAIN_STATE).read_text())
    counters = {name: train_state[name] for name in ("iter_num", "step_count")}
    sums = {"lit_model.pth": export_lit_model(checkpoint_dir, out_dir / "lit_model.pth", extra=counters)}
    copy_config_files(checkpoint_dir, out_dir)  # model_config.yaml and the tokenizer files
    shutil.copy(checkpoint_dir / "hyperparameters.yaml", out_dir)
    # What `vocagnolm evaluate` checks the weights against before it uses them, as a training checkpoint's final/.
    sums |= {name: file_sha256(out_dir / name) for name in MODEL_FILES if name not in sums}
    (out_dir / CHECKSUMS).write_text(json.dumps(sums, indent=1))
    return counters["step_count"]
