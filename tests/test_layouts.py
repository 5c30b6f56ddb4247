"""Where each model lives (`FSDPArgs.teacher`, `FSDPArgs.student`) and FSDP2's bf16, against one process.

The recipe's `setup` runs in gloo processes started here, each told its node and local rank as a cluster would
(NODE_RANK, LOCAL_RANK): four processes are two nodes of two devices. Every process continues from the same student
checkpoint, and the global data order (order.py) gives W ranks with one micro-batch each the blocks that one process
reads as W accumulated micro-batches, so each optimizer step sees the same data and the loss curves must agree.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import ranks
import torch
import torch.nn as nn
from conftest import CachedSplit, make_checkpoint, tiny_config
from litgpt.args import EvalArgs, TrainArgs
from test_recipe import metrics
from torch.optim.optimizer import register_optimizer_step_post_hook

from litgpt_vocagnolm.data.prepared import VocAgnoData
from litgpt_vocagnolm.planning.memory import StepShape, collective_bytes, estimate_memory, parameters, traffic_per_step
from litgpt_vocagnolm.training.distributed import FSDPArgs
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.teacher import TeacherArgs

STEPS = 3
STUDENT = tiny_config("student", 512, n_layer=2, n_embd=64, block_size=128)  # `cached_split`'s vocabulary and blocks


def run_args(tmp_path: Path, split: CachedSplit, student: Path | None, world: int, **overrides) -> dict:
    """`setup`'s arguments for STEPS optimizer steps of `world` micro-batches of one block each of `split`, the student
    continued from the checkpoint `student` (None: drawn from the seed), guided by the split's teacher online."""
    args = dict(
        model_config=STUDENT,
        out_dir=tmp_path / "out",
        precision="32-true",
        initial_checkpoint_dir=student,
        data=VocAgnoData(path=split.data, num_workers=0),
        train=TrainArgs(
            save_interval=None,
            log_interval=1,
            global_batch_size=world,
            micro_batch_size=1,
            lr_warmup_steps=1,
            max_tokens=STEPS * world * 128,
            max_seq_length=128,
            max_norm=1.0,
            min_lr=1e-3,
        ),
        eval=EvalArgs(interval=100, max_iters=1, final_validation=False),
        optimizer={"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-2}},
        tokenizer_dir=split.student,
        logger_name="csv",
        seed=7,
        teacher=TeacherArgs(checkpoint_dir=split.teacher),
        devices=1,
    )
    return {**args, **overrides}


def worker(rank: int, runs: list[dict], record: Path | None = None) -> None:
    """One process of a `len(runs)`-run job (`ranks.start`): `setup(**run)` for each. With `record`: the dtype of every
    linear layer's weight as its forward sees it (FSDP2 has gathered it then) and of the optimizer's state and
    parameters after each step, into `record/rank-R.json`."""
    seen = {"student weights": set(), "teacher weights": set(), "parameters": set(), "AdamW state": set()}
    if record is not None:

        def forward_pre_hook(module: nn.Module, args) -> None:
            if isinstance(module, nn.Linear):
                seen["student weights" if module.weight.requires_grad else "teacher weights"].add(
                    str(module.weight.dtype)
                )

        def step_post_hook(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    seen["parameters"].add(str(p.dtype))
                    seen["AdamW state"] |= {str(v.dtype) for k, v in optimizer.state[p].items() if k != "step"}

        nn.modules.module.register_module_forward_pre_hook(forward_pre_hook)
        register_optimizer_step_post_hook(step_post_hook)
    for run in runs:
        setup(**run)
    if record is not None:
        (record / f"rank-{rank}.json").write_text(json.dumps({k: sorted(v) for k, v in seen.items()}))


def losses(out_dir: Path) -> torch.Tensor:
    return torch.tensor([row["loss"] for row in metrics(out_dir)])


@pytest.fixture(scope="module")
def student(tmp_path_factory, cached_split) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "student", STUDENT, cached_split.student, seed=3)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, cached_split, student) -> torch.Tensor:
    """The losses of one process accumulating four micro-batches: what every layout of two nodes of two gives."""
    reference = run_args(tmp_path_factory.mktemp("one-process"), cached_split, student, world=4)
    setup(**reference)
    found = losses(reference["out_dir"])
    assert len(found) == STEPS and found[-1] < found[0]  # it trains
    return found


def assert_layouts_match_one_process(root: Path, split: CachedSplit, student: Path, layouts, expected) -> None:
    """Each (teacher, student) layout of `layouts` on four processes as two nodes of two, in one job (each rank runs
    them one after the other): the losses `expected`."""
    runs = [
        run_args(
            root / f"{t}-{s}", split, student, world=4, devices=2, num_nodes=2, fsdp=FSDPArgs(teacher=t, student=s)
        )
        for t, s in layouts
    ]
    ranks.start(worker, (runs,), processes=4, devices=2)
    for (t, s), run in zip(layouts, runs):
        torch.testing.assert_close(
            losses(run["out_dir"]), expected, rtol=1e-4, atol=1e-4, msg=f"teacher {t}, student {s}"
        )


@pytest.mark.slow
def test_the_paper_layout_and_a_teacher_sharded_within_each_node_on_two_nodes_of_two(
    tmp_path, cached_split, student, one_process
):
    """The 2-D mesh: the paper recipes' layout (teacher whole on every rank, student hybrid: sharded within a node,
    replicated across) and a teacher sharded within each node under a fully sharded student, on four processes as two
    nodes of two, train to the losses of one process accumulating four micro-batches. With the bf16 test's teacher
    sharded over all, every teacher placement and each student sharding runs (the two are set up apart,
    `distributed.parallelize`); the other pairs run in `make test-long`."""
    layouts = [("replicate", "hybrid"), ("node", "full")]
    assert_layouts_match_one_process(tmp_path, cached_split, student, layouts, one_process)


@pytest.mark.long
def test_every_other_layout_on_two_nodes_of_two_matches_one_process(tmp_path, cached_split, student, one_process):
    """The layouts the test above leaves out, the four other pairs of teacher placement and student sharding."""
    layouts = [("replicate", "full"), ("node", "hybrid"), ("all", "full"), ("all", "hybrid")]
    assert_layouts_match_one_process(tmp_path, cached_split, student, layouts, one_process)


@pytest.mark.slow
def test_bf16_gathers_bf16_keeps_float32_shards_and_matches_one_process(tmp_path, cached_split, student):
    """Under bf16-mixed on two processes FSDP2 gathers the student's weights in bf16 for its forward, keeps its
    parameters and AdamW state in float32; the bf16 teacher, sharded over all ranks, is gathered in bf16; the losses
    are one bf16-mixed process's within bf16's precision."""
    bf16 = dict(precision="bf16-mixed", teacher=TeacherArgs(checkpoint_dir=cached_split.teacher, precision="bf16-true"))
    reference = run_args(tmp_path / "one", cached_split, student, world=2, **bf16)
    setup(**reference)
    run = run_args(tmp_path / "two", cached_split, student, world=2, devices=2, fsdp=FSDPArgs(teacher="all"), **bf16)
    ranks.start(worker, ([run], tmp_path), processes=2)
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen == {
            "student weights": ["torch.bfloat16"],
            "teacher weights": ["torch.bfloat16"],
            "parameters": ["torch.float32"],
            "AdamW state": ["torch.float32"],
        }
    torch.testing.assert_close(losses(run["out_dir"]), losses(tmp_path / "one" / "out"), rtol=2e-2, atol=2e-2)


def ring_bytes(nbytes: float, group: int, devices_per_node: int) -> tuple[float, float]:
    """A ring all-gather hop by hop: device i sends group - 1 chunks to device i + 1, over the network when the next
    device is on another node. The average per device (within, across)."""
    within = across = 0.0
    for i in range(group):
        crosses = i // devices_per_node != ((i + 1) % group) // devices_per_node
        sent = (group - 1) * nbytes / group
        within, across = (within, across + sent) if crosses else (within + sent, across)
    return within / group, across / group


@pytest.mark.parametrize("group, nodes", [(1, 1), (8, 1), (32, 4), (4, 4), (4, 2)])
def test_collective_bytes_match_a_ring_hop_by_hop(group, nodes):
    torch.testing.assert_close(collective_bytes(1e9, group, nodes), ring_bytes(1e9, group, group // nodes))


def test_traffic_per_step_of_each_layout():
    """Known figures: 4 nodes of 8 GPUs, 2 micro-batches per step, parameters P (student) and Q (teacher)."""
    student, teacher = tiny_config("s", 32000, n_layer=2, n_embd=64), tiny_config("t", 32000, n_layer=1, n_embd=64)
    P, Q, root = parameters(student), parameters(teacher), 2 * 32000 * 64 + 64  # root: embedding, head, final norm

    def traffic(teacher_layout: str, student_layout: str) -> tuple[float, float]:
        layout = FSDPArgs(teacher=teacher_layout, student=student_layout)
        return traffic_per_step(student, [teacher], layout, devices=8, num_nodes=4, accumulation=2)

    gathers = 2 * 2 * (2 * P - root)  # two micro-batches, bf16, forward (all) and backward (the blocks)
    full = collective_bytes(gathers + 4 * P, 32, 4)  # and the float32 reduce-scatter, once
    torch.testing.assert_close(traffic("replicate", "full"), full)
    within, across = collective_bytes(gathers + 4 * P, 8, 1)
    hybrid = (within, across + 2 * 4 * P / 8 * 3 / 4)  # each node's shard all-reduced across the 4 nodes
    torch.testing.assert_close(traffic("replicate", "hybrid"), hybrid)
    node = collective_bytes(2 * 2 * Q, 8, 1)  # the bf16 teacher gathered within the node, once per micro-batch
    torch.testing.assert_close(traffic("node", "hybrid"), (hybrid[0] + node[0], hybrid[1]))
    everywhere = collective_bytes(2 * 2 * Q, 32, 4)
    torch.testing.assert_close(traffic("all", "full"), (full[0] + everywhere[0], full[1] + everywhere[1]))
    assert traffic("replicate", "hybrid")[1] < traffic("replicate", "full")[1] < traffic("all", "full")[1]


def test_accumulating_holds_the_whole_float32_gradients():
    """With two micro-batches per step the head's backward holds all P float32 gradients (FSDP2 skips the
    reduce-scatter while accumulating), with one only the head's and a block's."""
    student = tiny_config("s", 32000, n_layer=2, n_embd=64)
    P = parameters(student)
    shape = StepShape(micro_batch=1, seq_len=64, window=64, world_size=4, workspace=False)
    one, two = (estimate_memory(student, [], dataclasses.replace(shape, accumulation=a)) for a in (1, 2))
    assert one.moment == two.moment == "the head's backward"
    assert two.components["student gradients"] == 4 * (P + 64 * 64)
    assert one.components["student gradients"] < 4 * P
