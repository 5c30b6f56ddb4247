"""`vocagnolm evaluate`'s generation and result tables: continuous batching against a naive greedy loop (no KV cache,
one question at a time, the whole text decoded at every step), the incremental decoding of stop strings, the default
batch, and results that later runs add to without losing them."""

import csv
import gzip
import json
import random
from pathlib import Path

import pytest
import torch
from conftest import QWEN, TINYLLAMA, make_checkpoint, tiny_config
from tokenizers import Tokenizer as HFTokenizer

from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.evaluation import evaluate as evaluate_module
from litgpt_vocagnolm.evaluation import generation as generation_module
from litgpt_vocagnolm.evaluation.evaluate import evaluate, evaluate_task, load_model
from litgpt_vocagnolm.evaluation.generation import Continuation, default_batch_size, generate_greedy
from litgpt_vocagnolm.evaluation.math_tasks import (
    DATA_DIR,
    STOP_STRINGS,
    TASKS,
    build_prompt,
    extract_answer,
    is_correct,
    load_examples,
    load_prompt,
    parse_question,
)


@torch.inference_mode()
def naive_greedy(model, tokenizer, prompt: list[int], max_new_tokens: int, stop_strings=()) -> str:
    """One question alone, every step a forward of the whole sequence; the text is decoded whole at every step, and
    generation stops at EOS, at a stop string, or after `max_new_tokens`; the text is cut at the first stop string."""
    ids, new, text = list(prompt), [], ""
    head, model.lm_head = model.lm_head, torch.nn.Identity()  # on the last position only: (T, vocab) logits are slow
    try:
        for _ in range(max_new_tokens):
            token = int(head(model(torch.tensor([ids]))[0, -1]).argmax())
            if token == tokenizer.eos_id:
                break
            ids.append(token)
            new.append(token)
            text = tokenizer.decode(torch.tensor(new))
            if any(stop in text for stop in stop_strings):
                break
    finally:
        model.lm_head = head
    return text[: min((text.index(stop) for stop in stop_strings if stop in text), default=len(text))]


def task_prompts(tokenizer, names: list[str], per_task: int) -> list[list[int]]:
    """Real few-shot prompts: the first questions of each task."""
    prompts = []
    for name in names:
        task, shots = TASKS[name], load_prompt(TASKS[name])
        for example in load_examples(task)[:per_task]:
            prompts.append(tokenizer.encode(build_prompt(parse_question(example, task), task, shots)).tolist())
    return prompts


@pytest.fixture(scope="module")
def tinyllama_model(tmp_path_factory):
    config = tiny_config("tiny", 32000, n_layer=2, n_embd=64, block_size=1024)
    return load_model(make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tinyllama", config, TINYLLAMA), "32-true")


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    config = tiny_config("tiny", 151665, n_layer=2, n_embd=64, block_size=1024)
    return load_model(make_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen", config, QWEN), "32-true")


@pytest.mark.parametrize("model_fixture", ["tinyllama_model", "qwen_model"])
def test_continuous_batching_matches_a_naive_loop_one_question_at_a_time(model_fixture, request):
    model, tokenizer = request.getfixturevalue(model_fixture)
    # Real prompts of 120 to ~1,000 tokens (GSM8K's 8 shots, MathQA's question alone is short), and a short one.
    prompts = task_prompts(tokenizer, ["gsm8k", "minerva_math", "mmlu_stem"], per_task=2)
    prompts += [tokenizer.encode("Question: What is 2 + 2?\nAnswer:").tolist(), prompts[0][-120:]]
    free = [naive_greedy(model, tokenizer, prompt, 12) for prompt in prompts]
    # Stop strings that some rows write at different steps and others never do, besides the harness's.
    counts = {}
    for text in free:
        for piece in {text[i : i + 2] for i in range(2, len(text) - 2)}:
            counts[piece] = counts.get(piece, 0) + 1
    stops = [piece for piece, n in sorted(counts.items()) if n == 2 and piece.strip()][:2] + list(STOP_STRINGS)
    budget = {len(prompt): min(12, 1024 - len(prompt)) for prompt in prompts}
    expected = [naive_greedy(model, tokenizer, prompt, budget[len(prompt)], stops) for prompt in prompts]
    cut = [len(e) for e, f in zip(expected, free) if e != f]
    assert len(set(cut)) >= 2 and len(cut) < len(prompts)  # rows end at different steps, some run their budget

    generations = generate_greedy(model, tokenizer, prompts, 12, stops, batch_size=3)

    assert [generation.text for generation in generations] == expected
    assert all(0 < generation.new_tokens <= 12 for generation in generations)


def test_each_question_gets_its_own_budget_within_the_block(tinyllama_model, monkeypatch):
    """MATH-500's first prompts, 720 to 1,085 tokens, in a block of 760: 24 new tokens for the shortest, fewer where
    the block ends first, and one for the prompts cut to fit; answers and scores as the naive loop gives them."""
    model, tokenizer = tinyllama_model
    monkeypatch.setattr(model.config, "block_size", 760)
    task = TASKS["minerva_math"]
    prompts = [prompt[-759:] for prompt in task_prompts(tokenizer, ["minerva_math"], 8)]
    free = [generation.text for generation in generate_greedy(model, tokenizer, prompts, 24, batch_size=8)]
    stop = next(text[5:7] for text in free if len(text) > 8)  # one row writes it: it ends early
    monkeypatch.setattr(evaluate_module, "STOP_STRINGS", (*STOP_STRINGS, stop))

    rows = evaluate_task(model, tokenizer, task, DATA_DIR, limit=8, batch_size=3, max_new_tokens=24)

    shots, lengths = load_prompt(task), []
    for row, example in zip(rows, load_examples(task)[:8]):
        prompt = tokenizer.encode(build_prompt(parse_question(example, task), task, shots)).tolist()[-759:]
        lengths.append(len(prompt))
        generation = naive_greedy(model, tokenizer, prompt, min(24, 760 - len(prompt)), (*STOP_STRINGS, stop))
        assert row["generation"] == generation.strip()
        assert row["pred"] == extract_answer(generation.strip(), task)
        assert row["score"] == is_correct(row["pred"], row["gt"])
    assert [row["new_tokens"] for row in rows if row.get("prompt_truncated")] == [1, 1, 1]
    budgets = {min(24, 760 - length) for length in lengths}
    assert {1, 24} < budgets  # some cut by the block, some not: the questions were batched together


def test_a_waiting_question_takes_the_row_of_one_that_ended(tinyllama_model, monkeypatch):
    """Two rows; a long prompt that the block leaves 2 new tokens, then two short ones with 8 each. The long one ends
    after one step and the third question takes its row: 7 steps of two rows, then the third's last. Fixed batches
    of two would take 7 steps (the first short question's 8 tokens) and 7 more for the third."""
    model, tokenizer = tinyllama_model
    widths = []
    forward = generation_module.RowKVCache.forward

    def spy(cache, input_pos, k, v):
        if cache is model.transformer.h[0].attn.kv_cache and input_pos.dim() == 2:  # a decode step of the batch
            widths.append(k.shape[0])
        return forward(cache, input_pos, k, v)

    monkeypatch.setattr(generation_module.RowKVCache, "forward", spy)
    prompts = [(task_prompts(tokenizer, ["gsm8k"], 1)[0] * 2)[-1022:]]
    prompts += [tokenizer.encode(text).tolist() for text in ("Question: 1 + 1?", "Question: 2 + 3?")]

    generations = generate_greedy(model, tokenizer, prompts, 8, batch_size=2)

    assert [generation.new_tokens for generation in generations] == [2, 8, 8]
    assert widths == [2] * 7 + [1]


def test_sliding_window_shorter_than_the_sequence_is_refused(tinyllama_model, monkeypatch):
    model, tokenizer = tinyllama_model
    monkeypatch.setattr(model.config, "sliding_window_size", 8)
    monkeypatch.setattr(model.config, "sliding_window_indices", [1, 1])
    with pytest.raises(InvalidArgument, match="a sliding window of 8 tokens, and a question here takes 10 prompt"):
        generate_greedy(model, tokenizer, [[1, 2, 3, 4, 5]], max_new_tokens=5)


@pytest.mark.parametrize("tokenizer_dir", [TINYLLAMA, QWEN])
def test_stop_strings_are_found_in_the_new_text_at_the_step_the_whole_text_holds_them(tokenizer_dir):
    """Random tokens, with byte tokens and the pieces of stop strings among them, decoded a few at a time: a stop
    string is found at the first step where the whole decode holds it, and where no unfinished or invalid bytes are
    about, the text is the whole decode."""
    files = {path.name: path for path in tokenizer_dir.iterdir()}
    if "tokenizer.json" in files:
        tokenizer = HFTokenizer.from_file(str(files["tokenizer.json"]))
    else:
        tokenizer = HFTokenizer.from_str(gzip.decompress(files["tokenizer.json.gz"].read_bytes()).decode())
    stops = [*STOP_STRINGS, "\n", "é", "数学", " 1 +"]
    phrases = [tokenizer.encode(text, add_special_tokens=False).ids for text in ("1 + 1 = 2 ✓ é 数学", *stops)]
    phrases[1 + stops.index("</s>")] = [tokenizer.token_to_id(c) for c in "</s>"]  # as text, not TinyLlama's EOS
    vocab, rng, found = tokenizer.get_vocab_size(), random.Random(0), {}
    for _ in range(400):
        # Whole phrases, their tokens, byte tokens (TinyLlama's <0x00>..<0xFF> are ids 3..258; Qwen's byte-level
        # tokens are all over its vocabulary) and any token.
        tokens = []
        while len(tokens) < 24:
            phrase = rng.choice(phrases)
            tokens += rng.choice([phrase, [rng.choice(phrase)], [rng.randrange(3, 259)], [rng.randrange(vocab)]])
        for stop in stops:
            continuation = Continuation()
            for n, token in enumerate(tokens, 1):
                whole = tokenizer.decode(tokens[:n])
                assert continuation.add(token, tokenizer.decode, [stop]) == (stop in whole)
                if stop in whole:
                    found[stop] = found.get(stop, 0) + 1
                    break
                if "\ufffd" not in whole:
                    assert continuation.text == whole
    assert set(found) == set(stops)  # each is found somewhere


def test_default_batch_is_what_free_memory_holds(tinyllama_model, monkeypatch, capsys):
    model, _ = tinyllama_model
    config = model.config  # 2 layers, 2 heads of 32 (as many key-value heads), a block of 1024, float32
    cache = 2 * config.n_layer * 2 * 1024 * 32 * 4  # keys and values of every layer
    buffers = ((2 * 32 + 1) * 2 * 1024 + 32000) * 4  # one layer's keys, values and scores per head; the logits
    page = 4096
    pages = {"SC_PAGE_SIZE": page}
    monkeypatch.setattr(generation_module.os, "sysconf", lambda name: pages[name])
    pages["SC_AVPHYS_PAGES"] = (10 * (cache + buffers) // 8 * 10 + page) // page  # 80% of it holds 10 rows
    assert default_batch_size(model) == 10
    assert "Decoding 10 questions at a time" in capsys.readouterr().out
    pages["SC_AVPHYS_PAGES"] = 10**9 // page * 100  # 100 GB: the bound on CPU
    assert default_batch_size(model) == generation_module.CPU_BATCH_SIZE
    pages["SC_AVPHYS_PAGES"] = 1
    with pytest.raises(MemoryError, match="decoding one question needs 2 MiB, more than 80% of the 0 MiB free"):
        default_batch_size(model)


def test_the_gpu_default_batch_decodes_every_question_at_once_as_one_at_a_time(tmp_path, monkeypatch, capsys):
    """`evaluate` at its defaults as on a GPU, forced on this CPU: the default batch is all the rows the device's
    free memory holds, uncapped (a CPU stops at `CPU_BATCH_SIZE`). Here free memory holds 40 rows: the 36 questions
    are decoded together in one batch, and each one's prediction is what decoding it alone gives."""
    config = tiny_config("tiny", 32000, n_layer=2, n_embd=32, block_size=1024)
    checkpoint = make_checkpoint(tmp_path / "tiny", config, TINYLLAMA)
    # A row as the test above counts it: a bf16 cache (evaluate's default precision), float32 buffers.
    per_row = 2 * 2 * 2 * 1024 * 16 * 2 + ((2 * 16 + 1) * 2 * 1024 + 32000) * 4
    monkeypatch.setattr(generation_module, "device_memory", lambda device: (40 * per_row * 10 // 8, "an H100", None))
    questions = generation_module.CPU_BATCH_SIZE + 4
    for out, options in (("gpu", {}), ("one", {"batch_size": 1})):
        evaluate(checkpoint, tasks="gsm8k", limit=questions, max_new_tokens=4, out_dir=tmp_path / out, **options)
        if out == "gpu":
            assert "Decoding 40 questions at a time: a row" in capsys.readouterr().out
    together, alone = (
        [json.loads(line) for line in open(next((tmp_path / out).glob("gsm8k.*.jsonl")))] for out in ("gpu", "one")
    )
    assert len(together) == questions and together == alone


# Results kept across runs


@pytest.fixture(scope="module")
def small_test_sets(tmp_path_factory) -> Path:
    """GSM8K and SVAMP test files of 3 questions each, in the harness layout."""
    data_dir = tmp_path_factory.mktemp("data")
    for name in ("gsm8k", "svamp"):
        (data_dir / name).mkdir()
        lines = (DATA_DIR / TASKS[name].file).read_text(encoding="utf-8").splitlines()[:3]
        (data_dir / TASKS[name].file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data_dir


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory) -> Path:
    config = tiny_config("tiny", 32000, n_layer=2, n_embd=64, block_size=1024)
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "small", config, TINYLLAMA)


def results(out: Path) -> list[tuple]:
    with open(out / "results.csv", newline="") as f:
        return [(row["task"], row["limit"], row["questions"], row["max_new_tokens"]) for row in csv.DictReader(f)]


def test_later_runs_keep_earlier_results_and_limited_runs_say_so(small_checkpoint, small_test_sets, tmp_path):
    out = tmp_path / "out"

    def run(tasks, limit=None, max_new_tokens=3, checkpoint=small_checkpoint):
        evaluate(
            checkpoint,
            tasks=tasks,
            data_dir=small_test_sets,
            limit=limit,
            max_new_tokens=max_new_tokens,
            out_dir=out,
            precision="32-true",
        )

    run("gsm8k")
    (gsm8k_file,) = out.glob("gsm8k.*.jsonl")
    gsm8k = gsm8k_file.read_bytes()
    run("svamp")  # another task: a row beside GSM8K's
    assert results(out) == [("gsm8k", "", "3", "3"), ("svamp", "", "3", "3")]
    run("gsm8k", limit=1)  # a quick check: its own predictions and row, the whole run's kept
    assert gsm8k_file.read_bytes() == gsm8k
    (limited_file,) = out.glob("gsm8k.limit-1.*.jsonl")
    assert len(limited_file.read_text().splitlines()) == 1
    assert results(out) == [("gsm8k", "", "3", "3"), ("gsm8k", "1", "1", "3"), ("svamp", "", "3", "3")]
    run("svamp")  # the same run again replaces its own row
    assert results(out) == [("gsm8k", "", "3", "3"), ("gsm8k", "1", "1", "3"), ("svamp", "", "3", "3")]
    run("svamp", max_new_tokens=2)  # other settings: a row of their own
    both = [("gsm8k", "", "3", "3"), ("gsm8k", "1", "1", "3"), ("svamp", "", "3", "3"), ("svamp", "", "3", "2")]
    assert results(out) == both and len(list(out.glob("svamp.*.jsonl"))) == 2
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {row["checkpoint"] for row in rows} == {str(small_checkpoint)} and all(row["date"] for row in rows)
    whole = [row for row in rows if row["limit"] == "" and row["max_new_tokens"] == "3"]
    predictions = {row["task"]: [json.loads(line) for line in open(out / row["predictions"])] for row in whole}
    accuracy = {task: 100 * sum(p["score"] for p in rows) / 3 for task, rows in predictions.items()}
    assert [float(row["accuracy"]) for row in whole] == pytest.approx([accuracy["gsm8k"], accuracy["svamp"]])

    table_1 = (out / "results.md").read_text().splitlines()[:3]
    # Table 1 takes each task's whole run; nothing in it is limited, so nothing is marked. The checkpoint's runs with
    # 2 new tokens have a row of their own, below.
    assert table_1[0] == "| model | GSM8K | SVAMP | AVG |"
    average = (accuracy["gsm8k"] + accuracy["svamp"]) / 2
    label = f"{small_checkpoint} (max_new_tokens 3, 32-true, {small_test_sets})"
    assert table_1[2] == f"| {label} | {accuracy['gsm8k']:.1f} | {accuracy['svamp']:.1f} | {average:.1f} |"

    other = make_checkpoint(
        tmp_path / "other", tiny_config("tiny", 32000, n_layer=2, n_embd=64, block_size=1024), TINYLLAMA, seed=1
    )
    run("svamp", limit=2, checkpoint=other)  # only a limited run of this checkpoint: marked
    lines = (out / "results.md").read_text().splitlines()
    limited = next(line for line in lines if line.startswith(f"| {other} |"))
    assert limited.endswith("*") or limited.endswith("* |")
    assert limited.split("|")[2].strip() == "" and limited.split("|")[3].strip().endswith("*")
    assert any(line.startswith("\\* A `--limit` run") for line in lines)
    assert results(out)[-1] == ("svamp", "2", "2", "3")


def test_an_earlier_results_table_of_another_layout_is_refused_before_the_model_loads(
    small_checkpoint, small_test_sets, tmp_path, monkeypatch
):
    monkeypatch.setattr(evaluate_module, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    (tmp_path / "results.csv").write_text("model,GSM8K,AVG\nckpt,10.0,10.0\n")
    with pytest.raises(FileExistsError, match="results.csv has columns .* move it away to keep it"):
        evaluate(small_checkpoint, tasks="gsm8k", data_dir=small_test_sets, out_dir=tmp_path)
    assert (tmp_path / "results.csv").read_text() == "model,GSM8K,AVG\nckpt,10.0,10.0\n"


def test_help_says_that_results_are_kept_and_how_limited_runs_are_named(capsys):
    from jsonargparse import CLI

    with pytest.raises(SystemExit):
        CLI(evaluate, args=["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Earlier results in `out_dir` are kept" in text and "`<task>.limit-N.<id>.jsonl`" in text
    assert "within the model's block size after its own prompt" in text
