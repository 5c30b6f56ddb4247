"""LitGPT's `GPT`, able to return each target's loss instead of the logits: the student and the teacher both run it.

A 1.1B student at micro-batch 8 and sequence 2048 would hold (8, 2048, 32000) logits, 2.1 GB in float32, and a 7B
teacher (8, 1888, 152064), 4.6 GB in bf16 and 9.2 GB more once `bf16-mixed` returns module outputs in float32
(`vocagnolm plan` prints these sizes for a recipe). Given
`targets`, `forward` runs the transformer once and the head and the loss together over tiles of rows
(`cross_entropy.linear_cross_entropy`), so neither logits tensor ever exists whole, and what leaves the module
(where Fabric casts outputs to float32) is one float per token. Without `targets` it is LitGPT's `GPT` unchanged
(generation, the distillation baselines), and its checkpoints are LitGPT's.

The head and the loss must run inside `forward`: under FSDP2 the root's parameters (embedding, final norm, head) are
gathered only for the root module's forward and backward.
"""

import contextlib
import hashlib
import math
from pathlib import Path

import lightning as L
import litgpt.model
import torch
from lightning.fabric.strategies import DDPStrategy
from litgpt.config import Config
from litgpt.model import CausalSelfAttention, GroupedTopkRouter, LLaMAMLP, RMSNorm
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from litgpt_vocagnolm.loss.cross_entropy import linear_cross_entropy
from litgpt_vocagnolm.models.weights import load_weights


class GPT(litgpt.model.GPT):
    def forward(
        self,
        idx: Tensor,
        input_pos: Tensor | None = None,
        input_pos_maxp1: int | None = None,
        *,
        targets: Tensor | None = None,
    ) -> Tensor:
        """LitGPT's forward, (B, T, V) logits, or with `targets` (B, T) (-100: nothing to predict) the (B, T) float32
        cross-entropy of each target, the head (its bias and its logits' soft cap, where the config has them) computed a
        tile of rows at a time (forward and backward). LitGPT's
        `lm_head_chunk_size`, which returns a list of logit chunks, is left out: the per-token loss tiles the head."""
        if targets is None:
            return super().forward(idx, input_pos, input_pos_maxp1)
        head = self.lm_head
        softcap = self.config.final_logit_softcapping
        return linear_cross_entropy(self.hidden_states(idx), head.weight, targets, bias=head.bias, softcap=softcap)

    def hidden_states(self, idx: Tensor) -> Tensor:
        """(B, T, n_embd) after the final norm: `litgpt.model.GPT.forward` up to its head, without a KV cache.

        Copied from litgpt/model.py (0.5.13), whose forward applies the head in the same call.
        """
        T = idx.size(1)
        if self.max_seq_length < T:
            raise ValueError(f"Cannot forward sequence of length {T}, max seq length is only {self.max_seq_length}.")
        cos, sin = self.cos[:T].unsqueeze(0), self.sin[:T].unsqueeze(0)  # (1, T, rope_n_elem)
        x = self.transformer.wte(idx)  # (B, T, n_embd)
        if self.config.scale_embeddings:
            x = x * torch.tensor(self.config.n_embd**0.5, dtype=x.dtype)
        for block_idx, block in enumerate(self.transformer.h):
            if self.config.rope_indices is not None:
                indices = self.config.rope_indices[block_idx]
                x = block(x, cos[..., indices], sin[..., indices], None, None, None)
            else:
                x = block(x, cos, sin, None, None, None)  # no mask: causal
        return self.transformer.ln_f(x)


def new_model(fabric: L.Fabric, config: Config, tie_embeddings: bool, model_class: type = GPT) -> nn.Module:
    """A student with no weights yet, as `litgpt pretrain` builds one: under Fabric's `init_module` (on the meta device
    under FSDP), the embedding tied to the head if asked. Not set up: the caller wraps it (activation checkpointing,
    compile) and sets it up first, then draws its weights (`initialize_weights`) or loads them. `model_class` is
    LitGPT's own GPT where a caller times LitGPT's step."""
    with fabric.init_module(empty_init=True):
        model = model_class(config)
    if tie_embeddings:
        model.transformer.wte.weight = model.lm_head.weight
    return model


def initialize_weights(model: nn.Module, seed: int) -> None:
    """Draws the weights of a set-up `model` (sharded by FSDP2 or whole) as LitGPT draws a new model's, from `seed` and
    each parameter's name alone: the same weights on 1 or N processes, under any sharding or wrapping.

    LitGPT's GPT-NeoX initialisation (litgpt/pretrain.py 0.5.13 `initialize_weights`): Linear and Embedding weights
    normal with std sqrt(2 / 5 / n_embd), the output projection (`proj`) of attention and of LLaMA's MLP
    1 / sqrt(n_embd) / n_layer, biases 0, norm weights 1; a grouped router's weight (`GroupedTopkRouter`, a linear map
    that is no `nn.Linear`, which LitGPT's rules leave undrawn) as a Linear's. Its rules are copied rather than called,
    as it draws from the global generator on each rank's shard, so the values depended on the number of processes.
    Here every tensor is drawn whole on the CPU (one at a time: at most the embedding, 262 MB for TinyLlama) from a
    generator seeded by (seed, its name), and each rank keeps its shard, as torchtitan's seed checkpoint gives every
    layout one start.
    """
    model = getattr(model, "module", model)  # Fabric's wrapper
    config = model.config
    projections = {id(module.proj) for module in model.modules() if isinstance(module, (LLaMAMLP, CausalSelfAttention))}
    drawn = set()  # a tied weight is drawn once
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in drawn:
                continue
            drawn.add(id(param))
            key = canonical_name(f"{module_name}.{name}")
            value = torch.zeros(param.shape)  # biases
            if isinstance(module, (nn.Linear, nn.Embedding, GroupedTopkRouter)) and name == "weight":
                std = 1 / math.sqrt(config.n_embd) / config.n_layer if id(module) in projections else None
                std = std or math.sqrt(2.0 / 5 / config.n_embd)
                value.normal_(0.0, std, generator=torch.Generator().manual_seed(name_seed(seed, key)))
            elif name == "weight" and isinstance(module, (RMSNorm, nn.LayerNorm)):
                value.fill_(1.0)
            elif name != "bias":
                raise NotImplementedError(f"No initialisation for {key} ({type(module).__name__})")
            with torch.no_grad():
                if isinstance(param, DTensor):  # this rank's shard of the whole tensor, no communication
                    shard = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
                    param.to_local().copy_(shard.to_local())
                else:
                    param.copy_(value)


def canonical_name(name: str) -> str:
    """A parameter's name as LitGPT's checkpoint keys spell it, whatever wraps its modules (`torch.compile`,
    activation checkpointing)."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name.removeprefix(".")


def name_seed(seed: int, name: str) -> int:
    """A 63-bit seed from a run's seed and a parameter's name (sha256: the same on every machine and version)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1


def frozen_model(
    config: Config, fabric: L.Fabric | None = None, dtype: torch.dtype | None = None, empty_init: bool = True
) -> GPT:
    """A frozen `GPT` of `config` (`requires_grad=False`, eval mode, marked `frozen` for `distributed.parallelize`),
    not set up: built in `dtype` (default: torch's), under `fabric`'s `init_module` when given, its weights left for a
    checkpoint to fill (`empty_init`) or drawn at random as `GPT.__init__` draws them (`empty_init=False`: a teacher
    measured without its checkpoint). A float32 copy of a 7B teacher, cast afterwards, would take 28 GB for a moment
    (on the meta device under FSDP, where it costs nothing either way)."""
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype or default_dtype)
    try:
        with fabric.init_module(empty_init=empty_init) if fabric else contextlib.nullcontext():
            model = GPT(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.frozen = True  # what `distributed.parallelize` reads: placed as a teacher, never trained
    return model.requires_grad_(False).eval()


def load_model(checkpoint_dir: Path, fabric: L.Fabric | None = None, dtype: torch.dtype | None = None) -> GPT:
    """A LitGPT checkpoint directory's model, frozen (`frozen_model`, in `dtype`): the teacher, `vocagnolm
    evaluate`'s model, the demo's students and teachers.

    With `fabric`, built under its strategy and set up by it: sharded like the student under FSDP, whole on every
    rank under DDP (which refuses a module without gradients); without, a plain module on the CPU.
    """
    model = frozen_model(Config.from_file(checkpoint_dir / "model_config.yaml"), fabric, dtype)
    if fabric is not None and isinstance(fabric.strategy, DDPStrategy):
        model.to(fabric.device)  # data-parallel scoring: every rank holds the whole model
    elif fabric is not None:
        model = fabric.setup_module(model)  # not setup: no optimizer
    load_weights(model, checkpoint_dir / "lit_model.pth")
    return model
