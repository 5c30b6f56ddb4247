"""What a newcomer meets first: a plan made before the data exists, a misspelt recipe, how soon a command answers."""

import pytest
from conftest import RECIPES

PAPER_RECIPE = RECIPES / "tinyllama-qwen2.5-math-7b-instruct.yaml"


def notes(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("Note: no prepared data")]


@pytest.mark.parametrize("made", [False, True], ids=["no folder", "an empty folder"])
def test_plan_says_when_the_data_is_missing_and_what_the_window_is_then(tmp_path, capsys, made):
    """Planned before `prepare` has run: the window is max_seq_length + 1 (2048 + 1), and one line says so, naming the
    path and what is missing there."""
    from litgpt_vocagnolm.planning.plan import plan

    data = tmp_path / "owm"
    if made:
        data.mkdir()
    plan(["--config", str(PAPER_RECIPE), "--data.path", str(data)])
    printed = capsys.readouterr().out
    missing = "no manifest.json" if made else "no such folder"
    assert notes(printed) == [
        f"Note: no prepared data at {data} ({missing}): the teacher window of 2049 tokens is max_seq_length + 1, a"
        " guess, not the one `vocagnolm prepare` records (its teacher_max_length, padded to a multiple of 64). Give"
        " --data.path of the prepared data or --window, or plan again once the data is prepared."
    ]
    assert "teacher window 2049," in printed


def test_plan_says_nothing_of_the_data_when_the_window_is_given_or_read_or_unused(capsys, tinyllama_qwen_data):
    """No note when --window says the window, when the data is prepared (its window is read), or when the recipe runs
    no teacher (`ce`: no window to guess)."""
    from litgpt_vocagnolm.planning.plan import plan

    for args in (
        ["--config", str(PAPER_RECIPE), "--window", "1888"],
        ["--config", str(PAPER_RECIPE), "--data.path", str(tinyllama_qwen_data), "--train.max_seq_length", "64"],
        ["--config", str(RECIPES / "demo-cpu.yaml"), "--data.path", "nosuch"],
    ):
        plan(args)
        assert notes(capsys.readouterr().out) == [], args
