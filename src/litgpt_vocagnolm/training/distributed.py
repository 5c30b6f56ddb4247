"""How both models spread over devices: FSDP2 sharding (`parallelize`, the strategy's `parallelize_fn`), mixed
precision and activation checkpointing. The training loop sees none of it (cf. torchtitan's parallelize.py beside its
model), but for the one reduction of its logged metrics over the ranks (`mean_over_ranks`)."""

import functools
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import lightning as L
import torch
import torch.nn as nn
from lightning.fabric.strategies import ModelParallelStrategy

from litgpt_vocagnolm.errors import FolderInUse, UserError
from litgpt_vocagnolm.files import hold_folder
from litgpt_vocagnolm.models.gpt import GPT

COMPILE_BACKEND = "inductor"  # what `compile_blocks` compiles with (a test picks the lighter "aot_eager")


@dataclass
class FSDPArgs:
    """Where each model lives on more than one device, and memory settings. Both models are sharded per transformer
    block with FSDP2 (`fully_shard`); `vocagnolm plan` prints each layout's memory and traffic per GPU."""

    teacher: Literal["replicate", "node", "all"] = "all"
    """The frozen teacher: "replicate" holds it whole on every GPU (no traffic, its whole size in memory); "node"
    shards it over the GPUs of a node and replicates it across nodes (its gathers stay on the node's links); "all"
    shards it over every GPU (least memory, its gathers cross the network)."""
    student: Literal["full", "hybrid"] = "full"
    """The student: "full" shards it over every GPU; "hybrid" (HSDP) shards it within a node and replicates it across
    nodes (gathers on the node's links, one all-reduce of gradients across nodes per optimizer step)."""
    activation_checkpointing: bool = False
    """Recompute each student block's activations in the backward pass (on any number of devices): less memory, about
    a third more compute."""


def parallelize(
    model: GPT, device_mesh, *, fsdp: FSDPArgs, num_nodes: int, param_dtype: torch.dtype | None = None
) -> GPT:
    """FSDP2 for both models as `fsdp` places them: `fully_shard` each transformer block, then the root (cf.
    litgpt/finetune/lora.py). `device_mesh`: the strategy's (data_parallel, tensor_parallel) mesh; `num_nodes`:
    how its devices group into nodes, for the (replicate, shard) mesh of "node" and "hybrid".

    The student (the model not marked `frozen`) with `param_dtype` (bf16) gathers its parameters in that dtype and
    reduces its gradients in float32 (`MixedPrecisionPolicy`): its shards, and so the AdamW state, stay float32. FSDP2
    keeps the student's root (embedding, final norm, head) gathered after forward, since backward needs it again. The
    frozen teacher, built in its own dtype (bf16), is gathered as it is and has no backward: its root is resharded
    after each forward, or its embedding and head (2.2 GB in bf16 for a 152k vocabulary at width 3584) would stay
    whole on every device.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    frozen = getattr(model, "frozen", False)  # the teacher, marked by `gpt.frozen_model`
    placement = fsdp.teacher if frozen else fsdp.student
    if placement == "replicate":
        return model  # the strategy materialises it whole on each device
    mesh = device_mesh["data_parallel"]
    if placement in ("node", "hybrid"):
        mesh = init_device_mesh(
            mesh.device_type, (num_nodes, mesh.size() // num_nodes), mesh_dim_names=("replicate", "shard")
        )
        if frozen:  # sharded within the node only: nothing to reduce across nodes
            mesh = mesh["shard"]
    policy = MixedPrecisionPolicy(param_dtype=None if frozen else param_dtype, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    # Explicit booleans, as torch 2.7 requires (it rejects None); False is what torch >= 2.8's default does for a root.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=frozen)
    return model


def fabric_strategy(
    devices: int, num_nodes: int, precision: str, fsdp: FSDPArgs
) -> tuple[ModelParallelStrategy | str, str]:
    """Fabric's strategy for `devices` x `num_nodes` processes (FSDP2 on more than one), and the precision Fabric's
    plugin then takes."""
    if devices * num_nodes > 1:
        # FSDP2 does bf16 itself (`MixedPrecisionPolicy`: bf16 gathers and compute, float32 shards, gradients reduced
        # in float32), as torchtitan does: Fabric's plugin stays at float32, or `bf16-true` would cast the shards (and
        # so the AdamW state) to bf16 and `bf16-mixed` would autocast parameters that are already bf16.
        param_dtype = torch.bfloat16 if precision in ("bf16-mixed", "bf16-true") else None
        precision = "32-true" if param_dtype else precision
        strategy = ModelParallelStrategy(
            parallelize_fn=functools.partial(parallelize, fsdp=fsdp, num_nodes=num_nodes, param_dtype=param_dtype),
            data_parallel_size=devices * num_nodes,
            tensor_parallel_size=1,
        )
    else:
        strategy = "auto"
    return strategy, precision


def fused_optimizer(device: torch.device) -> bool:
    """Whether AdamW runs its fused kernel (one kernel for all parameters, in place): on CUDA devices, as LitGPT
    runs it; on a CPU its for-loop form."""
    return device.type == "cuda"


def checkpoint_activations(model: GPT) -> None:
    """Wraps each transformer block so that backward recomputes its activations: only the blocks' inputs stay saved.
    For the student only: the frozen teacher keeps no activations. The checkpoint keys stay LitGPT's."""
    # torch publishes its module wrapper nowhere else; LitGPT's LoRA recipe and Fabric's FSDP strategy import it from
    # here too. It keeps the state dict's keys LitGPT's, which wrapping `torch.utils.checkpoint` by hand would not.
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model.transformer.h = nn.ModuleList(checkpoint_wrapper(b, preserve_rng_state=False) for b in model.transformer.h)


def compile_blocks(model: GPT) -> None:
    """`torch.compile` each transformer block in place, as torchtitan compiles under FSDP2:
    FSDP's hooks and collectives stay between the compiled blocks, and every block of one shape runs the same
    compiled code. The run's shapes are fixed (the student's sequence, the data's padded teacher window), so each
    graph compiles once. `Module.compile` wraps nothing: the checkpoint keys stay LitGPT's.

    The head and its loss (`cross_entropy.linear_cross_entropy`) stay eager, here and wherever a model is compiled:
    compiled with the model, Inductor unrolls the tile loop and fuses every tile's gather into one kernel whose index
    (rows x vocabulary: 8 x 2,049 x 152,064 = 2.5e9 for a Qwen2.5 teacher) overflows int32 although each buffer fits
    (an illegal memory access on an H100), and it keeps every tile's logits alive at once, undoing the tiling."""
    for block in model.transformer.h:
        block.compile(backend=COMPILE_BACKEND, dynamic=False)


def mean_over_ranks(fabric: L.Fabric, metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """A step's metrics averaged over the micro-batches of every rank that computed them, as the logged `loss` is
    reduced: each (2,), a rank's sum and count (`step.Step.metrics`), one all-reduce of them stacked, on log steps only
    (every rank has the same names). A metric no micro-batch computed (no mapped token in the whole step, say) is left
    out: nothing to report, not a number."""
    if not metrics:
        return {}
    sums = fabric.all_reduce(torch.stack(list(metrics.values())).float(), reduce_op="sum").tolist()
    return {name: total / count for name, (total, count) in zip(metrics, sums) if count > 0}


@contextmanager
def hold_run_folder(fabric: L.Fabric, folder: Path, command: str) -> Iterator[None]:
    """`files.hold_folder` for a run of one or many processes: rank 0 holds `folder` for the run (its process lives as
    long as the run: when any rank dies, the launcher ends them all), and its refusal reaches every rank in one
    broadcast, so that no rank waits for ever on a rank 0 that stopped."""
    with ExitStack() as stack:
        refusal = None
        if fabric.global_rank == 0:
            try:
                stack.enter_context(hold_folder(folder, command))
            except UserError as error:
                refusal = str(error)
        refusal = fabric.broadcast(refusal)
        if refusal is not None:
            raise FolderInUse(refusal)
        yield
