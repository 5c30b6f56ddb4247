"""The head and the loss a tile of rows at a time: the same values and gradients as PyTorch's cross-entropy over whole
logits, and no tensor as large as the whole logits ever made, for the student (forward and backward) and the teacher."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st
from litgpt.model import do_softcapping
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from litgpt_vocagnolm.loss import cross_entropy as cross_entropy_module
from litgpt_vocagnolm.loss.cross_entropy import linear_cross_entropy, per_token_cross_entropy
from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.training.teacher import teacher_token_loss

QWEN_VOCABULARY = 151665  # Qwen2.5's tokenizer; the model pads it to 151680


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation returns (in elements)."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return out


def reference(hidden, weight, targets, row_weights, bias=None, softcap=None):
    """LitGPT's head over whole logits (`F.linear`, then `do_softcapping` as `GPT.forward` applies it), PyTorch's
    cross-entropy, in float64."""
    logits = F.linear(hidden.double(), weight.double(), None if bias is None else bias.double())
    logits = logits if softcap is None else do_softcapping(logits, softcap)
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T), 0 where ignored
    return ce, (row_weights.double() * ce).sum()


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 9),
    D=st.integers(1, 12),
    V=st.integers(2, 40),
    tile_rows=st.integers(1, 30),
    biased=st.booleans(),
    softcap=st.none() | st.floats(0.5, 50.0),
    seed=st.integers(0, 2**16),
)
def test_values_and_gradients_equal_cross_entropy_over_whole_logits(B, T, D, V, tile_rows, biased, softcap, seed):
    """Any shape and tiling, with or without the head's bias (Phi-2) and the logits' soft cap (Gemma-2): the losses
    and the gradients of the hidden states, the weight and the bias are LitGPT's head's, within 1e-5."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=g, requires_grad=True)
    weight = torch.randn(V, D, generator=g, requires_grad=True)
    bias = torch.randn(V, generator=g, requires_grad=True) if biased else None
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[torch.rand(B, T, generator=g) < 0.2] = -100
    row_weights = torch.rand(B, T, generator=g)  # as the guided weights scale each token's loss

    ours = linear_cross_entropy(hidden, weight, targets, tile_rows=tile_rows, bias=bias, softcap=softcap)
    expected, expected_sum = reference(hidden, weight, targets, row_weights, bias, softcap)
    assert ours.dtype == torch.float32 and torch.allclose(ours.double(), expected, atol=1e-5)
    assert (ours[targets == -100] == 0).all()
    inputs = (hidden, weight) if bias is None else (hidden, weight, bias)
    grads = torch.autograd.grad((row_weights * ours).sum(), inputs)
    expected_grads = torch.autograd.grad(expected_sum, inputs)
    for got, want in zip(grads, expected_grads, strict=True):
        assert torch.allclose(got, want, atol=1e-5)


HEADS = {"plain": {}, "capped": {"softcap": 30.0}, "biased": {"biased": True}, "both": {"softcap": 5.0, "biased": True}}


@pytest.mark.parametrize("head", HEADS.values(), ids=HEADS.keys())
def test_bf16_autocast_is_as_accurate_as_whole_logits_and_keeps_parameter_dtypes(head):
    """bf16-mixed: float32 parameters, products in bf16, losses and softmax in float32, gradients in float32. Both
    this and LitGPT's path (bf16 logits, then float32 cross-entropy) round the products to bf16 (LitGPT also caps the
    logits in bf16, this in float32); against float64 the tiled gradients must be as accurate as LitGPT's, within
    bf16's rounding (2**-8)."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 50, 64, generator=g), torch.randn(300, 64, generator=g) / 8
    bias = torch.randn(300, generator=g) if head.get("biased") else None
    softcap = head.get("softcap")
    targets = torch.randint(0, 300, (2, 50), generator=g)

    def run(loss_of):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        b = None if bias is None else bias.clone().requires_grad_()
        losses = loss_of(h, w, b)
        losses.sum().backward()
        return losses, h.grad, w.grad, *([] if b is None else [b.grad])

    def tiled(h, w, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_cross_entropy(h, w, targets, tile_rows=7, bias=b, softcap=softcap)

    def whole_logits(h, w, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = F.linear(h, w, b)  # what LitGPT's head computes under autocast: bf16, capped in bf16
            logits = logits if softcap is None else do_softcapping(logits, softcap)
        return per_token_cross_entropy(logits, targets)

    exact = run(lambda h, w, b: reference(h, w, targets, torch.ones(2, 50), b, softcap)[0])
    ours, theirs = run(tiled), run(whole_logits)
    assert all(tensor.dtype == torch.float32 for tensor in ours)
    if softcap is None:  # the same bf16 products (and bias), then float32 in both
        assert torch.allclose(ours[0], theirs[0], atol=1e-5)
    for got, other, want in zip(ours, theirs, exact, strict=True):
        error = (got.double() - want.double()).norm() / want.double().norm()
        assert error <= 2**-8 and error <= 1.05 * (other.double() - want.double()).norm() / want.double().norm()


@pytest.mark.parametrize("head", HEADS.values(), ids=HEADS.keys())
def test_model_loss_equals_litgpt_forward_and_logits_are_never_whole(monkeypatch, head):
    """The model's per-token loss and every parameter's gradient (the head's weight and bias among them) are LitGPT's
    forward's and `F.cross_entropy`'s, with and without Phi-2's head bias and Gemma-2's final soft cap."""
    torch.manual_seed(0)
    config = tiny_config("s", 2000, n_layer=2, n_embd=32, block_size=64)
    config.lm_head_bias, config.final_logit_softcapping = head.get("biased", False), head.get("softcap")
    model = GPT(config)
    assert (model.lm_head.bias is not None) == config.lm_head_bias
    V = model.config.padded_vocab_size
    monkeypatch.setattr(cross_entropy_module, "TILE_ELEMENTS", 48 * V)  # tiles of 48 rows: larger than the (V, 32) head
    B, T = 2, 64
    idx, targets = torch.randint(0, 2000, (B, T)), torch.randint(0, 2000, (B, T))
    expected = F.cross_entropy(model(idx).transpose(1, 2), targets, reduction="none")  # LitGPT's forward
    expected.sum().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    probe = LargestTensor()
    with probe:
        ours = model(idx, targets=targets)
        ours.sum().backward()
    assert torch.allclose(ours, expected, atol=1e-5)
    for p, want in zip(model.parameters(), expected_grads, strict=True):
        assert torch.allclose(p.grad, want, atol=1e-5)
    # The largest tensor is a tile of 48 rows of logits (forward or backward), never (B, T, V) = 128 rows.
    assert probe.largest == 48 * V


def test_teacher_loss_at_qwen_vocabulary_in_bf16_without_whole_logits(monkeypatch):
    """The teacher's per-token loss with Qwen2.5's real vocabulary: as the whole-logits path gives it (bf16
    tolerance), and no tensor of (B, M, V) elements, in any dtype."""
    monkeypatch.setattr(cross_entropy_module, "TILE_ELEMENTS", 1 << 24)  # 110 rows of 151,680 logits
    torch.manual_seed(0)
    teacher = GPT(tiny_config("t", QWEN_VOCABULARY, n_embd=16, block_size=512)).to(torch.bfloat16).eval()
    B, M = 2, 256
    ids = torch.randint(0, QWEN_VOCABULARY, (B, M))
    valid = torch.ones(B, M, dtype=torch.bool)
    valid[1, 200:] = False
    probe = LargestTensor()
    with torch.no_grad(), probe:
        ours = teacher_token_loss(teacher, ids, valid)
    V = teacher.config.padded_vocab_size
    assert probe.largest <= (cross_entropy_module.TILE_ELEMENTS // V) * V  # one tile of rows, not (B, M, V)

    with torch.no_grad():  # the whole-logits path: LitGPT's forward, then the cross-entropy of the next token
        logits = teacher(ids).float()
        expected = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    expected = F.pad(expected, (1, 0), value=math.nan).masked_fill(~valid, math.nan)
    assert torch.isnan(ours[:, 0]).all() and torch.isnan(ours[1, 200:]).all()
    torch.testing.assert_close(ours, expected, rtol=1e-2, atol=1e-2, equal_nan=True)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"hidden must be \(B, T, D\)"):
        linear_cross_entropy(torch.randn(2, 3, 4), torch.randn(5, 6), torch.zeros(2, 3, dtype=torch.long))
    hidden, weight, targets = torch.randn(2, 3, 4), torch.randn(5, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"bias must be \(V,\) = \(5,\), got \(4,\)"):
        linear_cross_entropy(hidden, weight, targets, bias=torch.zeros(4))
    with pytest.raises(ValueError, match="softcap must be above 0, got 0.0"):
        linear_cross_entropy(hidden, weight, targets, softcap=0.0)
