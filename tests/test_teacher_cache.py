"""The teacher loss cache: `vocagnolm score-teacher` once, then train without the teacher."""

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import BIN, MISTRAL, ROOT, make_checkpoint, tiny_config, typed_here
from litgpt.config import Config
from litgpt.model import GPT
from test_recipe import metrics, pretrain_here, recipe_config

from litgpt_vocagnolm.data.prepared import iter_blocks
from litgpt_vocagnolm.data.teacher_cache import TeacherLossCache, check_cache, file_record
from litgpt_vocagnolm.errors import InvalidArgument


def score(data: Path, teacher: Path, output: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        str(BIN / "vocagnolm"),
        "score-teacher",
        "--data",
        str(data),
        "--teacher",
        str(teacher),
        "--output",
        str(output),
        "--batch_size",
        "4",
        *args,
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def score_here(data: Path, teacher: Path, output: Path, *args: str) -> subprocess.CompletedProcess:
    """`score` in this process (`typed_here`), with no loader workers."""
    command = ["score-teacher", "--data", data, "--teacher", teacher, "--output", output, "--num_workers", "0", *args]
    out = typed_here(BIN / "vocagnolm", *command, "--batch_size", "4")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


@pytest.fixture
def cache(mistral_cache) -> Path:
    """The session's cache of the Mistral teacher (conftest.py), which these tests only read."""
    return mistral_cache[0]


def test_cache_holds_the_teachers_losses_in_16_bit(cache, tinyllama_mistral_data, mistral_teacher):
    manifest = json.loads((cache / "manifest.json").read_text())
    for split in ("train", "val"):
        c = manifest["splits"][split]
        shards = -(-c["blocks"] // 64)
        # 2 bytes per teacher token, less each window's first; 4 bytes of offsets per block; 2 npy headers per shard.
        assert c["bytes"] <= 2 * c["teacher_tokens"] + 4 * (c["blocks"] + shards) + 2 * 128 * shards
    model = GPT(Config.from_file(mistral_teacher / "model_config.yaml"))
    model.load_state_dict(torch.load(mistral_teacher / "lit_model.pth", weights_only=True))
    model.eval()
    cached = TeacherLossCache(cache, "val")
    for index, block in enumerate(iter_blocks(tinyllama_mistral_data, "val")):
        if index >= 6:
            break
        ids = torch.from_numpy(block["teacher_ids"])
        with torch.no_grad():  # the reference: LitGPT's model, its whole logits, PyTorch's cross-entropy
            online = F.cross_entropy(model(ids[None])[0, :-1], ids[1:], reduction="none")
        online = F.pad(online, (1, 0), value=float("nan"))
        stored = torch.from_numpy(cached[index])
        assert torch.isnan(stored[0]) and not torch.isnan(stored[1:]).any()
        # float16 keeps 11 significant bits: a relative error of at most 2**-11 per loss.
        torch.testing.assert_close(stored, online, rtol=2**-11, atol=0, equal_nan=True)


def test_rerun_is_a_no_op_and_a_killed_run_resumes(tmp_path, cached_split):
    """Over the 38 blocks of `cached_split` in shards of 1 block (the killed run has 38 shards to write, more than a
    2-layer teacher of 512 words writes in the time a busy machine takes to see its first): a finished cache scored
    again is left as it is; a scoring killed (kill -9) after its first shard is finished by the same command (in this
    process), shard for shard and checksum for checksum the cache of a scoring never interrupted."""
    data, shard = cached_split.data, ["--blocks_per_shard", "1"]
    finished = tmp_path / "finished"
    score_here(data, cached_split.teacher, finished, *shard)
    written = {p: p.stat().st_mtime_ns for p in finished.rglob("*")}
    again = score_here(data, cached_split.teacher, finished, *shard)
    assert "nothing to do" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in finished.rglob("*")} == written

    output = tmp_path / "killed"
    command = [
        str(BIN / "vocagnolm"),
        "score-teacher",
        "--data",
        str(data),
        "--teacher",
        str(cached_split.teacher),
        "--output",
        str(output),
        *shard,
        "--batch_size",
        "1",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = output / "train" / "000000.losses.npy"
    deadline = time.time() + 300
    while not first.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert first.exists() and not (output / "manifest.json").exists()
    done_before = {p.name: p.stat().st_mtime_ns for p in (output / "train").glob("*.losses.npy")}

    resumed = score_here(data, cached_split.teacher, output, *shard)
    assert "Train with --teacher.cache" in resumed.stdout
    for name, mtime in done_before.items():  # finished shards were not scored again
        assert (output / "train" / name).stat().st_mtime_ns == mtime
    for path in sorted((finished / "train").glob("*.npy")) + sorted((finished / "val").glob("*.npy")):
        np.testing.assert_array_equal(np.load(output / path.parent.name / path.name), np.load(path))
    # The checksums of the shards scored before the kill made it into the manifest.
    checksums = [json.loads((path / "manifest.json").read_text())["files"] for path in (output, finished)]
    assert checksums[0] == checksums[1]


def test_cache_mismatch_fails_at_startup(tmp_path, cache, tinyllama_mistral_data, tinyllama_qwen_data):
    with pytest.raises(ValueError, match="scored on other data"):
        check_cache(cache, tinyllama_qwen_data / "manifest.json", None)
    other = make_checkpoint(tmp_path / "other-teacher", tiny_config("t", 32000, n_layer=2), MISTRAL)
    with pytest.raises(ValueError, match="whose config and weights differ"):
        check_cache(cache, tinyllama_mistral_data / "manifest.json", other)
    with pytest.raises(FileNotFoundError, match="score-teacher"):
        check_cache(tmp_path, tinyllama_mistral_data / "manifest.json", None)


def test_a_damaged_shard_fails_naming_itself(tmp_path, cache, tinyllama_mistral_data):
    data_manifest = tinyllama_mistral_data / "manifest.json"
    manifest = json.loads((cache / "manifest.json").read_text())
    assert set(manifest["files"]) == {f"{p.parent.name}/{p.name}" for p in cache.glob("*/*.npy")}
    for damage in ("zeroed", "truncated", "truncated, in a cache scored before checksums"):
        copy = tmp_path / damage.replace(" ", "_").replace(",", "")
        shutil.copytree(cache, copy)
        if "before checksums" in damage:
            (copy / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if k != "files"}))
        losses = copy / "val" / "000000.losses.npy"
        size = losses.stat().st_size
        losses.write_bytes(bytes(size) if damage == "zeroed" else losses.read_bytes()[: size // 2])
        if damage == "truncated":  # found at start-up, by its size
            cut = rf"{losses} has {size // 2:,} bytes; .* records {size:,}.*score again"
            with pytest.raises(ValueError, match=cut):
                check_cache(copy, data_manifest, None)
        else:
            check_cache(copy, data_manifest, None)
        with pytest.raises(ValueError, match=rf"{losses}.*score again"):  # found when a process first opens the shard
            TeacherLossCache(copy, "val")[1]


@pytest.mark.slow
def test_training_with_the_cache_follows_the_online_teacher(tmp_path, cache, tinyllama_mistral_data, mistral_teacher):
    """Same seed, same data order: the cached run must select the same share and follow the same loss curve.

    The cache rounds each teacher loss to float16 (relative error <= 2**-11, about 0.005 at a loss of 10), which can
    only move a token across the top-k threshold when its excess loss lies within that distance of it. A token that
    crosses changes the step's loss, a mean over the ~100 selected tokens (40% of a step's 4 x 64), by the difference
    of its cross-entropy and the one it displaces over that count: 0.012 (1.1e-3 relative) for one step here.
    The teachers' losses agree to 1e-3 and the first step's loss to 2e-3 (two swaps in a step), not bit for bit. From
    the second step on the two students' weights differ by what those swaps trained, and the curves drift apart slowly:
    within 1% over the 12 steps (0.34% at most when last measured, since each document's EOS maps to the teacher's).
    Both run in this process.
    """
    curves = {}
    for name, teacher in (("online", {"checkpoint_dir": str(mistral_teacher)}), ("cached", {"cache": str(cache)})):
        (tmp_path / name).mkdir()
        pretrain_here(recipe_config(tmp_path / name, tinyllama_mistral_data, None, teacher=teacher))
        curves[name] = metrics(tmp_path / name / "out")
    assert len(curves["online"]) == len(curves["cached"]) == 12
    assert curves["cached"][0]["loss"] == pytest.approx(curves["online"][0]["loss"], rel=2e-3)
    for online, cached in zip(curves["online"], curves["cached"]):
        assert cached["selected_fraction"] == pytest.approx(online["selected_fraction"], abs=1e-6)
        assert cached["loss"] == pytest.approx(online["loss"], rel=1e-2)
        assert cached["teacher_loss"] == pytest.approx(online["teacher_loss"], rel=1e-3)


def test_a_cache_of_another_format_fails_naming_both_versions_and_the_fix(tmp_path, cache, tinyllama_mistral_data):
    from litgpt_vocagnolm.data.prepared import MANIFEST
    from litgpt_vocagnolm.data.teacher_cache import CACHE_FORMAT, CACHE_MANIFEST, check_cache

    old = tmp_path / "old"
    shutil.copytree(cache, old)
    manifest = json.loads((old / CACHE_MANIFEST).read_text())
    (old / CACHE_MANIFEST).write_text(json.dumps({**manifest, "format": "vocagnolm-teacher-loss/0"}))
    with pytest.raises(ValueError) as error:
        check_cache(old, tinyllama_mistral_data / MANIFEST, None)
    message = str(error.value)
    assert "'vocagnolm-teacher-loss/0'" in message and repr(CACHE_FORMAT) in message
    assert f"vocagnolm score-teacher --data {tinyllama_mistral_data}" in message


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link"])
def test_a_cache_is_read_only_inside_its_folder(tmp_path, cache, tinyllama_mistral_data, how):
    copy = Path(shutil.copytree(cache, tmp_path / "cache"))
    manifest = json.loads((copy / "manifest.json").read_text())
    shard = copy / "train" / "000000.losses.npy"
    outside = Path(shutil.copy(shard, tmp_path / "x.npy"))
    name = {"dotdot": "../x.npy", "absolute": str(outside), "link": "train/000000.losses.npy"}[how]
    if how == "link":
        shard.unlink()
        shard.symlink_to(outside)
    else:
        manifest["files"][name] = file_record(outside)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidArgument) as error:
        check_cache(copy, tinyllama_mistral_data / "manifest.json", None)
    assert str(error.value).startswith(
        f"{copy / 'manifest.json'} lists {name!r}, which is not a file inside {copy}: a teacher loss cache is read"
        " only from its own folder."
    )
