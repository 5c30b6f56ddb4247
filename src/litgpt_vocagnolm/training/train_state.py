"""A checkpoint's train_state.json: what a run saves there (its counters, the data position, its number of processes,
a LitGPT data module's loader states), checked against what it can be before a resume trusts it, and read back: where
the data continues, whether a finished run has steps left to train."""

import json
from pathlib import Path
from typing import Any, NoReturn

from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.models.weights import UnreadableCheckpoint

TRAIN_STATE = "train_state.json"


def check_train_state(step_dir: Path, train_state: Any, hparams: Any) -> None:
    """Raises `UnreadableCheckpoint`, naming the field, unless every number of `step_dir`'s train state is one a run
    saves: its counters and data position whole and at least 0, a step at least one micro-batch (iter_num at least
    step_count), a world size of at least 1 with a loader state per rank where there are any, and the data position
    the blocks of its steps (step_count x the train.global_batch_size of its hyperparameters.yaml, `hparams`). Its
    checksum says only that the file is the one checksums.json records, and an edit can update both."""

    def refuse(field: str, should: str) -> NoReturn:
        value = train_state.get(field) if isinstance(train_state, dict) else train_state
        raise UnreadableCheckpoint(
            f"{step_dir / TRAIN_STATE}: {field} is {value!r}, where a run saves {should}: the file was edited or"
            " damaged. Resume from another checkpoint (--resume auto skips this one), or put back this one's file."
        )

    if not isinstance(train_state, dict):
        refuse("the train state", "a JSON object of counters")
    for field, least in (("iter_num", 0), ("step_count", 0), ("world_size", 1), ("position", 0)):
        value = train_state.get(field)
        whole = isinstance(value, int) and not isinstance(value, bool) and value >= least
        if not whole and (field != "position" or field in train_state):  # no position: saved before it was
            refuse(field, f"a whole number of at least {least}")
    steps = train_state["step_count"]
    if train_state["iter_num"] < steps:
        refuse("iter_num", f"at least step_count, {steps} (a step is one micro-batch or more)")
    loaders = train_state.get("train_dataloader")
    if loaders is not None and (not isinstance(loaders, list) or len(loaders) != train_state["world_size"]):
        refuse("train_dataloader", f"a list of one loader state per rank, {train_state['world_size']}")
    train = hparams.get("train") if isinstance(hparams, dict) else None
    batch = train.get("global_batch_size") if isinstance(train, dict) else None  # None: saved outside the recipe
    if "position" in train_state and isinstance(batch, int) and train_state["position"] != steps * batch:
        refuse("position", f"the blocks of its {steps} steps of {batch} (train.global_batch_size), {steps * batch}")


def final_step(final: Path) -> int:
    """The step a `final` checkpoint holds, by its train state; -1 where there is none, or none a run saves."""
    try:
        step = json.loads((final / TRAIN_STATE).read_text())["step_count"]
    except (OSError, ValueError, KeyError, TypeError):
        return -1
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else -1


def check_left_to_train(checkpoint_dir: Path, max_steps: int, tokens_per_step: int) -> None:
    """Refuses to resume a finished run on a budget of `max_steps` optimizer steps of `tokens_per_step` tokens that it
    has trained already: nothing would be trained, and its `final` saved again. The run is finished where the
    `final` beside `checkpoint_dir` (or `checkpoint_dir` itself) holds the step resumed from: `--resume auto` takes the
    `step-*` of that step, the same state, where a run saved one at its last step."""
    step = json.loads((checkpoint_dir / TRAIN_STATE).read_text())["step_count"]
    final = checkpoint_dir.parent / "final"
    if step >= max_steps and final_step(final) == step:
        raise InvalidArgument(
            f"{final} holds a finished run, trained to step {step}, and this run's budget"
            f" (--train.max_tokens, --train.max_steps) is {max_steps} steps of {tokens_per_step:,} tokens: nothing is"
            f" left to train. To train on, give it more steps (--train.max_tokens {(step + 1) * tokens_per_step} is one"
            f" more; --train.max_steps, if given, above {step}); to start afresh, choose another --out_dir."
        )


def data_position(checkpoint_dir: Path, global_batch_size: int, world_size: int, global_order: bool) -> int:
    """The data position to resume from: the blocks consumed over all ranks that `checkpoint_dir`'s train state saved
    (with `global_order`, VocAgnoData's `order.train_loader` continues there on any number of processes).

    A checkpoint saved before the position was (it holds only LitData's per-rank loader states) is refused with
    `global_order`, since those states name no place in the global order. Without it (one of LitGPT's own data
    modules, read by its own loader), the loader's saved per-rank states are what continues: refused on another
    number of processes, where they would repeat some blocks and skip others."""
    train_state = json.loads((checkpoint_dir / TRAIN_STATE).read_text())
    loaders, saved_world_size = train_state.get("train_dataloader"), train_state["world_size"]
    if global_order and "position" not in train_state:
        raise InvalidArgument(
            f"{checkpoint_dir} holds LitData's per-rank loader state, from before the data order was one global"
            " order: it names no place in that order. Resume it with the version of litgpt-vocagnolm that saved it,"
            " or start afresh in a new --out_dir."
        )
    if not global_order and loaders and loaders[0] is not None and saved_world_size != world_size:
        raise InvalidArgument(
            f"{checkpoint_dir} was saved on {saved_world_size} processes, this run has {world_size}: the data module's"
            " own loader keeps its position per process, so another number would train some blocks twice and skip"
            f" others. Resume on {saved_world_size} processes (--devices x --num_nodes), or train on --data"
            " VocAgnoData, whose order does not depend on the number of processes."
        )
    return train_state.get("position", train_state["step_count"] * global_batch_size)
