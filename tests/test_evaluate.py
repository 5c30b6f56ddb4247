"""`vocagnolm evaluate`: harness grading on the nine real test sets, batched greedy decoding against LitGPT's own,
bits per byte against an independent expectation, the whole command on a tiny model, and bad input."""

import csv
import gzip
import inspect
import json
import math
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from litgpt import GPT, Config
from litgpt.generate.base import generate
from litgpt.utils import save_config
from tokenizers import Tokenizer as HFTokenizer

from litgpt_vocagnolm import evaluate as evaluate_module
from litgpt_vocagnolm import math_tasks
from litgpt_vocagnolm.evaluate import (
    bits_per_byte,
    bits_per_byte_of_documents,
    evaluate,
    generate_greedy,
    load_model,
)
from litgpt_vocagnolm.math_tasks import (
    TASKS,
    build_prompt,
    extract_answer,
    is_correct,
    load_examples,
    load_prompt,
    math_equal,
    parse_ground_truth,
    parse_question,
)

TOKENIZERS = Path(__file__).parent / "fixtures" / "tokenizers"
TABLE_1 = ["GSM8K", "MATH", "SVAMP", "ASDiv", "MAWPS", "TabMWP", "MathQA", "MMLU-STEM", "SAT"]


def make_checkpoint(
    path: Path, tokenizer: str, *, block_size: int, padded_vocab_size: int, uniform: bool = False
) -> Path:
    """A random 1-layer LitGPT checkpoint dir with a real tokenizer; `uniform` zeroes the head: all logits equal."""
    torch.manual_seed(0)
    config = Config(
        name="tiny", block_size=block_size, n_layer=1, n_head=4, n_query_groups=2, n_embd=32,
        vocab_size=padded_vocab_size, padded_vocab_size=padded_vocab_size,
    )  # fmt: skip
    model = GPT(config)
    if uniform:
        torch.nn.init.zeros_(model.lm_head.weight)
    path.mkdir(parents=True)
    torch.save(model.state_dict(), path / "lit_model.pth")
    save_config(config, path)
    for file in (TOKENIZERS / tokenizer).iterdir():
        if file.name == "tokenizer.json.gz":
            (path / "tokenizer.json").write_bytes(gzip.decompress(file.read_bytes()))
        elif file.name != "LICENSE":
            shutil.copy(file, path / file.name)
    return path


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    # The longest 4/8-shot prompt of the first 5 questions is ~1,700 TinyLlama tokens.
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    return make_checkpoint(path, "tinyllama-1.1b", block_size=2048, padded_vocab_size=32000)


# Grading: the gold answers, written the way the prompts teach the model to write them, must score.


def _last_boxed(solution: str) -> str:
    start = solution.index("{", solution.rindex("\\boxed"))
    depth = 0
    for end in range(start, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[end], 0)
        if depth == 0:
            return solution[start + 1 : end]
    raise ValueError(solution)


def gold_generation(example: dict, task: str) -> str:
    if task == "gsm8k":
        reasoning, answer = example["answer"].split("####")
        return f"{reasoning.strip()}\nThe answer is {answer.strip()}."
    if task == "math":
        boxed = _last_boxed(example["solution"]) if "\\boxed" in example["solution"] else ""
        return f"{example['solution']}\nFinal Answer: The final answer is ${boxed}$. I hope it is correct."
    if task == "svamp":
        return f"{example['Equation']} = {example['Answer']}. The answer is {example['Answer']}."
    if task == "asdiv":  # "9 (apples)": the unit annotation is not part of the answer
        return f"{example['formula']}. The answer is {example['answer'].split(' (')[0]}."
    if task == "mawps":
        return f"The answer is {example['target']}."
    if task == "tabmwp":
        return f"{example['solution'].strip()} The answer is {example['answer']}."
    if task == "mathqa":
        return f"{example['rationale']}\nFinal Answer: The final answer is ({example['correct'].upper()})."
    letter = "ABCD"[example["answer"]] if task == "mmlu_stem" else example["Answer"]
    return f"Final Answer: The final answer is ({letter})."


MATH_EXAMPLES = load_examples(TASKS["math"])
# Each miss is explained; together they are all of them.
EXPECTED_MISSES = {
    # The harness reads the first "final answer is $...$. I hope" span. These 34 solutions already say
    # "final answer is $\boxed{..}$", so the span runs from their sentence to the appended Minerva line. And
    # problem 4060's solution has no \boxed{} on purpose, so the harness's reference is the prose after "boxed".
    "math": {e["idx"] for e in MATH_EXAMPLES if "final answer is $" in e["solution"]} | {4060},
    # References drop "(...)" as a unit annotation ("9 (apples)"), which turns 1313's "-(1/3)" into "-". And in
    # 1977's "6:01:00 p.m.", predictions are normalized twice, references once: "6:01:00p" vs "6:01:00p.".
    "asdiv": {1313, 1977},
    # The harness takes the first "answer is <a-e>": these rationales say "the answer is c" on the way to d,
    # "the answer is about 1/3", "answer is asked in cents".
    "mathqa": {176, 181, 451},
}


@pytest.mark.parametrize("task", TASKS)
def test_gold_answers_score_on_the_real_test_sets(task):
    examples = load_examples(TASKS[task])
    misses = set()
    for example in examples:
        prediction = extract_answer(gold_generation(example, task), TASKS[task])
        if not is_correct(prediction, parse_ground_truth(example, TASKS[task])):
            misses.add(example["idx"])
    assert misses == EXPECTED_MISSES.get(task, set())
    sizes = {"gsm8k": 1319, "math": 5000, "svamp": 1000, "asdiv": 2215, "mawps": 2065, "tabmwp": 1000, "mathqa": 1000,
             "mmlu_stem": 3018, "sat_math": 32}  # fmt: skip
    assert len(examples) == sizes[task]
    assert len(EXPECTED_MISSES.get(task, ())) / len(examples) < 0.01


def test_math_reference_solutions_score_through_boxed():
    task = TASKS["math"]
    assert all(is_correct(extract_answer(e["solution"], task), parse_ground_truth(e, task)) for e in MATH_EXAMPLES)


@pytest.mark.parametrize(
    "generation, task, expected",
    [
        ("She spent 1,000 + 234 = 1,234 dollars. The answer is 1,234.", "gsm8k", "1,234"),  # graded as 1234
        ("She ate 3 apples, then 5 more", "gsm8k", "5"),  # no "The answer is": the last number
        ("The answer is $18.00.", "gsm8k", "18"),
        ("The answer is 50%.", "gsm8k", "50"),
        ("The answer is twenty one.", "gsm8k", "21"),
        ("The answer is 12 inches.", "gsm8k", "12"),
        ("so $x = \\boxed{\\dfrac{1}{2}}$ and we are done.", "math", "\\frac{1}{2}"),
        ("Final Answer: The final answer is $[2,5)$. I hope it is correct.", "math", "[2,5)"),
        ("Final Answer: The final answer is $5 \\text{ cm}$. I hope it is correct.", "math", "5"),
        ("The final answer is (B).", "mmlu_stem", "B"),
        ("the choice is c, since", "mathqa", "C"),
        ("I cannot decide.", "sat_math", ""),
        ("No idea.\n\nProblem:\nThe answer is (A)", "mathqa", ""),  # a new problem is not this one's answer
    ],
)
def test_extract_answer(generation, task, expected):
    assert extract_answer(generation, TASKS[task]) == expected


@pytest.mark.parametrize(
    "prediction, reference, equal",
    [
        ("1,234", "1234", True),
        ("0.5", "\\frac{1}{2}", True),  # symbolic, through sympy's LaTeX parser
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
        ("-\\\\frac{2}{3}", "-\\frac{2}{3}", True),  # doubled backslashes, as the Minerva shots write them
        ("50", "0.5", True),  # a percentage of the reference
        ("0.50001", "0.5", True),  # within 1e-4 relative
        ("0.51", "0.5", False),
        ("(1,\\frac{9}{2})", "(1,4.5)", True),  # element-wise
        ("x=3", "3", True),
        ("y=2x+1", "2x-y=-1", True),  # equations up to sides and sign
        ("2", "3", False),
        ("", "0", False),
    ],
)
def test_math_equal(prediction, reference, equal):
    assert math_equal(prediction, reference) is equal


def test_is_correct_gives_up_after_the_time_limit(monkeypatch):
    monkeypatch.setattr(math_tasks, "math_equal", lambda prediction, reference: time.sleep(5) or True)
    start = time.perf_counter()
    assert is_correct("1", "2", timeout=0.05) is False
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize(
    "task, question",
    [
        ("svamp", "There are 87 oranges and 290 bananas in Philip's collection. If the bananas are organized into 2 "
                  "groups and oranges are organized into 93 groups. How big is each group of bananas?"),
        ("asdiv", "Seven red apples and two green apples are in the basket. How many apples are in the basket?"),
        ("mathqa", "If log 8 x + log 8 1 / 6 = 1 / 3 , then the value of x is :\nWhat of the following is the right "
                   "choice? Explain your answer.\n(A) 12, (B) 16, (C) 18, (D) 24, (E) 26"),
        ("sat_math", "The graph of the polynomial function $f$, where $y=f(x)$, has $x$-intercepts of $(-6,0)$ and "
                     "$(6,0)$. Which of the following must be true?\nWhat of the following is the right choice? "
                     "Explain your answer.\n(A) $f(-6)=0$ (B) $f(6)=-6$ (C) $f(-6)=6$ (D) $f(0)=-6$"),
        ("tabmwp", "Read the following table regarding \"Coin collections\" and answer a question:\nName | Number of "
                   "coins\nBraden | 76\nCamilla | 94\nRick | 86\nMary | 84\nHector | 80\nDevin | 83\nEmily | 82\n"
                   "Avery | 87\nSome friends discussed the sizes of their coin collections. What is the mean of the "
                   "numbers?"),
    ],
)  # fmt: skip
def test_first_question_reads_as_in_the_harness(task, question):
    assert parse_question(load_examples(TASKS[task])[0], TASKS[task]) == question


def test_prompts_have_the_papers_shots():
    question = "What is 1 + 1?"
    gsm8k = build_prompt(question, TASKS["gsm8k"], load_prompt(TASKS["gsm8k"]))
    assert gsm8k.startswith("Question: There are 15 trees in the grove.")
    assert gsm8k.endswith(".\n\n\nQuestion: What is 1 + 1?\nAnswer:")
    assert gsm8k.count("Question:") == 8 + 1
    for task, shots in (("math", 4), ("mathqa", 4), ("mmlu_stem", 4), ("sat_math", 4)):
        prompt = build_prompt(question, TASKS[task], load_prompt(TASKS[task]))
        assert prompt.count("Problem:\n") == shots + 1 and prompt.endswith(".\n\n\nProblem:\nWhat is 1 + 1?\nSolution:")
    for task in ("svamp", "asdiv", "mawps", "tabmwp"):
        assert load_prompt(TASKS[task]) == load_prompt(TASKS["gsm8k"])


# Generation


def test_batched_greedy_decoding_matches_litgpt_one_prompt_at_a_time(tiny_checkpoint):
    model, tokenizer = load_model(tiny_checkpoint, precision="32-true")
    long = build_prompt("What is 2 + 2?", TASKS["gsm8k"], load_prompt(TASKS["gsm8k"]))
    texts = ["Question: 2 + 2?", "Olivia has $23. She bought five bagels for $3 each.", "Hi", long]
    prompts = [tokenizer.encode(text).tolist() for text in texts]
    # Different lengths, so left padding matters, and one prompt prefilled in several chunks.
    assert len({len(p) for p in prompts}) == 4 and len(prompts[-1]) > 512

    batched = generate_greedy(model, tokenizer, prompts, max_new_tokens=12)

    for prompt, ours in zip(prompts, batched):
        model.set_kv_cache(batch_size=1)
        ids = generate(model, torch.tensor(prompt), len(prompt) + 12, temperature=0.0, eos_id=tokenizer.eos_id)
        model.clear_kv_cache()
        assert ours == tokenizer.decode(ids[len(prompt) :])
        assert len(ours) > 0


def test_rows_stop_at_stop_strings_and_leave_the_others_alone(tiny_checkpoint):
    model, tokenizer = load_model(tiny_checkpoint, precision="32-true")
    prompts = [tokenizer.encode(text).tolist() for text in ("The answer is", "Problem:\nFind x.", "1, 2, 3,")]
    free = generate_greedy(model, tokenizer, prompts, max_new_tokens=16)
    # A stop string that the first row writes early and the others never do.
    stop = next(
        free[0][i : i + 3] for i in range(1, len(free[0]) - 3) if all(free[0][i : i + 3] not in t for t in free[1:])
    )

    stopped = generate_greedy(model, tokenizer, prompts, max_new_tokens=16, stop_strings=[stop])

    assert stopped == [free[0][: free[0].index(stop)], free[1], free[2]]


def test_sliding_window_shorter_than_the_sequence_is_refused(tiny_checkpoint):
    model, tokenizer = load_model(tiny_checkpoint, precision="32-true")
    model.config.sliding_window_size, model.config.sliding_window_indices = 8, [1]
    with pytest.raises(NotImplementedError, match="sliding-window attention over 8 tokens with 10 prompt and new"):
        generate_greedy(model, tokenizer, [[1, 2, 3, 4, 5]], max_new_tokens=5)


# Bits per byte


def test_bits_per_byte():
    assert bits_per_byte(8 * math.log(2), 8) == pytest.approx(1.0)
    assert bits_per_byte(0.0, 3) == 0.0
    with pytest.raises(ValueError, match="positive number of bytes"):
        bits_per_byte(1.0, 0)


TEXT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether? Natalia sold 48/2 = 24 clips in May. 48 + 24 = 72. "
    "Naïve bounds: $\\pi \\approx 3.14159$ – and $\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}$. 数学 ∫ e^x dx.\n"
)


@pytest.mark.parametrize("tokenizer, padded_vocab_size", [("tinyllama-1.1b", 32000), ("qwen2.5", 151680)])
def test_bits_per_byte_of_a_uniform_model_is_log2_vocab_times_tokens_per_byte(tmp_path, tokenizer, padded_vocab_size):
    checkpoint = make_checkpoint(tmp_path / "ckpt", tokenizer, block_size=16, padded_vocab_size=padded_vocab_size,
                                 uniform=True)  # fmt: skip
    (tmp_path / "held_out.jsonl").write_text(json.dumps({"text": TEXT}) + "\n" + json.dumps({"text": TEXT[:40]}))
    # Counted with the tokenizers library, not through LitGPT: every text token is predicted once.
    hf = HFTokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tokens = sum(len(hf.encode(text, add_special_tokens=False).ids) for text in (TEXT, TEXT[:40]))
    n_bytes = len(TEXT.encode("utf-8")) + len(TEXT[:40].encode("utf-8"))
    assert tokens > 2 * 16  # several windows of block_size predictions

    evaluate(checkpoint, bpb=tmp_path / "held_out.jsonl", out_dir=tmp_path / "out", precision="32-true")

    (row,) = list(csv.DictReader(open(tmp_path / "out" / "bpb.csv")))
    assert (int(row["tokens"]), int(row["bytes"]), int(row["documents"])) == (tokens, n_bytes, 2)
    assert float(row["bits_per_byte"]) == pytest.approx(math.log2(padded_vocab_size) * tokens / n_bytes, rel=1e-6)


def test_bits_per_byte_matches_scoring_each_window_alone(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt", "tinyllama-1.1b", block_size=64, padded_vocab_size=32000)
    model, tokenizer = load_model(checkpoint, precision="32-true")
    documents = [TEXT * 2, TEXT[:50], "x"]  # ~200 tokens: 4 windows of 64; a short one; one token
    result = bits_per_byte_of_documents(model, tokenizer, documents, batch_size=3)

    nats, tokens, block = 0.0, 0, model.config.block_size
    for text in documents:
        ids = torch.tensor([tokenizer.bos_id] + tokenizer.encode(text, bos=False).tolist())
        for start in range(0, len(ids) - 1, block):
            window = ids[start : start + block + 1]
            with torch.no_grad():
                logits = model(window[None, :-1])[0]
            nats += F.cross_entropy(logits, window[1:], reduction="sum").item()
            tokens += len(window) - 1
    n_bytes = sum(len(text.encode("utf-8")) for text in documents)
    assert (result["tokens"], result["bytes"]) == (tokens, n_bytes)
    assert result["bits_per_byte"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)


# The command


def test_every_task_runs_end_to_end_and_writes_the_tables(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    evaluate(tiny_checkpoint, limit=5, batch_size=3, max_new_tokens=4, out_dir=out, precision="32-true")

    with open(out / "results.csv") as f:
        header, values = list(csv.reader(f))
    assert header == ["model", *TABLE_1, "AVG"] and values[0] == str(tiny_checkpoint)
    markdown = (out / "results.md").read_text().splitlines()
    assert markdown[0] == "| model | " + " | ".join(TABLE_1) + " | AVG |"
    accuracies = []
    for name, column in zip(TASKS, TABLE_1):
        rows = [json.loads(line) for line in open(out / f"{name}.jsonl")]
        assert [row["idx"] for row in rows] == [e["idx"] for e in load_examples(TASKS[name])[:5]]
        assert all(row["pred"] == extract_answer(row["generation"], TASKS[name]) for row in rows)
        accuracies.append(100 * sum(row["score"] for row in rows) / 5)
        assert values[header.index(column)] == f"{accuracies[-1]:.1f}"
    assert values[-1] == f"{sum(accuracies) / 9:.1f}"


def test_command_line_parses_tasks_and_bpb_files(tiny_checkpoint):
    from jsonargparse import CLI

    seen = {}

    def spy(**kwargs):  # `evaluate`'s parameters and docstring, so jsonargparse builds the same parser
        seen.update(kwargs)

    spy.__signature__, spy.__doc__ = inspect.signature(evaluate), evaluate.__doc__
    CLI(spy, args=[str(tiny_checkpoint), "--tasks", "gsm8k,sat_math", "--bpb", "[a.txt,b.jsonl]", "--limit", "2"])
    assert (seen["tasks"], seen["bpb"], seen["limit"]) == ("gsm8k,sat_math", [Path("a.txt"), Path("b.jsonl")], 2)
    CLI(spy, args=[str(tiny_checkpoint), "--bpb", "a.txt"])
    assert (seen["tasks"], Path(seen["bpb"])) == (None, Path("a.txt"))


# Bad input: a clear error, before the model loads.


@pytest.fixture
def no_model_load(monkeypatch):
    monkeypatch.setattr(evaluate_module, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


def test_unknown_task_lists_the_tasks(tiny_checkpoint, no_model_load):
    with pytest.raises(ValueError, match=re.escape("unknown task(s) 'gsm9k'; available: gsm8k, math, svamp, asdiv,")):
        evaluate(tiny_checkpoint, tasks="gsm8k,gsm9k")


def test_missing_test_file_lists_what_the_data_dir_holds(tiny_checkpoint, tmp_path, no_model_load):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match=r"lacks math/test.jsonl \(task math\); it holds: gsm8k/test.jsonl"):
        evaluate(tiny_checkpoint, tasks="gsm8k,math", data_dir=tmp_path)


def test_checkpoint_without_tokenizer_lists_what_it_holds(tiny_checkpoint, tmp_path, no_model_load):
    checkpoint = tmp_path / "weights_only"
    checkpoint.mkdir()
    for name in ("lit_model.pth", "model_config.yaml"):
        shutil.copy(tiny_checkpoint / name, checkpoint / name)
    lacks = "lacks ['tokenizer.json or tokenizer.model', 'tokenizer_config.json'] (it holds ['lit_model.pth', 'model_"
    with pytest.raises(FileNotFoundError, match=re.escape(lacks)):
        evaluate(checkpoint)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        evaluate(tmp_path / "nowhere")


def test_missing_latex_parser_is_named_with_its_fix(tiny_checkpoint, monkeypatch, no_model_load):
    from sympy.parsing.latex import _parse_latex_antlr

    monkeypatch.setattr(_parse_latex_antlr, "version", lambda package: "4.13.2")  # sympy accepts ANTLR 4.11 only
    with pytest.raises(ImportError, match=re.escape("pip install 'antlr4-python3-runtime==4.11.*'")):
        evaluate(tiny_checkpoint, tasks="gsm8k")
    with pytest.raises(ImportError):  # grading itself never quietly drops symbolic equality
        math_equal("0.5", "\\frac{1}{2}")


def test_bad_bpb_files(tiny_checkpoint, tmp_path, no_model_load):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate(tiny_checkpoint, bpb=tmp_path / "missing.txt")
    (tmp_path / "table.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"unsupported file type '.csv'; use .txt, .jsonl, .parquet"):
        evaluate(tiny_checkpoint, bpb=tmp_path / "table.csv")
    (tmp_path / "qa.jsonl").write_text(json.dumps({"input": "q", "output": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"missing field 'text' \(its fields: input, output\)"):
        evaluate(tiny_checkpoint, bpb=tmp_path / "qa.jsonl")
    # A record that can't be read is an error, never a skip: bits per byte over part of a file would mislead.
    (tmp_path / "mixed.jsonl").write_text(json.dumps({"text": "fine"}) + "\n{broken\n")
    with pytest.raises(ValueError, match=r"mixed.jsonl@\d+: invalid JSON\. Fix or remove these records"):
        evaluate(tiny_checkpoint, bpb=tmp_path / "mixed.jsonl")
    with pytest.raises(ValueError, match="nothing to evaluate"):
        evaluate(tiny_checkpoint, tasks="")
