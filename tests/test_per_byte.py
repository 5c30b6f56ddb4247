"""Teachers compared per byte (`--guidance.compare byte`): the bytes each token covers, and the reference they give."""

import math

import pytest
import torch
from conftest import MISTRAL, QWEN, TINYLLAMA, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st
from litgpt.args import TrainArgs
from test_teachers import teachers_and_tokens
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from litgpt_vocagnolm.alignment.lexical import token_byte_lengths
from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer
from litgpt_vocagnolm.data.prepared import VocAgnoData, byte_table
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss, LossInputs
from litgpt_vocagnolm.loss.selection import TokenBytes, teacher_reference
from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.training.checks import check_setup
from litgpt_vocagnolm.training.micro_batch import Guide, forward_and_loss
from litgpt_vocagnolm.training.teacher import Teacher, TeacherArgs

TEXT = "Let $f(x) = x^2 + 3x$; then f'(x) = 2x + 3 and ∫₀¹ f = 11/6 ≈ 1.83 — naïve café, 数学."


@pytest.mark.parametrize("tokenizer_dir, prepended", [(QWEN, 0), (TINYLLAMA, 1), (MISTRAL, 1)])
def test_token_bytes_add_up_to_the_text(tokenizer_dir, prepended):
    """Byte-level BPE (Qwen2.5) and Metaspace BPE with byte fallback (TinyLlama, Mistral): the tokens of a text cover
    its UTF-8 bytes, plus the space SentencePiece puts before it; BOS and EOS cover none."""
    tokenizer = load_tokenizer(tokenizer_dir)
    table = token_byte_lengths(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    assert table[ids].sum() == len(TEXT.encode("utf-8")) + prepended
    assert (table[ids] > 0).all()
    specials = list(tokenizer.get_added_tokens_decoder())
    assert specials and (table[specials] == 0).all()


def test_other_tokenizers_count_each_token_decoded():
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "a": 1, "bcd": 2, "é": 3}, unk_token="[UNK]"))
    tokenizer.add_special_tokens(["<s>"])
    assert token_byte_lengths(tokenizer).tolist() == [0, 1, 3, 2, 0]  # the unknown token stands for any text


def brute_force_per_byte(losses, ranges, token_bytes: TokenBytes, aggregation: str, combine: str):
    """Token by token: each teacher's losses per byte of its tokens' text, aggregated over the range, combined, times
    the student token's bytes; the teacher with the lowest rate."""
    B, T = ranges[0].shape[:2]
    reference, mapped, best = torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool), torch.full((B, T), -1)
    for b in range(B):
        for t in range(T):
            rates = {}
            for k, (lt, r, size) in enumerate(zip(losses, ranges, token_bytes.teachers)):
                span = range(int(r[b, t, 0]), int(r[b, t, 1]))
                values = [
                    lt[b, j].item() / size[b, j].item()
                    for j in span
                    if not math.isnan(lt[b, j].item()) and size[b, j] > 0
                ]
                if values:
                    rates[k] = max(values) if aggregation == "max" else sum(values) / len(values)
            if rates:
                mapped[b, t] = True
                best[b, t] = min(rates, key=lambda k: (rates[k], k))
                rate = min(rates.values()) if combine == "min" else sum(rates.values()) / len(rates)
                reference[b, t] = rate * token_bytes.student[b, t].item()
    return reference, mapped, best


@st.composite
def with_bytes(draw):
    ls, losses, ranges, valid = draw(teachers_and_tokens())
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    student = torch.randint(0, 7, ls.shape, generator=generator)  # 0: a special token
    teachers = [torch.randint(0, 5, lt.shape, generator=generator) for lt in losses]
    return losses, ranges, TokenBytes(student, teachers)


@settings(max_examples=150, deadline=None)
@given(with_bytes(), st.sampled_from(["max", "mean"]), st.sampled_from(["min", "mean"]))
def test_per_byte_reference_matches_a_token_by_token_loop(case, aggregation, combine):
    losses, ranges, token_bytes = case
    reference, mapped, best = teacher_reference(losses, ranges, aggregation, combine, token_bytes)
    expected, expected_mapped, expected_best = brute_force_per_byte(losses, ranges, token_bytes, aggregation, combine)
    assert torch.equal(mapped, expected_mapped) and torch.equal(best, expected_best)
    torch.testing.assert_close(reference, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**31 - 1), st.sampled_from(["max", "mean"]))
def test_a_teacher_that_cuts_the_same_text_finer_is_no_better_per_byte(T, seed, aggregation):
    """Teacher B is teacher A with every token cut in two halves of half its bytes and half its loss: the same
    prediction of the same text. Per token B looks better on every token (its max is half of A's); per byte the two
    are equal, so the reference is A's alone."""
    generator = torch.Generator().manual_seed(seed)
    lt_a = torch.rand(1, T, generator=generator) * 4 + 0.1
    bytes_a = 2 * torch.randint(1, 5, (1, T), generator=generator)
    lt_b, bytes_b = lt_a.repeat_interleave(2, dim=1) / 2, bytes_a.repeat_interleave(2, dim=1) // 2
    position = torch.arange(T)
    ranges_a = torch.stack([position, position + 1], -1)[None]  # student token t is teacher A's token t
    ranges_b = torch.stack([2 * position, 2 * position + 2], -1)[None]  # and teacher B's tokens 2t, 2t + 1
    student = bytes_a  # the student's tokens are teacher A's
    _, _, best = teacher_reference([lt_a, lt_b], [ranges_a, ranges_b], aggregation, "min")
    if aggregation == "max":
        assert (best == 1).all()  # per token, the finer cut wins everywhere
    token_bytes = TokenBytes(student, [bytes_a, bytes_b])
    reference, _, best = teacher_reference([lt_a, lt_b], [ranges_a, ranges_b], aggregation, "min", token_bytes)
    alone, _, _ = teacher_reference([lt_a], [ranges_a], aggregation, "min", TokenBytes(student, [bytes_a]))
    torch.testing.assert_close(reference, alone)
    torch.testing.assert_close(alone, lt_a)  # one teacher with the student's tokens: its per-token losses
    assert (best == 0).all()  # equal rates: the first teacher


def test_byte_is_refused_where_no_teacher_loss_ranks_and_needs_the_bytes():
    with pytest.raises(ValueError, match="guidance.compare=byte compares teachers' losses"):
        GuidanceArgs(method="ce", compare="byte")
    with pytest.raises(ValueError, match="guidance.compare must be one of"):
        GuidanceArgs(compare="bytes")
    ls, valid = torch.rand(1, 3), torch.ones(1, 3, dtype=torch.bool)
    ranges = torch.tensor([[[0, 1], [1, 2], [2, 3]]])
    with pytest.raises(ValueError, match="needs token_bytes"):
        GuidedLoss(GuidanceArgs(compare="byte"))(ls, valid, LossInputs([torch.rand(1, 3)], [ranges]))


def test_setup_wants_each_teachers_tokenizer_for_byte(tinyllama_qwen_data):
    train = TrainArgs(max_tokens=1000, max_norm=1.0, global_batch_size=2, micro_batch_size=2)
    with pytest.raises(ValueError, match="--guidance.compare byte counts the bytes of each teacher token"):
        check_setup(
            tiny_config("student", 32000),
            VocAgnoData(tinyllama_qwen_data),
            train,
            TeacherArgs(),
            GuidanceArgs(compare="byte"),
            tokenizer_dir=TINYLLAMA,
        )


def piece_bytes(tokenizer: Tokenizer, token_id: int, byte_level: bool) -> int:
    """The bytes of text a token's piece stands for, read off the piece: a byte-level character (Qwen2.5's) or a
    SentencePiece `<0x..>` piece (TinyLlama's) is one byte, "▁" a space; special tokens none."""
    if token_id in tokenizer.get_added_tokens_decoder():
        return 0
    piece = tokenizer.id_to_token(token_id)
    if byte_level:
        return len(piece)
    if piece.startswith("<0x") and len(piece) == 6:
        return 1
    return len(piece.replace("▁", " ").encode("utf-8"))


def test_the_training_step_looks_up_each_tokens_bytes(tinyllama_qwen_data):
    """`forward_and_loss` with the tokenizers' byte tables is `guided_loss` on the bytes of the batch's tokens: each
    student target's and each teacher window token's, read off their pieces; and it selects other tokens than the
    per-token comparison."""
    torch.manual_seed(0)
    data = VocAgnoData(tinyllama_qwen_data, num_workers=0)
    data.connect(batch_size=2, max_seq_length=64)
    batch = next(iter(data.train_dataloader()))
    (side,) = batch.teachers
    side = side._replace(loss=torch.rand(side.ids.shape).masked_fill(~side.valid, math.nan))
    batch = batch._replace(teachers=[side])
    student = GPT(tiny_config("s", 32000, block_size=64))
    tables = [byte_table(TINYLLAMA, torch.device("cpu")), Teacher(QWEN).byte_table(torch.device("cpu"))]
    guide = Guide([Teacher(mode="cached")], GuidedLoss(GuidanceArgs(compare="byte"), byte_tables=tables))
    loss_sum, weight_sum, _ = forward_and_loss(student, guide, batch)

    tinyllama, qwen = load_tokenizer(TINYLLAMA), load_tokenizer(QWEN)
    targets, valid = batch.targets, batch.targets != -100
    token_bytes = TokenBytes(
        torch.tensor([[piece_bytes(tinyllama, int(t), False) if t >= 0 else 0 for t in row] for row in targets]),
        [torch.tensor([[piece_bytes(qwen, int(t), True) for t in row] for row in side.ids])],
    )
    with torch.no_grad():
        ls = student(batch.input_ids, targets=targets)
    inputs = LossInputs([side.loss], [side.ranges], token_bytes=token_bytes)
    expected_sum, expected_weight, _ = GuidedLoss(GuidanceArgs(compare="byte"))(ls, valid, inputs)
    assert weight_sum == expected_weight and torch.allclose(loss_sum, expected_sum)
    per_token_sum, per_token_weight, _ = GuidedLoss(GuidanceArgs())(ls, valid, inputs)
    assert per_token_weight == weight_sum  # as many tokens (the top-k of the same mapped ones) ...
    assert not torch.allclose(per_token_sum, loss_sum)  # ... but others
