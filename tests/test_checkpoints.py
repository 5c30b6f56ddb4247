"""Weight files: every path that loads one refuses a crafted pickle, and `--resume auto` skips damaged checkpoints."""

import json
import pickle
import re
import shutil
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import MISTRAL, QWEN, TINYLLAMA, make_checkpoint, tiny_config
from litgpt.args import TrainArgs

from litgpt_vocagnolm.data.prepared import VocAgnoData
from litgpt_vocagnolm.evaluation.evaluate import evaluate, load_model
from litgpt_vocagnolm.files import file_sha256
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.models import gpt
from litgpt_vocagnolm.models.weights import CHECKSUMS, UnreadableCheckpoint, read_weights
from litgpt_vocagnolm.training import checkpoints
from litgpt_vocagnolm.training.checkpoints import file_checksums, find_resume_checkpoint
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.score_teacher import score_teacher
from litgpt_vocagnolm.training.train_state import TRAIN_STATE


class Payload:
    """Unpickled without restriction, this creates `marker`: what a crafted lit_model.pth could do with os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def plant_payload(weights: Path, marker: Path) -> None:
    """Adds the payload to a real weight file, which otherwise still loads (the "model" key, as training saves)."""
    state_dict = torch.load(weights, weights_only=True)
    torch.save({"model": state_dict.get("model", state_dict), "payload": Payload(marker)}, weights)


@pytest.fixture
def crafted_checkpoint(tmp_path) -> tuple[Path, Path]:
    """A LitGPT checkpoint dir (TinyLlama's tokenizer) whose lit_model.pth carries the payload, and its marker."""
    checkpoint = make_checkpoint(tmp_path / "crafted", tiny_config("crafted", 32000, block_size=64), TINYLLAMA)
    marker = tmp_path / "payload-ran"
    plant_payload(checkpoint / "lit_model.pth", marker)
    return checkpoint, marker


def setup_args(tmp_path: Path, data: Path, **overrides) -> dict:
    args = dict(
        model_config=tiny_config("student", 32000, block_size=64),
        out_dir=tmp_path / "out",
        devices=1,
        data=VocAgnoData(path=data, num_workers=0),
        tokenizer_dir=TINYLLAMA,
        logger_name="csv",
        train=TrainArgs(
            global_batch_size=2,
            micro_batch_size=2,
            max_tokens=2 * 64,
            max_norm=1.0,
            max_seq_length=64,
            save_interval=None,
        ),
        guidance=GuidanceArgs(method="ce"),
    )
    return args | overrides


LOADING_PATHS = {
    "evaluate": lambda ckpt, tmp_path, data: evaluate(ckpt, tasks="gsm8k", limit=1, out_dir=tmp_path / "eval"),
    "evaluate's loader": lambda ckpt, tmp_path, data: load_model(ckpt, precision="32-true"),
    "teacher": lambda ckpt, tmp_path, data: gpt.load_model(ckpt, L.Fabric(accelerator="cpu", devices=1), torch.float32),
    "demo": lambda ckpt, tmp_path, data: gpt.load_model(ckpt),
    "score-teacher": lambda ckpt, tmp_path, data: score_teacher(data=data, teacher=ckpt, output=tmp_path / "cache"),
    "initial checkpoint": lambda ckpt, tmp_path, data: setup(**setup_args(tmp_path, data, initial_checkpoint_dir=ckpt)),
    "resume": lambda ckpt, tmp_path, data: setup(**setup_args(tmp_path, data, resume=ckpt / "lit_model.pth")),
}


@pytest.mark.parametrize("path", LOADING_PATHS)
def test_a_crafted_pickle_is_refused_on_every_loading_path(path, crafted_checkpoint, tmp_path, tinyllama_mistral_data):
    checkpoint, marker = crafted_checkpoint
    if path == "score-teacher":  # a teacher for the data's teacher tokenizer (Mistral's)
        checkpoint = make_checkpoint(tmp_path / "teacher", tiny_config("t", 32000), MISTRAL)
        plant_payload(checkpoint / "lit_model.pth", marker)
    with pytest.raises(UnreadableCheckpoint) as error:
        LOADING_PATHS[path](checkpoint, tmp_path, tinyllama_mistral_data)
    assert f"Refused to load {checkpoint / 'lit_model.pth'}" in str(error.value)
    assert "io.open" in str(error.value) or "builtins.open" in str(error.value)  # what the file tried to call
    assert not marker.exists()
    assert not any((tmp_path / name).exists() for name in ("out", "eval", "cache"))  # refused before any work


@pytest.mark.parametrize("damage", ["python tag", "unknown class"])
@pytest.mark.parametrize("path", ["evaluate", "score-teacher", "initial checkpoint"])
def test_a_damaged_model_config_is_refused_in_one_line_before_any_work(path, damage, tmp_path, tinyllama_mistral_data):
    """A model_config.yaml holding a `!!python/...` tag (refused by the safe loader: its payload never runs) or naming
    a class LitGPT lacks: one line naming the file, where the checkpoint enters, before any model or output."""
    tokenizer = MISTRAL if path == "score-teacher" else TINYLLAMA  # a teacher of the data's teacher tokenizer
    checkpoint = make_checkpoint(tmp_path / "ckpt", tiny_config("t", 32000, block_size=64), tokenizer)
    marker, config = tmp_path / "payload-ran", checkpoint / "model_config.yaml"
    if damage == "python tag":
        config.write_text(config.read_text() + f"extra: !!python/object/apply:os.system ['touch {marker}']\n")
        reason = "ConstructorError: could not determine a constructor for the tag 'tag:yaml.org,2002:python/object"
    else:
        config.write_text(config.read_text().replace("mlp_class_name: LLaMAMLP", "mlp_class_name: NoSuchMLP"))
        reason = "AttributeError: module 'litgpt.model' has no attribute 'NoSuchMLP'"
    with pytest.raises(UnreadableCheckpoint) as error:
        LOADING_PATHS[path](checkpoint, tmp_path, tinyllama_mistral_data)
    assert f"{config} is not a LitGPT model config ({reason}" in str(error.value)
    assert "\n" not in str(error.value) and "Use the model_config.yaml that came with the checkpoint" in str(
        error.value
    )
    assert not marker.exists()
    assert not any((tmp_path / name).exists() for name in ("out", "eval", "cache"))  # refused before any work


def test_evaluate_on_a_training_checkpoint_says_to_export_it(tmp_path, tinyllama_mistral_data):
    step = write_step(tmp_path / "out", 2)
    with pytest.raises(FileNotFoundError) as error:
        evaluate(step, tasks="gsm8k", limit=1, out_dir=tmp_path / "eval")
    assert str(error.value) == (
        f"checkpoint_dir {str(step)!r} is a training checkpoint (sharded, with the optimizer's state), not a LitGPT"
        f" checkpoint directory: export it first, `vocagnolm export {step} DIR`, and pass DIR."
    )
    assert not (tmp_path / "eval").exists()


def test_damaged_files_are_named(tmp_path):
    good = tmp_path / "good.pth"
    torch.save({"model": {"w": torch.randn(64, 64)}, "iter_num": 8}, good)
    assert read_weights(good)["iter_num"] == 8
    data = good.read_bytes()
    for name, content in (("truncated", data[: len(data) // 2]), ("zeroed", bytes(len(data))), ("empty", b"")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UnreadableCheckpoint, match=f"Cannot read {tmp_path / name}"):
            read_weights(tmp_path / name)


def write_step(out_dir: Path, step: int, content: str = "good") -> Path:
    """A sharded checkpoint directory as the recipe writes it (DCP shards and index, train state, hyperparameters,
    checksums): steps of 2 blocks."""
    path = out_dir / f"step-{step:08d}"
    dcp.save({"model": {"w": torch.full((4,), float(step))}}, checkpoint_id=path, no_dist=True)
    train_state = {"step_count": step, "iter_num": step, "world_size": 1, "position": 2 * step}
    (path / TRAIN_STATE).write_text(json.dumps(train_state))
    (path / "hyperparameters.yaml").write_text("train:\n  global_batch_size: 2\n")
    if content == "crafted":  # an index that runs code when unpickled, with checksums to match (as a forger would)
        with open(path / ".metadata", "wb") as f:
            pickle.dump(Payload(out_dir / "payload-ran"), f)
    (path / CHECKSUMS).write_text(json.dumps(file_checksums(path) | file_checksums(path, shards_of=0)))
    if content == "truncated":  # cut after its checksums were written
        shard = path / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
    return path


def test_resume_auto_skips_unreadable_checkpoints_newest_first(tmp_path, capsys):
    fabric = L.Fabric(accelerator="cpu", devices=1)
    write_step(tmp_path, 2)
    readable = write_step(tmp_path, 4)
    write_step(tmp_path, 6, "truncated")
    write_step(tmp_path, 8, "crafted")
    for resume in ("auto", True):
        assert find_resume_checkpoint(fabric, resume, tmp_path) == readable
        out = capsys.readouterr().out
        crafted, cut = tmp_path / "step-00000008", tmp_path / "step-00000006"
        assert f"Skipping {crafted}: Refused to load {crafted / '.metadata'}" in out
        assert f"Skipping {cut}: {cut / '__0_0.distcp'} does not match its checksum" in out
        assert "step-00000004" not in out and "step-00000002" not in out
    assert not (tmp_path / "payload-ran").exists()
    assert find_resume_checkpoint(fabric, False, tmp_path) is None


def test_resume_auto_starts_afresh_only_without_checkpoints_and_says_how_when_none_is_readable(tmp_path, capsys):
    """An empty out_dir is a first start; one whose only checkpoint is refused is not started afresh from step 0 (which
    would later replace it): the run stops, saying how to start afresh, the checkpoint kept."""
    fabric = L.Fabric(accelerator="cpu", devices=1)
    assert find_resume_checkpoint(fabric, "auto", tmp_path) is None  # an empty out_dir: a first start, said nothing
    assert capsys.readouterr().out == ""
    step = write_step(tmp_path, 2, "truncated")
    kept = {p.name: p.read_bytes() for p in step.iterdir()}
    with pytest.raises(UnreadableCheckpoint) as error:
        find_resume_checkpoint(fabric, "auto", tmp_path)
    assert str(error.value) == (
        f"--resume auto: no readable checkpoint in --out_dir {tmp_path} (1 unreadable, skipped), see the lines above."
        " To start afresh there, pass --resume false --overwrite true (it deletes them), or choose another --out_dir."
    )
    assert f"Skipping {step}: " in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in step.iterdir()} == kept
    with pytest.raises(FileNotFoundError, match="no readable checkpoint"):
        find_resume_checkpoint(fabric, True, tmp_path)


def test_resume_takes_a_finished_runs_final_where_it_is_the_latest_and_never_starts_afresh_over_it(tmp_path, capsys):
    """`final/` is resumed where no step checkpoint is later (a `step-*` of its step first: the same state); with no
    checkpoint readable, `auto` and `True` refuse rather than start afresh over the finished run."""
    fabric = L.Fabric(accelerator="cpu", devices=1)
    write_step(tmp_path, 4)
    final = write_step(tmp_path, 6).rename(tmp_path / "final")
    assert find_resume_checkpoint(fabric, "auto", tmp_path) == final
    write_step(tmp_path, 6)
    write_step(tmp_path, 8, "truncated")
    assert find_resume_checkpoint(fabric, True, tmp_path) == tmp_path / "step-00000006"
    shutil.rmtree(tmp_path / "step-00000006")
    assert find_resume_checkpoint(fabric, "auto", tmp_path) == final

    damaged = write_step(tmp_path / "damaged", 2, "truncated").rename(tmp_path / "damaged" / "final")
    for resume in ("auto", True):
        with pytest.raises(UnreadableCheckpoint, match=re.escape(f"and {damaged} holds a finished run: delete it")):
            find_resume_checkpoint(fabric, resume, tmp_path / "damaged")
    assert (damaged / TRAIN_STATE).is_file()


def _resume_on_two_ranks(fabric: L.Fabric, tmp_path: Path) -> None:
    rank = fabric.global_rank
    # A stale listing: rank 1's view of out_dir lacks the newest checkpoint, which rank 0's holds.
    stale = find_resume_checkpoint(fabric, "auto", tmp_path / f"listed-{rank}")
    # A damaged view: rank 1 can't read the newest checkpoint, which rank 0 reads.
    real_verify = checkpoints.verify_checkpoint

    def verify_checkpoint(path: Path, rank: int, world_size: int) -> None:
        if rank == 1 and path.name == "step-00000004":
            raise UnreadableCheckpoint(f"Cannot read {path}")
        real_verify(path, rank, world_size)

    with mock.patch.object(checkpoints, "verify_checkpoint", verify_checkpoint):
        damaged = find_resume_checkpoint(fabric, "auto", tmp_path / "shared")
    (tmp_path / f"chosen-{rank}").write_text(f"{stale.name} {damaged.name}")
    # Leave gloo's threads no work in flight when the spawned process exits: without it, the exit can abort
    # ("terminate called without an active exception") on a busy machine.
    fabric.barrier()
    torch.distributed.destroy_process_group()


def test_every_rank_resumes_from_the_same_checkpoint(tmp_path):
    """Where the ranks' views of a shared file system differ, they must still take one step, or they would train on
    from different ones: rank 0's list of checkpoints is tried, and one that any rank can't read is skipped."""
    write_step(tmp_path / "listed-0", 2)
    write_step(tmp_path / "listed-0", 4)
    write_step(tmp_path / "listed-1", 2)
    write_step(tmp_path / "shared", 2)
    write_step(tmp_path / "shared", 4)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp_fork")
    fabric.launch(_resume_on_two_ranks, tmp_path)
    chosen = [(tmp_path / f"chosen-{rank}").read_text() for rank in (0, 1)]
    assert chosen == ["step-00000004 step-00000002"] * 2


def test_score_teacher_refuses_a_teacher_vocabulary_smaller_than_its_tokenizer(tmp_path, tinyllama_qwen_data):
    teacher = make_checkpoint(tmp_path / "teacher", tiny_config("too-small", 32000), QWEN)  # Qwen: 151,665 tokens
    with pytest.raises(ValueError, match=r"tokenizer has 151665 tokens but the model only 32000 \(padded_vocab_size"):
        score_teacher(data=tinyllama_qwen_data, teacher=teacher, output=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_the_final_save_says_each_phase_and_a_disk_without_room_is_refused_before_any_write(tmp_path, monkeypatch):
    """The final save prints its size and free space, then a line per phase with its seconds; its estimate of the
    bytes is what lands on disk, lit_model.pth's checksum (hashed as it is written) is the file's, and the file holds
    the model. With less room than the estimate, it stops before writing anything, saying what it needs."""
    fabric = L.Fabric(accelerator="cpu", devices=1)
    model = gpt.GPT(tiny_config("student", 32000, n_layer=2, n_embd=64, block_size=64))
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, 32000, (1, 8))
    model(tokens, targets=tokens).sum().backward()
    optimizer.step()
    state = {"model": model, "optimizer": optimizer, "iter_num": 2, "step_count": 1, "position": 4}
    printed = []
    monkeypatch.setattr(fabric, "print", lambda line: printed.append(line))
    final = checkpoints.Checkpointer(fabric, state, tmp_path / "out", TINYLLAMA, hparams={}).save_final()

    assert printed[0].startswith(f"Saving checkpoint to {str(final)!r}: ")
    assert [line.split(" in ")[0] for line in printed[1:]] == [
        "  shards written",
        "  checksums and lit_model.pth",
        "  saved",
    ]
    assert all(line.endswith(" s") for line in printed[1:])
    weights = sum(p.numel() * 4 for p in model.parameters())  # float32
    shards = sum(p.stat().st_size for p in final.glob("*.distcp"))
    assert 3 * weights < shards < 3.01 * weights  # weights, exp_avg, exp_avg_sq, a step count each, their headers
    assert weights < (final / "lit_model.pth").stat().st_size < 1.01 * weights
    sums = json.loads((final / CHECKSUMS).read_text())
    assert sums["lit_model.pth"] == file_sha256(final / "lit_model.pth")
    saved = torch.load(final / "lit_model.pth", weights_only=True)
    assert (saved["iter_num"], saved["step_count"]) == (2, 1)
    assert all(torch.equal(saved["model"][name], tensor) for name, tensor in model.state_dict().items())

    needed = checkpoints.tensor_bytes(model.state_dict()) * 4  # weights and AdamW state, then lit_model.pth
    usage = checkpoints.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: usage._replace(free=needed - 1))
    refused = r"Saving .*full.final needs 0\.07 GB and the file system of .*full has 0\.07 GB free: make room there"
    with pytest.raises(OSError, match=refused):
        checkpoints.Checkpointer(fabric, state, tmp_path / "full", TINYLLAMA, hparams={}).save_final()
    assert not (tmp_path / "full").exists() or not any((tmp_path / "full").iterdir())


@pytest.mark.parametrize("option", ["overwrite", "resume"])
def test_a_checkpoint_that_links_out_of_out_dir_is_refused_and_nothing_is_deleted_through_it(
    tmp_path, tinyllama_mistral_data, option
):
    """`final` (for `--overwrite true`) or a `step-*` (for `--resume auto`) in `--out_dir` that links to another run's
    checkpoint: refused before any work, naming the link, and the checkpoint it links to is left whole."""
    elsewhere = write_step(tmp_path / "elsewhere", 2)
    kept = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    write_step(out_dir, 1)
    link = out_dir / ("final" if option == "overwrite" else elsewhere.name)
    link.symlink_to(elsewhere)
    args = {"overwrite": True} if option == "overwrite" else {"resume": "auto"}
    with pytest.raises(
        FileExistsError,
        match=re.escape(f"--out_dir {out_dir}: {link.name} is a link to {elsewhere}, where the run keeps a checkpoint")
        + r".* Remove it \(rm "
        + re.escape(f"{link}) or put a copy"),
    ):
        setup(**setup_args(tmp_path, tinyllama_mistral_data, **args))
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == kept
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(["step-00000001", link.name])


def test_resume_auto_refuses_a_finished_run_on_the_budget_it_trained(tmp_path, tinyllama_mistral_data):
    """A run that saved a step checkpoint at its last step, beside final/ (the same state): `--resume auto` with the
    same budget is refused in one line naming final/, which is kept; nothing is trained or saved again."""
    train = TrainArgs(
        global_batch_size=2, micro_batch_size=2, max_tokens=2 * 2 * 64, max_norm=1.0, max_seq_length=64, save_interval=1
    )
    setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train))
    out_dir = tmp_path / "out"
    saved = {p: p.stat().st_mtime_ns for p in out_dir.glob("*/checksums.json")}
    assert sorted(p.parent.name for p in saved) == ["final", "step-00000001", "step-00000002"]
    with pytest.raises(
        ValueError,
        match=re.escape(f"{out_dir / 'final'} holds a finished run, trained to step 2, and this run's budget")
        + r".* is 2 steps of 128 tokens: nothing is left to train\.",
    ):
        setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train, resume="auto"))
    assert {p: p.stat().st_mtime_ns for p in out_dir.glob("*/checksums.json")} == saved
