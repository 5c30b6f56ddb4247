"""How both models spread over devices: FSDP2 sharding (`parallelize`, the strategy's `parallelize_fn`) and activation
checkpointing. The training loop sees none of it (cf. torchtitan's parallelize.py beside its model)."""

from dataclasses import dataclass

import torch.nn as nn

from litgpt_vocagnolm.gpt import GPT

COMPILE_BACKEND = "inductor"  # what `compile_blocks` compiles with (a test picks the lighter "aot_eager")


@dataclass
class FSDPArgs:
    """Memory settings. On more than one device both models are sharded (FSDP2, `fully_shard`, per transformer
    block)."""

    activation_checkpointing: bool = False
    """Recompute each student block's activations in the backward pass (on any number of devices): less memory, about
    a third more compute."""


def parallelize(model: GPT, device_mesh) -> GPT:
    """FSDP2 for both models: `fully_shard` each transformer block, then the root (cf. litgpt/finetune/lora.py).

    FSDP2 keeps the root's parameters (embedding, final norm, head) gathered after forward, since training needs them
    again in backward. The frozen teacher has no backward: its root is resharded after each forward, or its embedding
    and head (2.2 GB in bf16 for a 152k vocabulary at width 3584) would stay whole on every device.
    """
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh["data_parallel"]
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    frozen = not any(p.requires_grad for p in model.parameters())
    fully_shard(model, mesh=mesh, reshard_after_forward=True if frozen else None)
    return model


def checkpoint_activations(model: GPT) -> None:
    """Wraps each transformer block so that backward recomputes its activations: only the blocks' inputs stay saved.
    For the student only: the frozen teacher keeps no activations. The checkpoint keys stay LitGPT's."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model.transformer.h = nn.ModuleList(checkpoint_wrapper(b, preserve_rng_state=False) for b in model.transformer.h)


def compile_blocks(model: GPT) -> None:
    """`torch.compile` each transformer block in place, as torchtitan compiles under FSDP2:
    FSDP's hooks and collectives stay between the compiled blocks, and every block of one shape runs the same
    compiled code. The run's shapes are fixed (the student's sequence, the data's padded teacher window), so each
    graph compiles once. `Module.compile` wraps nothing: the checkpoint keys stay LitGPT's."""
    for block in model.transformer.h:
        block.compile(backend=COMPILE_BACKEND, dynamic=False)
