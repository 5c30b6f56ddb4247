"""Every structural family of LitGPT's model configs, as the student and as the teacher: a tiny copy of one config of
each (`family_config`: 2 layers, width 64, every family field kept, sliding windows shorter than the sequence) goes
through what a user runs, each against LitGPT's own `GPT.forward`:
  - the per-token loss and every parameter's gradient (the head's weight and bias, whatever is upstream of it) are
    LitGPT's forward's and `F.cross_entropy`'s, within 1e-5 in float32;
  - `vocagnolm score-teacher` writes a cache that holds LitGPT's losses, within float16 rounding;
  - one student step guided by that cache gives the guided loss and gradients of LitGPT's logits; the family as an
    online teacher scores as its cache says;
  - `vocagnolm plan` plans the family as the student and as the teacher, its parameters those of the checkpoint, its
    FLOPs those PyTorch's counter counts in LitGPT's forward;
  - greedy generation (`evaluate`'s) writes what LitGPT's forward's argmax writes.
`FAMILIES` is the list docs/models.md gives users (checked below).
"""

import dataclasses
import functools
import math
import re
from pathlib import Path

import litgpt.model
import pytest
import torch
import torch.nn.functional as F
from conftest import MISTRAL, ROOT, TINYLLAMA, make_checkpoint, prepare_pair
from litgpt.config import Config
from litgpt.tokenizer import Tokenizer
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from litgpt_vocagnolm import cli
from litgpt_vocagnolm.data.prepared import Batch, VocAgnoData
from litgpt_vocagnolm.evaluation.generation import generate_greedy
from litgpt_vocagnolm.loss import cross_entropy
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss
from litgpt_vocagnolm.models.gpt import GPT, initialize_weights, load_model
from litgpt_vocagnolm.planning.flops import forward_flops
from litgpt_vocagnolm.planning.memory import StepShape, estimate_memory, parameters
from litgpt_vocagnolm.training.micro_batch import Guide, forward_and_loss, teacher_scores
from litgpt_vocagnolm.training.score_teacher import score_teacher
from litgpt_vocagnolm.training.teacher import Teacher

# One LitGPT config per family, and what its layout adds to the ones above it.
FAMILIES = {
    "tiny-llama-1.1b": "Llama 2's layout (RMSNorm, SwiGLU, rope, grouped queries): the paper's student",
    "Llama-3.2-1B": "Llama 3's rope scaling, a 128k vocabulary",
    "R1-Distill-Llama-8B": "the same, as DeepSeek distilled it",
    "SmolLM2-135M": "Llama's layout, nine heads in three groups",
    "Mistral-7B-v0.1": "a sliding window on every layer",
    "Mathstral-7B-v0.1": "the same, a 32,768-token vocabulary",
    "Mixtral-8x7B-v0.1": "a mixture of experts",
    "Qwen2.5-0.5B": "attention biases, a 152k vocabulary",
    "Qwen3-0.6B": "qk-norm, heads wider than the width",
    "Qwen3-30B-A3B": "qk-norm and a mixture of experts",
    "Gemma-2b": "GeGLU, scaled embeddings, norms offset by one, multi-query, a 256k vocabulary",
    "Gemma-2-9b": "final and attention logit soft-capping, post-norms, a sliding window on every other layer",
    "Gemma-3-1b-it": "qk-norm, post-norms, a rope per layer, sliding windows",
    "Gemma-3-4b-it": "the same, with linear rope scaling, a 262k vocabulary",
    "phi-2": "parallel residual with a shared norm, LayerNorm, biases, a head bias, partial rope",
    "Phi-3-mini-4k-instruct": "a sliding window on every layer, half the context",
    "Phi-4-mini-instruct": "partial rope, a 200k vocabulary, a window longer than the context (its mask still built)",
    "pythia-14m": "GPT-NeoX: parallel residual, LayerNorm, biases, partial rope",
    "falcon-7b": "parallel residual with a shared norm, multi-query attention",
    "falcon-40b": "parallel residual with two norms, grouped queries",
    "OLMo-1B-hf": "LayerNorm without weights",
    "OLMo-2-1124-7B": "norms after attention and MLP only, OLMo-2's qk-norm",
    "stablelm-3b-4e1t": "LayerNorm with a SwiGLU MLP, partial rope",
}
SEQ_LEN = 64  # the student's tokens per block of the data below; every sliding window here is shorter
WINDOW = 16


def family_config(name: str, vocab_size: int = 32000, block_size: int = 256) -> Config:
    """A tiny copy of LitGPT's config `name`: 2 layers, width 64, 4 heads (multi-query, grouped or one key per query
    as the family has them), heads 16 wide (32 where the family's heads are not the width split: Gemma, Qwen3), an MLP
    of 128, 4 experts of 32 with 2 per token, sliding windows of `WINDOW` tokens on the layers the family slides (a
    family that mixes sliding and global layers keeps one of each, and Gemma-3's rope per layer follows), the
    vocabulary of the tokenizers here. Every other field (norms, biases, rope, soft-caps, residual layout) is
    LitGPT's."""
    config = Config.from_name(name)
    groups = 4 if config.n_query_groups == config.n_head else (1 if config.n_query_groups == 1 else 2)
    changes = dict(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_query_groups=groups,
        head_size=16 if config.n_head * config.head_size == config.n_embd else 32,
        intermediate_size=128,
        vocab_size=vocab_size,
        padded_vocab_size=None,
        block_size=block_size,
    )
    if config.n_expert:
        changes.update(n_expert=4, n_expert_per_token=2, moe_intermediate_size=32)
    if config.sliding_window_size is not None:
        mixed = 0 in config.sliding_window_indices
        changes.update(sliding_window_size=WINDOW, sliding_window_indices=[1, 0] if mixed else [1, 1])
    if config.rope_indices is not None:  # Gemma-3: the local rope on sliding layers, the global one on the others
        changes.update(rope_indices=[0, 1])
    return dataclasses.replace(config, **changes)


def litgpt_losses(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T) float32: LitGPT's forward (its head, bias and soft cap included) and PyTorch's cross-entropy."""
    logits = litgpt.model.GPT.forward(model, ids)
    return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


class LitGPTLoss(torch.nn.Module):
    """A model whose per-token loss is LitGPT's (`litgpt_losses`), for `forward_and_loss`: the reference path."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return litgpt_losses(self.model, ids, targets)


def teacher_losses(model: torch.nn.Module, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, M) float32: LitGPT's loss of each teacher token given those before it, NaN on each window's first token and
    on padding (what `score-teacher` stores)."""
    losses = F.pad(litgpt_losses(model, ids[:, :-1], ids[:, 1:]), (1, 0), value=math.nan)
    return losses.masked_fill(~valid, math.nan)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Two GSM8K records prepared for TinyLlama and Mistral at `SEQ_LEN` tokens (2 train blocks, 2 validation
    blocks): scoring costs a head of 32,000 words per teacher token, ~1,000 tokens/s on this CPU at width 64."""
    root = tmp_path_factory.mktemp("data")
    records = (ROOT / "data" / "gsm8k" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    (root / "gsm8k-2.jsonl").write_text("\n".join(records) + "\n", encoding="utf-8")
    return prepare_pair(root / "data", root / "gsm8k-2.jsonl", TINYLLAMA, MISTRAL, max_seq_length=SEQ_LEN)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Each family's tiny LitGPT checkpoint (Mistral's tokenizer, the teacher side of `data`), made on first use."""
    root = tmp_path_factory.mktemp("families")
    return functools.cache(lambda name: make_checkpoint(root / name, family_config(name), MISTRAL, seed=1))


@pytest.fixture(scope="module")
def cache(tmp_path_factory, data, checkpoint):
    """Each family's `score-teacher` cache of `data` (scored as typed, but in one forward per split), on first use."""
    root = tmp_path_factory.mktemp("caches")

    def scored(name: str) -> Path:
        score_teacher(data=data, teacher=checkpoint(name), output=root / name, num_workers=0, batch_size=1000)
        return root / name

    return functools.cache(scored)


def first_batch(data: Path, cache: Path) -> Batch:
    """The first training batch of `data`, two blocks, with `cache`'s losses, as the recipe's loader gives it."""
    module = VocAgnoData(path=data, num_workers=0)
    module.connect(batch_size=2, max_seq_length=SEQ_LEN, teacher_caches=[cache])
    return Batch.of(next(iter(module.train_dataloader())))


@pytest.mark.parametrize("name", FAMILIES)
def test_loss_and_gradients_are_litgpts(name, monkeypatch):
    """A small vocabulary, tiles of 48 rows (of 128): the head's tiles, its bias and soft cap where the family has
    them, and every layer upstream."""
    monkeypatch.setattr(cross_entropy, "TILE_ELEMENTS", 48 * 512)
    torch.manual_seed(0)
    assert_loss_and_gradients_are_litgpts(GPT(family_config(name, vocab_size=500)))  # padded to 512


def assert_loss_and_gradients_are_litgpts(model: GPT) -> None:
    """`model`'s per-token loss and its parameters' gradients, given targets, are LitGPT's forward's and
    `F.cross_entropy`'s, within 1e-5, over random tokens with padding and weights as the guided loss gives them."""
    V = model.config.vocab_size
    ids, targets = torch.randint(0, V, (2, SEQ_LEN)), torch.randint(0, V, (2, SEQ_LEN))
    targets[:, -5:] = -100  # padding
    weights = torch.rand(2, SEQ_LEN)  # as the guided weights scale each token's loss
    expected = litgpt_losses(model, ids, targets)
    (weights * expected).sum().backward()
    expected_grads = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    ours = model(ids, targets=targets)
    (weights * ours).sum().backward()
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    assert ("lm_head.bias" in expected_grads) == model.config.lm_head_bias
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected_grads[n], rtol=0, atol=1e-5, msg=n)


def test_latent_attention_and_grouped_experts_a_layout_no_litgpt_config_has():
    """DeepSeek-V3's layout, which LitGPT builds but names no config of (latent attention, experts routed by groups,
    a shared expert, a dense first layer): LitGPT's loss and gradients, every parameter drawn for a new student (the
    router's too), and a plan that counts it."""
    config = Config(
        name="latent",
        block_size=256,
        vocab_size=500,
        n_layer=2,
        n_embd=64,
        n_head=4,
        latent_attention=dict(q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
        mlp_class_name="LLaMAMoE",
        intermediate_size=128,
        moe_intermediate_size=32,
        n_expert=8,
        n_expert_per_token=2,
        n_expert_groups=2,
        n_topk_groups=1,
        n_topk_scores_per_group=2,
        n_shared_expert=1,
        first_k_dense_replace=1,
        norm_class_name="RMSNorm",
        parallel_residual=False,
        bias=False,
    )
    torch.manual_seed(0)
    model = GPT(config)  # LitGPT leaves the grouped router's weight as torch.empty made it: any bytes, NaN at times
    initialize_weights(model, seed=0)
    router = model.transformer.h[1].mlp.gate.weight
    assert torch.isfinite(router).all() and router.std() > 0
    assert_loss_and_gradients_are_litgpts(model)
    assert parameters(config) == sum(p.numel() for p in model.parameters())
    step = StepShape(micro_batch=2, seq_len=SEQ_LEN, window=SEQ_LEN + 1, workspace=False)
    assert estimate_memory(config, [config], step).total > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_score_teacher_caches_litgpts_losses(name, checkpoint, cache, data):
    batch = first_batch(data, cache(name))
    model = load_model(checkpoint(name))
    side = batch.teachers[0]
    with torch.no_grad():
        expected = teacher_losses(model, side.ids, side.valid)
    assert side.valid[:, 1:].any(dim=1).all()
    torch.testing.assert_close(side.loss, expected, rtol=2**-11, atol=1e-5, equal_nan=True)  # float16's rounding


@pytest.mark.parametrize("name", FAMILIES)
def test_a_guided_student_step_and_an_online_teacher_step(name, checkpoint, cache, data):
    """The family as the student, guided by its own cache: the guided loss and every gradient of LitGPT's logits, and
    an AdamW step that moves every parameter; as the online teacher: the scores its cache holds, and a step."""
    batch = first_batch(data, cache(name))
    student = GPT(family_config(name, block_size=SEQ_LEN))
    initialize_weights(student, seed=0)  # as the recipe draws a new student: a rule for every family's parameters
    guided = GuidedLoss(GuidanceArgs())
    cached = Guide([Teacher(mode="cached")], guided)

    losses = {}
    for path, model in (("ours", student), ("LitGPT's", LitGPTLoss(student))):
        loss_sum, weight_sum, _ = forward_and_loss(model, cached, batch)
        (loss_sum / weight_sum).backward()
        losses[path] = loss_sum, weight_sum, {n: p.grad for n, p in student.named_parameters()}
        student.zero_grad(set_to_none=True)
    (ours, ours_weight, grads), (theirs, their_weight, expected_grads) = losses["ours"], losses["LitGPT's"]
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)  # a sum of ~50 losses
    assert ours_weight == their_weight
    for n, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[n], rtol=0, atol=1e-5, msg=n)
    before = [p.detach().clone() for p in student.parameters()]
    for p, grad in zip(student.parameters(), grads.values(), strict=True):
        p.grad = grad
    torch.optim.AdamW(student.parameters(), lr=1e-3).step()
    assert all(torch.isfinite(p).all() and not torch.equal(p, b) for p, b in zip(student.parameters(), before))

    online = Guide([Teacher(mode="online", model=load_model(checkpoint(name)))], guided)
    with torch.no_grad():
        scores = teacher_scores(online, batch)
    torch.testing.assert_close(scores.losses[0], batch.teachers[0].loss, rtol=2**-11, atol=1e-5, equal_nan=True)
    assert not scores.nonfinite.any()
    loss_sum, weight_sum, _ = forward_and_loss(student, online, batch, scores=scores)
    (loss_sum / weight_sum).backward()
    assert torch.isfinite(loss_sum) and all(torch.isfinite(p.grad).all() for p in student.parameters())


@pytest.mark.parametrize("name", FAMILIES)
def test_plan_plans_the_family_as_student_and_teacher(name, checkpoint, capsys):
    """`vocagnolm plan` of the tiny recipe with the family as its student (`--model_config` its checkpoint's
    model_config.yaml) and as its online teacher (its checkpoint): both counted with the checkpoint's parameters,
    FLOPs as PyTorch counts them."""
    config, ckpt = family_config(name), checkpoint(name)
    student = ["--model_config", str(ckpt / "model_config.yaml")]
    teacher = ["--teacher.checkpoint_dir", str(ckpt), "--guidance.method", "vocagnolm"]
    cli.main(["plan", "--config", "demo-cpu", *student, *teacher])  # as typed
    printed = capsys.readouterr().out
    assert f"student {name}, teacher online ({name})" in printed
    assert re.search(r"teacher parameters +\d", printed) and re.search(r"  total +[\d.]+ GB: fits in 80 GB", printed)
    weights = torch.load(ckpt / "lit_model.pth", weights_only=True)
    assert parameters(config) == sum(t.numel() for t in weights.values())

    model = litgpt.model.GPT(config)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):  # attention as plain products
        model(torch.zeros(2, SEQ_LEN, dtype=torch.long))
    assert forward_flops(config, 2, SEQ_LEN) == counter.get_total_flops()


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_generation_writes_litgpts_argmax(name, checkpoint):
    """`evaluate`'s decoding (KV cache, the head on each prompt's last position) against LitGPT's whole forward,
    argmax at each step, within the sliding window (a longer question is refused: tests/test_generation.py)."""
    model, tokenizer = load_model(checkpoint(name)), Tokenizer(checkpoint(name))
    prompt = tokenizer.encode("Natalia sold clips to 48").tolist()
    new = WINDOW - len(prompt)  # the question fills the window
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new):
            token = int(litgpt.model.GPT.forward(model, torch.tensor([ids]))[0, -1].argmax())
            if token == tokenizer.eos_id:
                break
            ids.append(token)
    expected = tokenizer.decode(torch.tensor(ids[len(prompt) :]))
    assert [g.text for g in generate_greedy(model, tokenizer, [prompt], new)] == [expected]


def family_rows() -> list[str]:
    """docs/models.md's table of families, from `FAMILIES`: what this file shows for each."""
    return [f"| {name} | {adds} | yes | yes |" for name, adds in FAMILIES.items()]


def test_the_docs_list_the_families_tested_here():
    """docs/models.md holds `FAMILIES` as its table, and the sizes of the copies here."""
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert "\n".join(family_rows()) in page
    config, prose = family_config("Gemma-2-9b"), " ".join(page.split())
    assert f"{config.n_layer} layers of width {config.n_embd}, every other field kept" in prose
    assert (
        f"sliding windows {config.sliding_window_size} tokens long, shorter than the test's sequences of {SEQ_LEN}"
        in prose
    )
