"""The FLOPs a step does, from a LitGPT config: what `vocagnolm`'s MFU figures divide by (benchmarks/bench_mfu.py).

Counted as PyTorch's FLOP counter (and so LitGPT's `measure_flops`) counts them: 2 per multiply-add of every matrix
product (the blocks' projections and MLP, attention's two products over the whole (T, T) square, the head), nothing
for norms, activations and softmax; a training step is its forward and twice that for backward. A mixture of experts
counts the experts each token is routed to (`memory.matmul_parameters`). Tests compare these to `measure_flops` on the
meta device for the paper's models.
"""

from litgpt.config import Config

from litgpt_vocagnolm.planning.memory import matmul_parameters


def forward_flops(config: Config, batch: int, seq: int, head: bool = True) -> int:
    """FLOPs of one forward pass of a (batch, seq) input through `config`'s model (with its head unless `head` is
    False)."""
    products = matmul_parameters(config) - (0 if head else config.padded_vocab_size * config.n_embd)
    scores = 2 * 2 * batch * seq * seq * config.n_head * config.head_size  # q @ k.T and its product with v
    return 2 * batch * seq * products + config.n_layer * scores


def training_flops(config: Config, batch: int, seq: int) -> int:
    """FLOPs of one training step's forward and backward (backward: twice the forward)."""
    return 3 * forward_flops(config, batch, seq)
