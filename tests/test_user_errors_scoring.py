"""User errors of `vocagnolm score-teacher`: every argument checked before anything is written, each message naming
this command's own option, sizes capped to what the data can use, a damaged cache never taken for a finished one."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from conftest import MISTRAL, make_checkpoint, tiny_config

from litgpt_vocagnolm.errors import InvalidArgument, UserError
from litgpt_vocagnolm.training.score_teacher import score_teacher


@pytest.mark.parametrize(
    "options, message",
    [
        ({"devices": 0}, "--devices must be 'auto' or a positive number of devices per node, got 0."),
        ({"devices": -2}, "--devices must be 'auto' or a positive number of devices per node, got -2."),
        ({"precision": "fp7"}, "--precision must be one of bf16-true, 16-true, 32-true, got 'fp7'."),
        ({"output": "a-file/cache"}, "--output {tmp_path}/a-file/cache: {tmp_path}/a-file is a file, not a folder."),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path, tinyllama_mistral_data, mistral_teacher, options, message
):
    (tmp_path / "a-file").write_text("mine")
    output = tmp_path / options.pop("output", "cache")
    with pytest.raises(UserError) as error:
        score_teacher(data=tinyllama_mistral_data, teacher=mistral_teacher, output=output, **options)
    assert str(error.value).startswith(message.format(tmp_path=tmp_path))
    assert not (tmp_path / "cache").exists()  # no .settings.json to refuse the corrected command with


def test_a_data_file_is_not_taken_for_an_output_to_prepare(tmp_path, mistral_teacher, gsm8k_sample):
    with pytest.raises(InvalidArgument) as error:
        score_teacher(data=gsm8k_sample, teacher=mistral_teacher, output=tmp_path / "cache")
    assert f"--input {gsm8k_sample} --output DIR" in str(error.value)
    assert f"--output {gsm8k_sample}" not in str(error.value)


def test_a_teacher_shorter_than_the_windows_is_refused_before_loading_it(tmp_path, tinyllama_mistral_data):
    manifest = json.loads((tinyllama_mistral_data / "manifest.json").read_text())
    short = manifest["teacher_max_length"] - 1
    teacher = make_checkpoint(tmp_path / "short", tiny_config("t", 32000, block_size=short), MISTRAL)
    with pytest.raises(
        InvalidArgument,
        match=f"has a block size of {short} tokens, shorter than the teacher windows of up to {short + 1} tokens",
    ):
        score_teacher(data=tinyllama_mistral_data, teacher=teacher, output=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tinyllama_mistral_data, mistral_teacher) -> tuple[Path, str]:
    """A cache scored with a --batch_size far above the data's 200-odd blocks, and what the command printed."""
    output, printed = tmp_path_factory.mktemp("scored") / "cache", io.StringIO()
    with contextlib.redirect_stdout(printed):
        score_teacher(
            data=tinyllama_mistral_data,
            teacher=mistral_teacher,
            output=output,
            num_workers=0,
            batch_size=100_000,
            blocks_per_shard=64,
        )
    return output, printed.getvalue()


def test_a_batch_larger_than_the_data_is_capped_with_a_note(scored):
    assert "--batch_size 100000 capped at 64: the most blocks a forward can take here (a shard holds 64" in scored[1]


def test_a_truncated_shard_is_not_taken_for_a_finished_cache(
    tmp_path, scored, tinyllama_mistral_data, mistral_teacher, capsys
):
    output = shutil.copytree(scored[0], tmp_path / "cache")
    score_teacher(data=tinyllama_mistral_data, teacher=mistral_teacher, output=output, blocks_per_shard=64)
    assert "nothing to do" in capsys.readouterr().out
    shard = output / "train" / "000000.losses.npy"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(InvalidArgument, match=f"{shard} has .* bytes; .* records .* delete {output} and run the same"):
        score_teacher(data=tinyllama_mistral_data, teacher=mistral_teacher, output=output, blocks_per_shard=64)
    assert "nothing to do" not in capsys.readouterr().out
