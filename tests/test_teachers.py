"""Several teachers at once: their aggregated losses combined per student token (min or mean), their prepared data
read side by side, their caches or models in one training run."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MISTRAL, QWEN, ROOT, TINYLLAMA, prepare_pair, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st
from litgpt.args import TrainArgs
from test_recipe import metrics, pretrain_here, recipe_config
from test_teacher_cache import score_here

from litgpt_vocagnolm.data.prepared import BlockDataset, VocAgnoData
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss, LossInputs
from litgpt_vocagnolm.loss.selection import (
    SelectionArgs,
    aggregate_teacher_loss,
    teacher_guided_weights,
    teacher_reference,
)
from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.training.checks import check_setup
from litgpt_vocagnolm.training.micro_batch import Guide, forward_and_loss
from litgpt_vocagnolm.training.teacher import Teacher, TeacherArgs, teacher_token_loss


def guided_loss(args: GuidanceArgs, ls: torch.Tensor, valid: torch.Tensor, **inputs) -> tuple:
    """`GuidedLoss` of one process on a micro-batch's `LossInputs` (given by name)."""
    return GuidedLoss(args)(ls, valid, LossInputs(**inputs))


@st.composite
def teachers_and_tokens(draw, max_teachers: int = 3):
    """B x T student tokens with (B, M_k) losses and (B, T, 2) ranges for each of K teachers, windows of their own
    lengths; NaN losses and empty ranges included."""
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    K = draw(st.integers(1, max_teachers))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    losses, ranges = [], []
    for _ in range(K):
        M = draw(st.integers(1, 10))
        lt = torch.rand(B, M, generator=generator) * 5
        lt[torch.rand(B, M, generator=generator) < 0.2] = float("nan")
        a = torch.randint(0, M + 1, (B, T), generator=generator)
        e = torch.minimum(a + torch.randint(0, 3, (B, T), generator=generator), torch.tensor(M))
        losses.append(lt)
        ranges.append(torch.stack([a, e], -1))
    ls = torch.rand(B, T, generator=generator) * 6
    valid = torch.rand(B, T, generator=generator) > 0.15
    return ls, losses, ranges, valid


def brute_force_reference(losses, ranges, aggregation: str, combine: str):
    """Token by token, teacher by teacher: the reference, whether any teacher maps the token, the best teacher."""
    B, T = ranges[0].shape[:2]
    reference, mapped, best = torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool), torch.full((B, T), -1)
    for b in range(B):
        for t in range(T):
            per_teacher = {}
            for k, (lt, r) in enumerate(zip(losses, ranges)):
                values = [v for v in lt[b, r[b, t, 0] : r[b, t, 1]].tolist() if not math.isnan(v)]
                if values:
                    per_teacher[k] = max(values) if aggregation == "max" else sum(values) / len(values)
            if per_teacher:
                mapped[b, t] = True
                best[b, t] = min(per_teacher, key=lambda k: (per_teacher[k], k))
                pick = min if combine == "min" else lambda v: sum(v) / len(v)
                reference[b, t] = pick(list(per_teacher.values()))
    return reference, mapped, best


@settings(max_examples=150, deadline=None)
@given(teachers_and_tokens(), st.sampled_from(["max", "mean"]), st.sampled_from(["min", "mean"]))
def test_reference_matches_a_token_by_token_loop(case, aggregation, combine):
    _, losses, ranges, _ = case
    reference, mapped, best = teacher_reference(losses, ranges, aggregation, combine)
    expected, expected_mapped, expected_best = brute_force_reference(losses, ranges, aggregation, combine)
    assert torch.equal(mapped, expected_mapped)
    assert torch.equal(best, expected_best)
    torch.testing.assert_close(reference, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(
    teachers_and_tokens(max_teachers=1),
    st.sampled_from(["max", "mean"]),
    st.sampled_from(["min", "mean"]),
    st.sampled_from([0.2, 0.4, 1.0]),
    st.sampled_from(["include", "exclude"]),
)
def test_one_teacher_gives_exactly_the_single_teacher_weights(case, aggregation, combine, top_k, unmapped):
    """One teacher, bare, as a list of one, or twice under either combination: the weights of a loop that ranks the
    valid mapped tokens by `ls - aggregate` (the single-teacher rule of docs/design.md, ties to the earlier token)."""
    ls, (lt,), (ranges,), valid = case
    reference, mapped = aggregate_teacher_loss(lt, ranges, aggregation)
    excess = (ls - reference).flatten().tolist()
    candidates = [i for i, ok in enumerate((valid & mapped).flatten().tolist()) if ok]
    ranked = sorted(candidates, key=lambda i: (-excess[i], i))[: math.ceil(top_k * len(candidates) - 1e-9)]
    expected = torch.zeros(valid.numel())
    expected[ranked] = 1.0
    if unmapped == "include":
        expected[(valid & ~mapped).flatten()] = 1.0
    expected = expected.view_as(ls)
    options = SelectionArgs(top_k=top_k, aggregation=aggregation, unmapped=unmapped, combine=combine)
    for lts, rangess in (([lt], [ranges]), ([lt, lt], [ranges, ranges])):
        assert torch.equal(teacher_guided_weights(ls, lts, rangess, valid, options), expected)
    assert torch.equal(teacher_reference([lt, lt], [ranges, ranges], aggregation, combine)[0], reference)


@settings(max_examples=100, deadline=None)
@given(teachers_and_tokens(), st.sampled_from(["min", "mean"]))
def test_metrics_say_which_teacher_set_the_reference_of_the_selected_tokens(case, combine):
    ls, losses, ranges, valid = case
    args = GuidanceArgs(combine=combine, top_k=0.5)
    _, _, metrics = guided_loss(args, ls, valid, teacher_losses=losses, ranges=ranges)
    weights = teacher_guided_weights(ls, losses, ranges, valid, SelectionArgs(top_k=0.5, combine=combine))
    _, mapped, best = brute_force_reference(losses, ranges, "max", combine)
    selected = (weights > 0) & valid & mapped
    shares = [metrics.get(f"reference_share_{k}") for k in range(len(losses))]
    if len(losses) == 1:
        assert shares == [None]  # one teacher: no per-teacher shares
        return
    if not selected.any():  # a share of no selected token is nothing (NaN, left out of the logged mean)
        assert all(share.isnan() for share in shares)
        return
    for k, share in enumerate(shares):
        assert share.item() == pytest.approx(((best == k) & selected).sum().item() / selected.sum().item())
    assert sum(s.item() for s in shares) == pytest.approx(1.0)


def test_min_lets_the_better_teacher_set_the_reference_and_lowers_it():
    """Two teachers on three tokens: A knows token 0, B knows token 1, only B maps token 2. min takes each token's
    lower loss, mean their average; a token either teacher maps is mapped."""
    ranges_a = torch.tensor([[[0, 1], [1, 2], [2, 2]]])
    ranges_b = torch.tensor([[[0, 1], [1, 2], [2, 3]]])
    lt_a, lt_b = torch.tensor([[0.5, 4.0, 9.0]]), torch.tensor([[3.0, 1.0, 2.0]])
    reference, mapped, best = teacher_reference([lt_a, lt_b], [ranges_a, ranges_b], "max", "min")
    assert reference.tolist() == [[0.5, 1.0, 2.0]] and mapped.all() and best.tolist() == [[0, 1, 1]]
    reference, _, _ = teacher_reference([lt_a, lt_b], [ranges_a, ranges_b], "max", "mean")
    assert reference.tolist() == [[1.75, 2.5, 2.0]]


def test_distillation_takes_one_teacher():
    ls, valid = torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool)
    ranges = [torch.zeros(1, 2, 2, dtype=torch.long)] * 2
    with pytest.raises(ValueError, match="takes one teacher"):
        guided_loss(
            GuidanceArgs(method="uld"),
            ls,
            valid,
            ranges=ranges,
            logits=torch.zeros(1, 2, 4),
            teacher_logits=torch.zeros(1, 2, 4),
        )
    with pytest.raises(ValueError, match="combine must be one of"):
        GuidanceArgs(combine="max")


# Data of two teachers: the session's TinyLlama -> Qwen2.5 and TinyLlama -> Mistral preparations of one corpus.


def test_batches_carry_each_teachers_window_and_ranges(tinyllama_qwen_data, tinyllama_mistral_data):
    both = VocAgnoData(tinyllama_qwen_data, num_workers=0, other_teachers=[tinyllama_mistral_data])
    both.check_files()
    alone = VocAgnoData(tinyllama_mistral_data, num_workers=0)
    for data in (both, alone):
        data.connect(batch_size=3, max_seq_length=64)
    pairs = zip(both.train_dataloader(), alone.train_dataloader())  # the same shuffle seed: the same blocks
    for _, (batch, mistral) in zip(range(4), pairs):
        assert torch.equal(batch.input_ids, mistral.input_ids)
        (qwen, side), (alone,) = batch.teachers, mistral.teachers
        for key in ("ids", "valid", "ranges"):
            assert torch.equal(getattr(side, key), getattr(alone, key))
        assert qwen.ids.max() > 32000  # the first teacher's windows are Qwen2.5's


def test_data_of_another_corpus_or_length_is_refused(tmp_path, tinyllama_qwen_data, gsm8k_sample):
    shorter = prepare_pair(tmp_path / "short", gsm8k_sample, TINYLLAMA, MISTRAL, max_seq_length=32)
    with pytest.raises(ValueError, match=r"does not hold the student blocks .*max_seq_length.* differ"):
        VocAgnoData(tinyllama_qwen_data, other_teachers=[shorter]).check_files()


def test_a_block_with_other_student_tokens_fails_when_read(tmp_path, tinyllama_qwen_data, gsm8k_sample):
    """The same token counts from another text (one digit changed): the blocks' loader check names the block."""
    lines = gsm8k_sample.read_text(encoding="utf-8").splitlines()
    changed = lines[-1].replace("1", "2", 1)
    assert changed != lines[-1]
    corpus = tmp_path / "edited.jsonl"
    corpus.write_text("\n".join([*lines[:-1], changed]) + "\n", encoding="utf-8")
    edited = prepare_pair(tmp_path / "edited", corpus, TINYLLAMA, MISTRAL)
    with pytest.raises(ValueError, match="input files"):  # found before training, from the manifests
        VocAgnoData(tinyllama_qwen_data, other_teachers=[edited]).check_files()
    found = None
    for split in ("train", "val"):
        dataset = BlockDataset(tinyllama_qwen_data, split, False, 0, others=[(edited, None)])
        try:
            for i in range(len(dataset)):
                dataset[i]
        except ValueError as error:
            found = str(error)
            break
    assert found is not None and "holds other student tokens" in found and str(edited) in found


def test_setup_wants_one_cache_or_model_per_teacher(
    tmp_path, tinyllama_qwen_data, tinyllama_mistral_data, mistral_teacher
):
    data = VocAgnoData(tinyllama_qwen_data, other_teachers=[tinyllama_mistral_data])
    train = TrainArgs(max_tokens=1000, max_norm=1.0, global_batch_size=2, micro_batch_size=2)
    config = tiny_config("student", 32000)
    with pytest.raises(ValueError, match=r"1 --teacher.checkpoint_dir for the data of 2 teachers"):
        check_setup(
            config, data, train, TeacherArgs(checkpoint_dir=mistral_teacher), GuidanceArgs(), tokenizer_dir=TINYLLAMA
        )
    with pytest.raises(ValueError, match="several teachers guide vocagnolm, rho1, chunk and random"):
        check_setup(
            config,
            data,
            train,
            TeacherArgs(checkpoint_dir=[mistral_teacher] * 2),
            GuidanceArgs(method="uld"),
            tokenizer_dir=TINYLLAMA,
        )
    with pytest.raises(ValueError, match="The teacher tokenizer is not the one") as error:  # Mistral's, Qwen data
        check_setup(
            config,
            data,
            train,
            TeacherArgs(checkpoint_dir=[mistral_teacher, mistral_teacher]),
            GuidanceArgs(),
            tokenizer_dir=TINYLLAMA,
        )
    recorded = data.manifests[0]["teacher"]  # one line: the teacher, what the data's manifest records, the fix
    message = str(error.value)
    assert "\n" not in message and str(mistral_teacher) in message and str(tinyllama_qwen_data) in message
    assert recorded["path"] in message and recorded["sha256"] in message
    assert f"`vocagnolm prepare --teacher {mistral_teacher}`" in message


def test_online_teachers_score_their_own_windows(
    tinyllama_qwen_data, tinyllama_mistral_data, qwen_teacher, mistral_teacher
):
    """forward_and_loss with two online teachers is guided_loss on each teacher's own per-token losses."""
    from litgpt.config import Config

    from litgpt_vocagnolm.models.weights import load_weights

    data = VocAgnoData(tinyllama_qwen_data, num_workers=0, other_teachers=[tinyllama_mistral_data])
    data.connect(batch_size=2, max_seq_length=64)
    batch = next(iter(data.train_dataloader()))
    teachers = []
    for directory in (qwen_teacher, mistral_teacher):
        teacher = GPT(Config.from_file(directory / "model_config.yaml"))
        load_weights(teacher, directory / "lit_model.pth")
        teachers.append(teacher.requires_grad_(False).eval())
    student = GPT(tiny_config("s", 32000, block_size=64))
    guidance = GuidanceArgs(combine="min")
    guide = Guide([Teacher(mode="online", model=t) for t in teachers], GuidedLoss(guidance))
    loss_sum, weight_sum, got = forward_and_loss(student, guide, batch)
    with torch.no_grad():
        sides = batch.teachers
        losses = [teacher_token_loss(t, s.ids, s.valid) for t, s in zip(teachers, sides, strict=True)]
        ls = student(batch.input_ids, targets=batch.targets)
    expected_sum, expected_weight, expected = guided_loss(
        guidance, ls, batch.targets != -100, teacher_losses=losses, ranges=[s.ranges for s in sides]
    )
    assert weight_sum == expected_weight and torch.allclose(loss_sum, expected_sum)
    assert got["reference_share_0"] + got["reference_share_1"] == pytest.approx(1.0)
    # Untrained teachers predict nearly uniformly: Mistral's loss (about ln 32,000) is below Qwen2.5's (ln 151,665).
    assert got["reference_share_1"] > 0.95


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The first 20 GSM8K problems prepared for a Qwen2.5 and a Mistral teacher (the same student blocks: about 60 in
    the train split, 16 for the runs below): scoring the Qwen teacher's 151,665-row head over the session's 240 took
    most of a minute."""
    root = tmp_path_factory.mktemp("small-pair")
    corpus = root / "gsm8k.jsonl"
    corpus.write_text("".join((ROOT / "data" / "gsm8k" / "train.jsonl").read_text().splitlines(True)[:20]))
    return prepare_pair(root / "qwen", corpus, TINYLLAMA, QWEN), prepare_pair(
        root / "mistral", corpus, TINYLLAMA, MISTRAL
    )


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory, small_pair, qwen_teacher, mistral_teacher):
    root = tmp_path_factory.mktemp("caches")
    score_here(small_pair[0], qwen_teacher, root / "qwen")
    score_here(small_pair[1], mistral_teacher, root / "mistral")
    return root / "qwen", root / "mistral"


@pytest.mark.slow
def test_training_with_two_caches(tmp_path, small_pair, two_caches):
    """`litgpt pretrain` with both teachers' caches: a run that logs each teacher's share of the references; with
    the first cache alone, as a one-element list, the very curve of today's `--teacher.cache DIR`. Each run 4 steps,
    in this process."""
    qwen_data, mistral_data = small_pair
    budget = ["--train.max_tokens", str(4 * 4 * 64), "--train.save_interval", "null"]
    data = {
        "class_path": "litgpt_vocagnolm.data.VocAgnoData",
        "init_args": {"path": str(qwen_data), "num_workers": 0, "other_teachers": [str(mistral_data)]},
    }
    (tmp_path / "two").mkdir()
    config = recipe_config(
        tmp_path / "two", qwen_data, None, data=data, teacher={"cache": [str(c) for c in two_caches]}
    )
    pretrain_here(config, "--guidance.combine", "min", *budget)
    rows = metrics(tmp_path / "two" / "out")
    assert len(rows) == 4 and all(math.isfinite(row["loss"]) for row in rows)
    for row in rows:
        assert row["reference_share_0"] + row["reference_share_1"] == pytest.approx(1.0, abs=1e-6)
    assert np.mean([row["reference_share_1"] for row in rows]) > 0.95  # the untrained teachers: see above

    curves = []
    for name, cache in (("plain", str(two_caches[0])), ("list", [str(two_caches[0])])):
        (tmp_path / name).mkdir()
        pretrain_here(recipe_config(tmp_path / name, qwen_data, None, teacher={"cache": cache}), *budget)
        curves.append([(row["loss"], row["selected_fraction"]) for row in metrics(tmp_path / name / "out")])
    assert len(curves[0]) == 4 and curves[0] == curves[1]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--teacher.checkpoint_dir", "a"], ["a"]),
        (["--teacher.checkpoint_dir", "[a, b]"], ["a", "b"]),
        (["--teacher", "{checkpoint_dir: [a, b]}"], ["a", "b"]),
        ([], []),
    ],
)
def test_one_teacher_or_several_enter_as_a_list(argv, expected):
    """`--teacher.checkpoint_dir DIR` (one teacher, as the README types it), a list on the command line or in YAML: a
    list of paths inside, and the same list read back from the hyperparameters a run records."""
    from jsonargparse import CLI

    from litgpt_vocagnolm.training.checkpoints import hyperparameters
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    def command(teacher: TeacherArgs = TeacherArgs()) -> TeacherArgs:
        return teacher

    teacher = CLI(command, args=argv)
    assert teacher.checkpoint_dirs == [Path(p) for p in expected] and teacher.caches == []
    recorded = hyperparameters({"teacher": teacher})["teacher"]
    assert recorded["checkpoint_dir"] == (expected or None)
    assert TeacherArgs(**recorded).checkpoint_dirs == teacher.checkpoint_dirs
