"""Per-token cross-entropy without holding float32 logits: the student's and the teacher's loss kernels.

`linear_cross_entropy` is the head and the loss in one, a tile of rows at a time (what `model.GPT` runs given
targets); `per_token_cross_entropy` is the loss of logits that exist anyway (the distillation baselines need them).
Both return one float32 per token, unreduced: the guidance weights them.
"""

import torch
from torch import Tensor

IGNORE_INDEX = -100  # a target with nothing to predict (padding), as in F.cross_entropy


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy in float32, `chunk_size` rows at a time; backward recomputes each chunk's softmax.

    Autograd keeps only the logits (which exist anyway) and the targets: at B=1, T=2048, V=32000 the float32
    log-probabilities that `F.cross_entropy` would keep for a bf16 input are 262 MB more.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore: Tensor, chunk_size: int) -> Tensor:
        # logits (N, V), targets (N,) in [0, V), ignore (N,) bool
        loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            log_probs = torch.log_softmax(logits[rows].float(), dim=-1)  # (chunk, V), freed each iteration
            loss[rows] = -log_probs.gather(1, targets[rows, None]).squeeze(1)
        ctx.save_for_backward(logits, targets, ignore)
        ctx.chunk_size = chunk_size
        return loss.masked_fill_(ignore, 0.0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        logits, targets, ignore = ctx.saved_tensors
        grad = grad.float().masked_fill(ignore, 0.0)[:, None]  # (N, 1)
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            # d CE / d logits = softmax - one_hot(target)
            chunk = torch.softmax(logits[rows].float(), dim=-1).mul_(grad[rows])
            chunk.scatter_add_(1, targets[rows, None], -grad[rows])
            grad_logits[rows] = chunk
        return grad_logits, None, None, None


def per_token_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100, chunk_size: int = 128) -> Tensor:
    """Cross-entropy of each target token.

    Like `litgpt.utils.chunked_cross_entropy`, computed `chunk_size` rows at a time, but unreduced and always in
    float32 whatever the logits' dtype, without ever holding a float32 copy of all logits (not even for backward).

    Args:
        logits: (B, T, V), any float dtype; pass contiguous logits (a slice such as `logits[:, :-1]` is copied whole).
        targets: (B, T) token ids, `ignore_index` where there is nothing to predict (padding).
        ignore_index: target value whose loss is 0.
        chunk_size: rows of (V,) logits upcast at once.

    Returns: (B, T) float32, 0 where `targets == ignore_index`.
    """
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(f"logits must be (B, T, V), targets (B, T); got {tuple(logits.shape)}, {tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ignore = targets == ignore_index
    flat_targets = targets.masked_fill(ignore, 0).reshape(-1)
    flat_logits = logits.reshape(
        -1, logits.shape[-1]
    )  # (B * T, V): a view of contiguous logits; a sliced input is copied
    loss = _ChunkedCrossEntropy.apply(flat_logits, flat_targets, ignore.reshape(-1), chunk_size)
    return loss.view(targets.shape)


TILE_ELEMENTS = 1 << 26  # logits computed at once by `linear_cross_entropy`: ~0.7 GB of transients at float32


def head_product(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """(tile, V) `hidden @ weight.T + bias` in their dtype, as `F.linear` computes LitGPT's head (`addmm` with the
    bias, no separate sum)."""
    return hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)


def logit_gradient(z: Tensor, targets: Tensor, lse: Tensor, grad: Tensor, softcap: float | None) -> Tensor:
    """(tile, V) float32 gradient of a tile's losses, each row's scaled by `grad` (tile,), with respect to the head's
    output `z` (tile, V) float32, its logits before the cap: softmax - one_hot(target), times the cap's derivative
    1 - tanh(z / softcap)^2 under a cap. In place on `z`; under a cap one more (tile, V) float32 tensor (the tanh) is
    alive until the function returns."""
    if softcap is None:
        g = z.sub_(lse[:, None]).exp_()  # softmax
    else:
        tanh = z.div_(softcap).tanh_()
        g = torch.mul(tanh, softcap).sub_(lse[:, None]).exp_()
    g.scatter_add_(1, targets[:, None], torch.full_like(lse[:, None], -1.0)).mul_(grad[:, None])
    return g if softcap is None else g.addcmul_(g, tanh.square_(), value=-1.0)  # g (1 - tanh^2), in two passes


class _LinearCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy of LitGPT's head, `hidden @ weight.T + bias` soft-capped to `softcap * tanh(z / softcap)`
    when given, `tile_rows` rows of logits at a time, forward and backward.

    Forward keeps only the inputs and one log-sum-exp per row; backward recomputes each tile's logits (one more
    matrix product of the head) and turns them into gradients in place. Under autocast the products (and the bias) run
    in the autocast dtype, as `F.linear` would run them; the cap, the log-sum-exp and the softmax are float32.
    """

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, tile_rows: int, softcap: float | None
    ) -> Tensor:
        # hidden (N, D), weight (V, D), bias (V,) or None, targets (N,) in [0, V) or IGNORE_INDEX
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        ignore = targets == IGNORE_INDEX
        targets = targets.masked_fill(ignore, 0)
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)  # a copy only under autocast, as F.linear makes one
            b = None if bias is None else bias.to(dtype)
            lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)  # (N,)
            target_logit = torch.empty_like(lse)  # (N,)
            for start in range(0, hidden.shape[0], tile_rows):
                rows = slice(start, start + tile_rows)
                logits = head_product(hidden[rows].to(dtype), w, b).float()  # (tile, V), freed each iteration
                if softcap is not None:  # LitGPT's `do_softcapping`, in place: no second (tile, V) tensor
                    logits.div_(softcap).tanh_().mul_(softcap)
                target_logit[rows] = logits.gather(1, targets[rows, None]).squeeze(1)
                # log-sum-exp in place: torch.logsumexp would allocate another (tile, V) float32 tensor
                top = logits.amax(dim=-1, keepdim=True)  # (tile, 1)
                lse[rows] = logits.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(1))
        ctx.save_for_backward(hidden, weight, bias, targets, ignore, lse)
        ctx.dtype, ctx.tile_rows, ctx.softcap = dtype, tile_rows, softcap
        return (lse - target_logit).masked_fill_(ignore, 0.0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
        hidden, weight, bias, targets, ignore, lse = ctx.saved_tensors
        dtype, tile_rows, softcap = ctx.dtype, ctx.tile_rows, ctx.softcap
        grad = grad.float().masked_fill(ignore, 0.0)  # (N,)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None  # (V, D) in the weight's dtype: float32 under mixed precision, summed over the tiles
        # (V,) float32: the column sums of every tile's gradient of the logits
        grad_bias = torch.zeros(weight.shape[0], device=lse.device) if ctx.needs_input_grad[2] else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            for start in range(0, hidden.shape[0], tile_rows):
                rows = slice(start, start + tile_rows)
                h = hidden[rows].to(dtype)  # (tile, D)
                # (tile, V) float32, in place on the tile's logits computed again (no name keeps them past the tile)
                g = logit_gradient(head_product(h, w, b).float(), targets[rows], lse[rows], grad[rows], softcap)
                if grad_bias is not None:
                    grad_bias += g.sum(dim=0)
                g = g.to(dtype)
                if ctx.needs_input_grad[0]:
                    grad_hidden[rows] = g @ w
                if ctx.needs_input_grad[1]:
                    if grad_weight is None:  # the first tile's product becomes the sum: no zero-filled buffer
                        grad_weight = (g.T @ h).to(weight.dtype)
                    elif grad_weight.dtype == dtype:
                        grad_weight.addmm_(g.T, h)
                    else:  # a float32 sum of bf16 products, cast inside the kernel: no (V, D) float32 copy
                        grad_weight.add_(g.T @ h)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    tile_rows: int | None = None,
    *,
    bias: Tensor | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Cross-entropy of each target under LitGPT's head, the logits `hidden @ weight.T + bias` (soft-capped to
    `softcap * tanh(logits / softcap)` when `softcap` is given), never holding all the logits.

    A language model's head and its loss in one: the (B, T, V) logits, and their float32 copy, never exist whole,
    forward or backward; at most `tile_rows` rows of them do (by default ~2**26 logits, 441 rows of a 152k vocabulary,
    2,097 of a 32k one). Gradients flow to `hidden`, `weight` and `bias`. No host sync. The bias and the cap are
    LitGPT's `GPT.forward`'s (Phi-2's `lm_head_bias`, Gemma-2's `final_logit_softcapping`), in its order: the bias
    is added to the product, the cap applied to the sum; the cap in float32 where LitGPT caps in the logits' dtype
    (the same under float32, bf16's rounding apart under bf16).

    Both maintained fused kernels were considered: cut-cross-entropy's per-token mode calls `nonzero()` on every call
    (a host sync per micro-batch), and Liger's `.item()`s the target count and, unreduced, recomputes the forward in
    backward as this does; neither fits a step that must not stop the GPU.

    Args:
        hidden: (B, T, D) the model's final hidden states (after the last norm).
        weight: (V, D) the head.
        targets: (B, T) token ids in [0, V), or -100 where there is nothing to predict.
        tile_rows: rows of logits computed at once.
        bias: (V,) the head's bias, if it has one.
        softcap: the logits' soft cap, if any (above 0).

    Returns: (B, T) float32, 0 where `targets == -100`.
    """
    V = weight.shape[0]
    if hidden.shape[:-1] != targets.shape or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be (B, T, D), weight (V, D), targets (B, T); got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    if bias is not None and bias.shape != (V,):
        raise ValueError(f"bias must be (V,) = ({V},), got {tuple(bias.shape)}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be above 0, got {softcap}")
    tile_rows = tile_rows or max(1, TILE_ELEMENTS // V)
    flat = hidden.reshape(-1, hidden.shape[-1])  # (B * T, D)
    return _LinearCrossEntropy.apply(flat, weight, bias, targets.reshape(-1), tile_rows, softcap).view(targets.shape)
