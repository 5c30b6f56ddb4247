"""The FLOPs a step does, from a LitGPT config: what `vocagnolm`'s MFU figures divide by (benchmarks/bench_mfu.py).

Counted as PyTorch's FLOP counter (and so LitGPT's `measure_flops`) counts them: 2 per multiply-add of every matrix
product (the blocks' projections and MLP, attention's two products over the whole (T, T) square, the head), nothing
for norms, activations and softmax; a training step is its forward and twice that for backward. Tests compare these
to `measure_flops` on the meta device for the paper's models.
"""

from litgpt.config import Config

MLP_MATRICES = {"LLaMAMLP": 3, "GemmaMLP": 3, "GptNeoxMLP": 2}


def forward_flops(config: Config, batch: int, seq: int, head: bool = True) -> int:
    """FLOPs of one forward pass of a (batch, seq) input through `config`'s model (with its head unless `head` is
    False)."""
    if config.mlp_class_name not in MLP_MATRICES:
        raise ValueError(f"{config.name}: FLOPs of a {config.mlp_class_name} are not counted here.")
    tokens = batch * seq
    attention_width = config.n_head * config.head_size
    qkv = 2 * tokens * config.n_embd * (config.n_head + 2 * config.n_query_groups) * config.head_size
    projection = 2 * tokens * attention_width * config.n_embd
    mlp = 2 * tokens * config.n_embd * config.intermediate_size * MLP_MATRICES[config.mlp_class_name]
    scores = 2 * 2 * batch * seq * seq * attention_width  # q @ k.T and its product with v
    per_layer = qkv + projection + mlp + scores
    return config.n_layer * per_layer + (2 * tokens * config.n_embd * config.padded_vocab_size if head else 0)


def training_flops(config: Config, batch: int, seq: int) -> int:
    """FLOPs of one training step's forward and backward (backward: twice the forward)."""
    return 3 * forward_flops(config, batch, seq)
