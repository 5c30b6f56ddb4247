"""The per-GPU memory of a recipe's step, as `vocagnolm plan` estimates it, and each layout's traffic between GPUs.

The estimate adds up what one device holds during a step of the recipe (FSDP2 placed as `FSDPArgs` says, bf16
student with float32 parameters, gradients and AdamW state, bf16 frozen teacher, logits a tile of rows at a time):
  student parameters, gradients, AdamW state   float32, sharded over all devices or a node's ("hybrid")
  teacher parameters                           bf16, whole ("replicate"), sharded over a node's devices or all
  gathered parameters                          FSDP2 gathers one block at a time in bf16 (and prefetches the next) and
                                               keeps the student's root (embedding, final norm, head) gathered
  gather buffers                               the all-gather's output, before it is copied into the parameters
  accumulated gradients                        with several micro-batches per step, the whole float32 gradients until
                                               the last one reduces them
  CUDA/NCCL workspace                          context, NCCL buffers, cuBLAS workspace (`CUDA_WORKSPACE_BYTES`)
  student activations                          what backward needs, at the micro-batch: bytes per token per block
                                               measured on one real block (below; compiled blocks hold
                                               `COMPILED_ACTIVATION_SHARE` of it), and in the square of the length
                                               the soft-capped attention's scores and the sliding windows' masks that
                                               LitGPT builds (`attention_square_bytes`); or the block inputs only
                                               with activation checkpointing, plus one block recomputed
  bf16 weight copies                           autocast casts each float32 matrix to bf16 for its product and keeps
                                               the copy for backward
  logit tiles                                  `cross_entropy.linear_cross_entropy`: a tile of logits in bf16
                                               and float32 and the previous tile's float32 ones, and the head's
                                               gradient
  teacher activations                          the teacher's forward keeps one block's intermediates at a time
Parameters are counted on a meta-device copy of LitGPT's model (`parameter_counts`): every family's norms, biases,
experts and routers as LitGPT builds them. Per-token activation bytes are measured, not guessed: one block of the model
at its real width runs on the CPU at two short lengths under bf16 autocast, with saved-tensor hooks (student) or the
profiler's allocation events (teacher). The peak is the largest of these moments: the teacher's forward, the head's
backward (all activations saved, the logits of a tile and the head's gradient being made), with activation checkpointing
the first block recomputed in backward, and the optimizer step (all gradients). benchmarks/bench_scale.py measures the
peak of each kind of step next to this estimate, and `vocagnolm plan --measure true` the recipe's own steps on the local
device (`measure`).
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from litgpt.config import Config
from litgpt.model import LLaMAMLP, LLaMAMoE

from litgpt_vocagnolm.loss.cross_entropy import TILE_ELEMENTS
from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.training.distributed import FSDPArgs

GB = 1e9


@dataclass
class MemoryEstimate:
    """Bytes on one device, by component, and the peak step's total."""

    components: dict[str, float]
    """What the device holds at the step's peak, by name."""
    total: float
    moment: str
    """When the peak happens."""


def parameters(config: Config) -> int:
    """All parameters of the model (LitGPT's GPT: untied embedding and head), every family's norms, biases, experts
    and routers included (`parameter_counts`)."""
    return parameter_counts(config)[0]


def matmul_parameters(config: Config) -> int:
    """Parameters of the matrix products a token goes through, head included, embedding table excluded: 2 x this is
    the forward's FLOPs per token (attention's T^2 work aside). Of a mixture of experts (`LLaMAMoE`), the router and the
    `n_expert_per_token` of its `n_expert` experts that each token is routed to."""
    return parameter_counts(config)[1]


def root_parameters(config: Config) -> int:
    """The parameters outside the blocks (embedding, final norm, head and its bias): the root module's, which FSDP2
    keeps gathered through a step."""
    return parameter_counts(config)[2]


def parameter_counts(config: Config) -> tuple[int, int, int]:
    """(all, in matrix products per token, outside the blocks) parameters of `config`'s LitGPT GPT, counted on the
    meta device (no memory) rather than by formula, so that every family's layout is counted as LitGPT builds it."""
    return _parameter_counts(json.dumps(dataclasses.asdict(config), sort_keys=True))


@functools.lru_cache(maxsize=16)
def _parameter_counts(config_json: str) -> tuple[int, int, int]:
    config = Config(**json.loads(config_json))  # (a Config is not hashable: cached by its JSON)
    with torch.device("meta"):  # the cost: ~12 s for Qwen3-235B's 12,032 experts, a fraction of one for most models
        model = GPT(config)
    total = sum(p.numel() for p in model.parameters())
    matmul = sum(p.numel() for p in model.parameters() if p.dim() == 2) - model.transformer.wte.weight.numel()
    for moe in (module for module in model.modules() if isinstance(module, LLaMAMoE)):
        experts = sum(p.numel() for p in moe.experts.parameters() if p.dim() == 2)
        matmul -= experts - experts * config.n_expert_per_token // config.n_expert  # the experts a token meets
    return total, matmul, total - sum(p.numel() for p in model.transformer.h.parameters())


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Standard error silenced at the file-descriptor level: some torch builds' profiler logs its start and stop
    there from C++, which a Python redirect does not catch."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_peak_bytes(run: Callable[[], Any], during: Sequence[str | None] = (None,)) -> list[int]:
    """The most bytes of CPU tensors alive at once while `run()` runs, beyond those alive before it: PyTorch's
    profiler's allocation events summed in time order (tensors, as `torch.cuda.max_memory_allocated` counts them).
    One peak per name in `during`: None for the whole run, a name for the last `torch.profiler.record_function(name)`
    range that `run` opens (all bytes `run` allocated before the range and still holds count)."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    events = profiler.profiler.kineto_results.events()
    timeline = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    peaks = []
    for name in during:
        start, end = -math.inf, math.inf
        if name is not None:
            window = [e for e in events if e.name() == name][-1]  # the last, if `run` opens the range more than once
            start, end = window.start_ns(), window.end_ns()
        live = peak = 0
        for time_ns, nbytes in timeline:
            if time_ns >= start and peak == 0:
                peak = live  # what is alive as the range opens
            live += nbytes
            if start <= time_ns <= end:
                peak = max(peak, live)
        peaks.append(peak)
    return peaks


def block_bytes_per_token(config: Config, train: bool) -> tuple[float, float]:
    """(bytes per token, bytes per block at any length) of one transformer block of `config` under bf16 autocast.

    train: what a block saves for backward (float32 parameters, as in `bf16-mixed`): the bf16 weight copies are the
    constant, the activations the per-token part. Not train: the peak of intermediates during a bf16 block's forward
    under no_grad (the teacher's), beyond its input.

    The block is measured with its attention as SDPA runs it (causal, no mask): what LitGPT's sliding windows and
    attention soft-capping hold beyond, in the square of the length, is `attention_square_bytes`. A mixture of experts
    is measured with `n_expert_per_token` experts (each token meets as many as in the model; the model's n_expert
    would all be built at full width here), the bf16 copies of the others' weights added; a grouped router needs its
    groups' experts, and keeps them. Its first block is a mixture even where the model's first layers are dense
    (`first_k_dense_replace`).
    """
    experts = config.n_expert if config.n_expert_groups else min(config.n_expert, config.n_expert_per_token)
    one_block = dataclasses.replace(
        config,
        n_layer=1,
        vocab_size=64,  # no vocabulary needed
        padded_vocab_size=64,
        sliding_window_size=None,
        attention_logit_softcapping=None,
        n_expert=experts,
        first_k_dense_replace=None,
    )
    per_token, per_block = _block_bytes_per_token(json.dumps(dataclasses.asdict(one_block), sort_keys=True), train)
    if train and experts < config.n_expert:  # autocast keeps a bf16 copy of every expert's weights for backward
        with torch.device("meta"):
            expert = sum(p.numel() for p in LLaMAMLP(config, config.moe_intermediate_size).parameters())
        per_block += 2 * (config.n_expert - experts) * expert
    return per_token, per_block


@functools.lru_cache(maxsize=16)
def _block_bytes_per_token(config_json: str, train: bool, lengths: tuple[int, int] = (32, 64)) -> tuple[float, float]:
    config = Config(**json.loads(config_json))  # (a Config is not hashable: cached by its JSON)
    torch.manual_seed(0)
    if config.n_expert_groups:  # a grouped router picks experts by the weights' values: random ones, as trained
        model = GPT(config)
    else:  # what a block holds does not depend on its values: zeros, not seconds of random numbers at a 27B's width
        with torch.device("meta"):
            model = GPT(config)
        model = model.to_empty(device="cpu")
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                tensor.zero_()
    block = model.transformer.h[0]
    if not train:
        block = block.to(torch.bfloat16).requires_grad_(False)
    parameters = {p.untyped_storage().data_ptr() for p in block.parameters()}
    measured = []
    for T in lengths:
        x = torch.randn(1, T, model.config.n_embd, dtype=torch.float32 if train else torch.bfloat16)
        cos, sin = model.cos[:T].unsqueeze(0), model.sin[:T].unsqueeze(0)  # (1, T, rope_n_elem)
        if model.config.rope_indices is not None:  # the first block's rope, as `gpt.GPT.hidden_states` slices it
            cos, sin = cos[..., model.config.rope_indices[0]], sin[..., model.config.rope_indices[0]]
        if train:
            saved = {}

            def pack(tensor: torch.Tensor) -> torch.Tensor:
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in parameters:
                    saved[storage.data_ptr()] = storage.nbytes()
                return tensor

            with (
                torch.autocast("cpu", dtype=torch.bfloat16),
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            ):
                block(x.requires_grad_(), cos, sin)
            measured.append(sum(saved.values()))
        else:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                measured += cpu_peak_bytes(lambda: block(x, cos, sin))
    per_token = (measured[1] - measured[0]) / (lengths[1] - lengths[0])
    return per_token, measured[0] - per_token * lengths[0]


# LitGPT's attention with logit soft-capping (Gemma-2's `attention_logit_softcapping`) runs eager, not SDPA: it makes
# the (B, n_head, T, T) scores. Per score, backward keeps the tanh's bf16 output, the float32 softmax and its bf16 copy
# (8 bytes); at the forward's peak 10 bytes are alive. A sliding-window layer (without soft-capping) builds a
# (1, 1, T, T) mask in bf16 at every forward (2 bytes per pair of positions, per micro-batch), which SDPA keeps for
# backward; a soft-capped layer builds one causal mask of that size and drops it after the scores. Measured with
# saved-tensor hooks and `cpu_peak_bytes` on one Gemma-2 block at 64-256 tokens, micro-batch 1 and 2: exactly these on
# top of the same block run by SDPA, less SDPA's own output and log-sum-exp, which backward keeps there
# (tests/test_plan.py checks each kind of layer).
SOFTCAPPED_SCORE_BYTES = {"saved": 8, "forward": 10}
MASK_BYTES = 2


def attention_square_bytes(config: Config, micro_batch: int, seq_len: int, train: bool) -> list[float]:
    """Bytes of each layer of `config` in the square of the sequence, at `micro_batch` x `seq_len` tokens, beyond
    `block_bytes_per_token`'s: what backward keeps (train), or what the layer's forward holds at its peak (not train),
    for LitGPT's soft-capped attention and sliding-window masks (`SOFTCAPPED_SCORE_BYTES`, `MASK_BYTES`)."""
    square = seq_len * seq_len
    sliding = config.sliding_window_indices if config.sliding_window_size is not None else [0] * config.n_layer
    if config.attention_logit_softcapping is not None:
        scores = micro_batch * config.n_head * square * SOFTCAPPED_SCORE_BYTES["saved" if train else "forward"]
        return [scores + (0 if train else MASK_BYTES * square)] * config.n_layer
    return [MASK_BYTES * square * window for window in sliding]


# Bytes per logit of one tile of `cross_entropy.linear_cross_entropy`'s forward at its peak: the tile's bf16
# product and its float32 copy, and the previous tile's float32 logits, alive until the new ones replace them. Measured
# with `cpu_peak_bytes` on bf16 (512, 256) x (32000, 256) in tiles of 128 and 256 rows: 10.0 forward, 8.0 backward
# beyond the gradients, 10.0 backward under a final soft cap (its tanh, kept for the cap's derivative, is one more
# float32 tile); a head bias adds nothing per logit. With a single tile there is no previous one: 6 (7 in a capped
# backward).
TILE_BYTES_PER_LOGIT, SINGLE_TILE_BYTES_PER_LOGIT, SINGLE_CAPPED_TILE_BACKWARD_BYTES_PER_LOGIT = 10, 6, 7
# What a compiled block (`distributed.compile_blocks`, inductor) saves for backward per token, as a share of what an
# eager one saves (`block_bytes_per_token`). From the H100 rows of docs/performance.md (`python
# benchmarks/bench_mfu.py --device cuda --compile --max_micro_batch 8`: TinyLlama-1.1B with Qwen2.5-Math-7B online,
# sequence 2048, one GPU): per sequence of micro-batch, the online step's peak grows (57.49 - 34.42) / 7 = 3.296 GB
# compiled and (71.89 - 36.21) / 7 = 5.097 GB eager, and at micro-batch 1 the two differ by 1.79 GB, the slopes'
# difference (1.80 GB): compiling changes what each token holds, not what the step holds besides. 1.80 GB is 36.1% of
# the 4.99 GB that the eager blocks save per sequence (22 blocks x 110,728 bytes per token x 2048 tokens), so a
# compiled block keeps 0.639. The compiled cached rows agree once the teacher the script kept resident (15.23 GB) is
# taken out: 29.23 and 42.26 GB measured at micro-batch 4 and 8, 30.27 and 43.17 GB planned with this share.
COMPILED_ACTIVATION_SHARE = 0.64
# Allocated beside the tensors a step holds on a GPU: the CUDA context (~0.5 GB on an H100, outside torch's count),
# NCCL's channel buffers (NCCL_BUFFSIZE, 4 MiB, per channel and peer: ~0.25 GB at 32 channels over two peers) and
# cuBLAS's workspace (PyTorch's default CUBLAS_WORKSPACE_CONFIG :4096:8, 32 MiB per stream). Rounded up to 1 GB.
CUDA_WORKSPACE_BYTES = 1e9
# Per-GPU link bandwidth, one direction, of the paper's cluster (H100 SXM nodes): NVLink 4 within a node (900 GB/s
# both directions, NVIDIA's H100 datasheet) and one 400 Gb/s InfiniBand NDR adapter per GPU across nodes.
NODE_LINK_BYTES_PER_S = 450e9
NETWORK_BYTES_PER_S = 50e9


def head_tile_bytes(vocab: int, rows: int, capped_backward: bool = False) -> float:
    """Transient bytes of `cross_entropy.linear_cross_entropy` over `rows` rows, a tile at a time
    (`TILE_BYTES_PER_LOGIT`), forward and backward; `capped_backward`: a backward through a final soft cap."""
    tile_rows = max(1, TILE_ELEMENTS // vocab)
    single = SINGLE_CAPPED_TILE_BACKWARD_BYTES_PER_LOGIT if capped_backward else SINGLE_TILE_BYTES_PER_LOGIT
    return min(rows, tile_rows) * vocab * (TILE_BYTES_PER_LOGIT if rows > tile_rows else single)


def shard_group(placement: str, world_size: int, num_nodes: int) -> int:
    """Devices a model's parameters are sharded over: "replicate" 1, "node" and "hybrid" a node's, "full"/"all" all."""
    return {"replicate": 1, "node": world_size // num_nodes, "hybrid": world_size // num_nodes}.get(
        placement, world_size
    )


@dataclass(frozen=True)
class StepShape:
    """One step of the recipe as `estimate_memory` counts it: its sizes, where it runs and how."""

    micro_batch: int
    """Sequences per device per micro-batch (B)."""
    seq_len: int
    """Student tokens per sequence (T, max_seq_length)."""
    window: int
    """Teacher tokens per sequence (M, the longest teacher window in a batch)."""
    train: bool = True
    """False for `score-teacher`: the teacher alone, no student."""
    activation_checkpointing: bool = False
    """The student keeps only its blocks' inputs."""
    world_size: int = 1
    """Devices of the job (FSDP2), `num_nodes` nodes of them."""
    num_nodes: int = 1
    layout: FSDPArgs = field(default_factory=FSDPArgs)
    """Where each model lives (`FSDPArgs.teacher`, `FSDPArgs.student`)."""
    accumulation: int = 1
    """Micro-batches per optimizer step on each device. Above one, every micro-batch but the last skips the gradient
    reduction, and the gradients stay whole until it: float32, `MixedPrecisionPolicy`'s reduce_dtype ("FSDP will
    accumulate gradients using reduce_dtype", its docstring)."""
    fused_optimizer: bool = True
    """AdamW's fused kernel (what the recipe uses on GPUs) updates in place; the for-loop one (on a CPU) makes three
    temporaries the size of each parameter in turn."""
    workspace: bool = True
    """Count `CUDA_WORKSPACE_BYTES` (a GPU's; not on a CPU)."""
    compiled: bool = False
    """The student's blocks are compiled (`--compile true`): they save `COMPILED_ACTIVATION_SHARE` of the bytes per
    token an eager block saves."""


def estimate_memory(student: Config, teachers: Sequence[Config], step: StepShape) -> MemoryEstimate:
    """Peak bytes on one device for one step of the recipe.

    Args:
        student: the student's config (`bf16-mixed`: float32 parameters, gradients and AdamW state).
        teachers: the teachers' configs when they run in the step (online guidance, or scoring), else none; several
            online teachers are all held, one forward at a time.
        step: its shape (see `StepShape`).
    """
    held: dict[str, float] = {"CUDA/NCCL workspace": CUDA_WORKSPACE_BYTES} if step.workspace else {}
    moments: dict[str, dict[str, float]] = {}
    if step.train:
        student_held, moments = student_memory(student, step)
        held |= student_held
    St = shard_group(step.layout.teacher, step.world_size, step.num_nodes)
    if teachers:
        held["teacher parameters"] = sum(2 * parameters(t) / St for t in teachers)
    moments |= teacher_moments(student, teachers, step)
    moment = max(moments, key=lambda name: sum(moments[name].values()))
    components = {**held, **moments[moment]}
    return MemoryEstimate(components, sum(components.values()), moment)


def student_memory(student: Config, step: StepShape) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """What the trained student holds through the step, and at each of its moments (the head's backward, with
    activation checkpointing the first recomputed block, the optimizer step) what it holds besides: bytes by name."""
    B, T, W = step.micro_batch, step.seq_len, step.world_size
    activation_checkpointing, accumulation = step.activation_checkpointing, step.accumulation
    held: dict[str, float] = {}
    moments: dict[str, dict[str, float]] = {}
    P, root, D, V = parameters(student), root_parameters(student), student.n_embd, student.padded_vocab_size
    block = (P - root) / student.n_layer
    S = shard_group(step.layout.student, W, step.num_nodes)
    held["student parameters"] = 4 * P / S
    held["AdamW state"] = 8 * P / S
    if W > 1:  # gathered in bf16: the root stays gathered through the step; a block and the prefetched next one
        held["gathered student parameters"] = 2 * (root + 2 * block)
        # FSDP2's all-gather output, copied out into the gathered parameters (`foreach_all_gather_copy_out`)
        held["gather buffers"] = 2 * block
    per_token, per_block = block_bytes_per_token(student, train=True)
    per_token *= COMPILED_ACTIVATION_SHARE if step.compiled else 1.0
    squares = attention_square_bytes(student, B, T, train=True)  # each layer's, in T^2
    N = B * T
    # One device: autocast's bf16 copy of each float32 weight, kept for backward. Sharded: the weights are gathered
    # in bf16 and FSDP2 frees them after forward and gathers them again for backward.
    copies = student.n_layer * per_block if W == 1 and not activation_checkpointing else 0.0
    if activation_checkpointing:  # the blocks' inputs (float32 residual stream) only
        saved = student.n_layer * 4 * N * D
    else:
        saved = student.n_layer * per_token * N + sum(squares)
    saved += 4 * N * D + 4 * N  # the final hidden states and the log-sum-exp, kept for the head's backward
    if accumulation > 1:  # the earlier micro-batches' whole float32 gradients, and the hidden states'
        head_gradients = 4 * (P + N * D)
    else:  # head, hidden states, a block's whole gradient before its reduce-scatter
        head = V * D + (V if student.lm_head_bias else 0)  # its weight and bias
        head_gradients = 4 * (head + N * D) + (4 * block if W > 1 else 0)
    moments["the head's backward"] = {
        "student activations": saved,
        "bf16 weight copies": copies,
        # and the head and its first gradient product in bf16
        "logit tiles": head_tile_bytes(V, N, student.final_logit_softcapping is not None) + 4 * V * D,
        "student gradients": head_gradients,
    }
    if activation_checkpointing:  # then the last block runs forward again, keeping what its backward needs
        moments["the first recomputed block"] = {
            "student activations": saved + per_token * N + squares[-1],
            "bf16 weight copies": per_block,
            "student gradients": head_gradients,
        }
    moments["the optimizer step"] = {
        "student gradients": 4 * P / S,
        "optimizer temporaries": 0 if step.fused_optimizer else 3 * 4 * V * D,  # the head: the largest parameter
    }
    return held, moments


def teacher_moments(student: Config, teachers: Sequence[Config], step: StepShape) -> dict[str, dict[str, float]]:
    """What one device holds besides during each teacher's forward in the step: bytes by name, per teacher."""
    B, M, W = step.micro_batch, step.window, step.world_size
    St = shard_group(step.layout.teacher, W, step.num_nodes)
    moments: dict[str, dict[str, float]] = {}
    for k, teacher in enumerate(teachers):
        Pt, Dt, Vt = parameters(teacher), teacher.n_embd, teacher.padded_vocab_size
        per_token, _ = block_bytes_per_token(teacher, train=False)
        # one block's intermediates at a time: those linear in M and those in M^2, as if at their peaks together
        intermediates = per_token * B * M + max(attention_square_bytes(teacher, B, M, train=False))
        N = B * M
        phase = {
            "teacher activations": 2 * N * Dt + intermediates,  # the residual stream, one block's intermediates
            "logit tiles": head_tile_bytes(Vt, N),
        }
        if step.train and step.accumulation > 1:  # after the first micro-batch: its whole float32 gradients
            phase["student gradients"] = 4 * parameters(student)
        if St > 1:  # gathered for the teacher's forward, resharded after it; the all-gather output of a block
            teacher_root = root_parameters(teacher)
            teacher_block = (Pt - teacher_root) / teacher.n_layer
            phase["gathered teacher parameters"] = 2 * (teacher_root + 2 * teacher_block)
            phase["teacher gather buffers"] = 2 * teacher_block
        moments["the teacher's forward" if len(teachers) == 1 else f"teacher {k}'s forward"] = phase
    return moments


def collective_bytes(nbytes: float, group: int, nodes: int) -> tuple[float, float]:
    """(over the node's links, over the network) that each device of a ring all-gather or reduce-scatter of `nbytes`
    sends (and receives as much), on average, over `group` devices on `nodes` nodes (a node's devices adjacent in the
    ring): each of the ring's `group` hops carries (group - 1) chunks of nbytes / group, and `nodes` of its hops (none
    on one node) go from one node to the next."""
    if group <= 1:
        return 0.0, 0.0
    sent = nbytes * (group - 1) / group
    network = sent * nodes / group if nodes > 1 else 0.0
    return sent - network, network


def traffic_per_step(
    student: Config | None,
    teachers: Sequence[Config],
    layout: FSDPArgs,
    *,
    devices: int,
    num_nodes: int,
    accumulation: int,
) -> tuple[float, float]:
    """(over the node's links, over the network): bytes each device sends per optimizer step, as much as it receives.

    Per micro-batch the student's blocks are gathered in bf16 for forward and again for backward (its root stays
    gathered), each teacher's for its forward; once per step the float32 gradients are reduce-scattered, and under
    "hybrid" the shards' gradients then all-reduced across nodes (two ring passes over one device per node).
    """
    world = devices * num_nodes
    node_links = network = 0.0

    def add(nbytes: float, group: int, nodes: int) -> None:
        nonlocal node_links, network
        within, across = collective_bytes(nbytes, group, nodes)
        node_links, network = node_links + within, network + across

    if student is not None:
        P = parameters(student)
        group, nodes = (devices, 1) if layout.student == "hybrid" else (world, num_nodes)
        add(accumulation * 2 * (2 * P - root_parameters(student)), group, nodes)  # forward and backward gathers, bf16
        add(4 * P, group, nodes)  # the gradients' reduce-scatter, float32
        if layout.student == "hybrid":
            add(2 * 4 * P / devices, num_nodes, num_nodes)  # all-reduce = reduce-scatter + all-gather
    for teacher in teachers:
        group, nodes = {"replicate": (1, 1), "node": (devices, 1), "all": (world, num_nodes)}[layout.teacher]
        add(accumulation * 2 * parameters(teacher), group, nodes)
    return node_links, network


def communication_seconds(node_links: float, network: float) -> float:
    """A lower bound of a step's communication time from `traffic_per_step`: each link at its bandwidth, no overlap
    between the two (a gather waits for its slowest hop)."""
    return node_links / NODE_LINK_BYTES_PER_S + network / NETWORK_BYTES_PER_S
