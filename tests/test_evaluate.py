"""`vocagnolm evaluate`: harness grading on the nine real test sets, bits per byte against an independent
expectation, the whole command on a tiny model, and bad input. Generation and the result tables: test_generation.py."""

import csv
import gzip
import hashlib
import inspect
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from litgpt import GPT, Config
from litgpt.utils import save_config
from tokenizers import Tokenizer as HFTokenizer

from litgpt_vocagnolm.errors import InvalidArgument, PathTaken
from litgpt_vocagnolm.evaluation import evaluate as evaluate_module
from litgpt_vocagnolm.evaluation.evaluate import bits_per_byte, bits_per_byte_of_documents, evaluate, load_model
from litgpt_vocagnolm.evaluation.math_tasks import (
    TABLE_1,
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
from litgpt_vocagnolm.models.weights import CHECKSUMS, UnreadableCheckpoint
from litgpt_vocagnolm.training.checkpoints import file_checksums

TOKENIZERS = Path(__file__).parent / "fixtures" / "tokenizers"
COLUMNS = ["GSM8K", "MATH", "SVAMP", "ASDiv", "MAWPS", "TabMWP", "MathQA", "MMLU-STEM", "SAT"]
# The harness's scripts/run_eval.sh (commit db77bc6): the DATA_NAMES of its base-model table, the paper's Table 1.
HARNESS_DATA_NAMES = "gsm8k,minerva_math,svamp,asdiv,mawps,tabmwp,mathqa,mmlu_stem,sat_math"


def make_checkpoint(
    path: Path, tokenizer: str, *, block_size: int, padded_vocab_size: int, uniform: bool = False
) -> Path:
    """A random 1-layer LitGPT checkpoint dir with a real tokenizer; `uniform` zeroes the head: all logits equal."""
    torch.manual_seed(0)
    config = Config(
        name="tiny",
        block_size=block_size,
        n_layer=1,
        n_head=4,
        n_query_groups=2,
        n_embd=32,
        vocab_size=padded_vocab_size,
        padded_vocab_size=padded_vocab_size,
    )
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
    if task == "minerva_math":  # MATH-500's own answer field, not the reference the harness takes from the solution
        return f"Final Answer: The final answer is ${example['answer']}$. I hope it is correct."
    if task == "math":  # as prompts/math.md ends its solutions
        boxed = _last_boxed(example["solution"]) if "\\boxed" in example["solution"] else ""
        return f"Let's think step by step\n{example['solution']}\nSo the final answer is $\\boxed{{{boxed}}}$."
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


# Each miss is explained; together they are all of them.
EXPECTED_MISSES = {
    # The harness normalizes `math` references once and predictions twice: 6's "x \in [-2,7]" stays "x\in[-2,7]"
    # as a reference but loses "x\in" as a prediction, 4667's "x - 3z = 0" loses "z=" as a prediction only, and 1991's
    # "\text { square inches}" leaves "\text{}" in the reference. Normalizing turns 1714's "\frac \pi4" into
    # "\frac{\}{p}i4", differently each time. Problem 4060's solution has no \boxed{} on purpose, so the harness's
    # reference is the prose after "boxed".
    "math": {6, 1714, 1991, 4060, 4667},
    # References drop "(...)" as a unit annotation ("9 (apples)"), which turns 1313's "-(1/3)" into "-".
    "asdiv": {1313},
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
    sizes = {
        "gsm8k": 1319,
        "minerva_math": 500,
        "math": 5000,
        "svamp": 1000,
        "asdiv": 2215,
        "mawps": 2065,
        "tabmwp": 1000,
        "mathqa": 1000,
        "mmlu_stem": 3018,
        "sat_math": 32,
    }
    assert len(examples) == sizes[task]
    assert len(EXPECTED_MISSES.get(task, ())) / len(examples) < 0.01


def test_math_500_reference_solutions_score_through_boxed():
    # The gold answers above come from MATH-500's answer field; its solutions, read as generations, score too.
    task = TASKS["minerva_math"]
    assert all(
        is_correct(extract_answer(e["solution"], task), parse_ground_truth(e, task)) for e in load_examples(task)
    )


@pytest.mark.parametrize(
    "task, idx, reference",
    [
        # Figures from the harness's own parser.py on these examples, as its evaluate.py scores them.
        ("asdiv", 1977, "6:01:00p"),  # "6:01:00 p.m.": normalized once it would still end in "."
        ("asdiv", 165, "3:30p"),
        ("math", 6, "x\\in[-2,7]"),  # normalized twice it would lose "x\in"
        ("math", 405, "10\\sqrt2"),
        ("minerva_math", 0, "(3,\\frac{\\pi}{2})"),
    ],
)
def test_references_are_normalized_as_often_as_the_harness_does(task, idx, reference):
    (example,) = [e for e in load_examples(TASKS[task]) if e["idx"] == idx]
    assert parse_ground_truth(example, TASKS[task]) == reference


def test_default_tasks_are_the_harness_table_in_its_order():
    assert ",".join(TABLE_1) == HARNESS_DATA_NAMES
    assert [TASKS[name].column for name in TABLE_1] == COLUMNS
    assert set(TASKS) - set(TABLE_1) == {"math"}
    assert (TASKS["minerva_math"].file, TASKS["minerva_math"].prompt) == ("math_oai/test.jsonl", "minerva_math.md")
    assert (TASKS["math"].file, TASKS["math"].prompt) == ("math/test.jsonl", "math.md")


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
        ("I cannot decide.", "sat_math", "placeholder"),  # the harness's word for no answer
        ("No idea.\n\nProblem:\nThe answer is (A)", "mathqa", "placeholder"),  # a new problem is not this one's answer
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


@pytest.mark.parametrize(
    "task, question",
    [
        (
            "minerva_math",
            "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your "
            "answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
        ),
        (
            "svamp",
            "There are 87 oranges and 290 bananas in Philip's collection. If the bananas are organized into 2 "
            "groups and oranges are organized into 93 groups. How big is each group of bananas?",
        ),
        ("asdiv", "Seven red apples and two green apples are in the basket. How many apples are in the basket?"),
        (
            "mathqa",
            "If log 8 x + log 8 1 / 6 = 1 / 3 , then the value of x is :\nWhat of the following is the right "
            "choice? Explain your answer.\n(A) 12, (B) 16, (C) 18, (D) 24, (E) 26",
        ),
        (
            "sat_math",
            "The graph of the polynomial function $f$, where $y=f(x)$, has $x$-intercepts of $(-6,0)$ and "
            "$(6,0)$. Which of the following must be true?\nWhat of the following is the right choice? "
            "Explain your answer.\n(A) $f(-6)=0$ (B) $f(6)=-6$ (C) $f(-6)=6$ (D) $f(0)=-6$",
        ),
        (
            "tabmwp",
            'Read the following table regarding "Coin collections" and answer a question:\nName | Number of '
            "coins\nBraden | 76\nCamilla | 94\nRick | 86\nMary | 84\nHector | 80\nDevin | 83\nEmily | 82\n"
            "Avery | 87\nSome friends discussed the sizes of their coin collections. What is the mean of the "
            "numbers?",
        ),
    ],
)
def test_first_question_reads_as_in_the_harness(task, question):
    assert parse_question(load_examples(TASKS[task])[0], TASKS[task]) == question


def test_prompts_have_the_papers_shots():
    question = "What is 1 + 1?"
    gsm8k = build_prompt(question, TASKS["gsm8k"], load_prompt(TASKS["gsm8k"]))
    assert gsm8k.startswith("Question: There are 15 trees in the grove.")
    assert gsm8k.endswith(".\n\n\nQuestion: What is 1 + 1?\nAnswer:")
    assert gsm8k.count("Question:") == 8 + 1
    for task, shots in (("minerva_math", 4), ("math", 5), ("mathqa", 4), ("mmlu_stem", 4), ("sat_math", 4)):
        prompt = build_prompt(question, TASKS[task], load_prompt(TASKS[task]))
        assert prompt.count("Problem:\n") == shots + 1 and prompt.endswith(".\n\n\nProblem:\nWhat is 1 + 1?\nSolution:")
    minerva, math = (load_prompt(TASKS[task]) for task in ("minerva_math", "math"))
    assert minerva.count("I hope it is correct.") == 4 and "Let's think step by step" not in minerva
    assert math.count("Solution:\nLet's think step by step\n") == 5 and "I hope it is correct." not in math
    for task in ("svamp", "asdiv", "mawps", "tabmwp"):
        assert load_prompt(TASKS[task]) == load_prompt(TASKS["gsm8k"])


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
    checkpoint = make_checkpoint(
        tmp_path / "ckpt", tokenizer, block_size=16, padded_vocab_size=padded_vocab_size, uniform=True
    )
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


def test_every_table_1_task_runs_end_to_end_and_writes_the_tables(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    evaluate(tiny_checkpoint, limit=5, batch_size=3, max_new_tokens=4, out_dir=out, precision="32-true")

    with open(out / "results.csv") as f:
        results = list(csv.DictReader(f))
    assert [row["task"] for row in results] == HARNESS_DATA_NAMES.split(",")
    markdown = (out / "results.md").read_text().splitlines()
    assert markdown[0] == "| model | " + " | ".join(COLUMNS) + " | AVG |"
    values = [cell.strip() for cell in markdown[2].strip("|").split("|")]
    assert values[0] == str(tiny_checkpoint)
    assert sorted(p.name for p in out.glob("*.jsonl")) == sorted(row["predictions"] for row in results)
    accuracies = []
    for name, column, result in zip(HARNESS_DATA_NAMES.split(","), COLUMNS, results):
        assert re.fullmatch(rf"{name}\.limit-5\.[0-9a-f]{{10}}\.jsonl", result["predictions"])
        rows = [json.loads(line) for line in open(out / result["predictions"])]
        assert [row["idx"] for row in rows] == [e["idx"] for e in load_examples(TASKS[name])[:5]]
        assert all(row["pred"] == extract_answer(row["generation"], TASKS[name]) for row in rows)
        accuracies.append(100 * sum(row["score"] for row in rows) / 5)
        assert float(result["accuracy"]) == pytest.approx(accuracies[-1])
        assert (result["questions"], result["limit"], result["max_new_tokens"]) == ("5", "5", "4")
        assert values[1 + COLUMNS.index(column)] == f"{accuracies[-1]:.1f}*"  # marked: a --limit run
    assert values[-1] == f"{sum(accuracies) / 9:.1f}*"


def test_full_math_test_set_runs_when_asked_in_its_own_column(tiny_checkpoint, tmp_path):
    evaluate(
        tiny_checkpoint,
        tasks="math,gsm8k,minerva_math",
        limit=2,
        max_new_tokens=2,
        out_dir=tmp_path,
        precision="32-true",
    )
    header = (tmp_path / "results.md").read_text().splitlines()[0]
    assert header == "| model | GSM8K | MATH | MATH-5000 | AVG |"
    (math,) = tmp_path.glob("math.limit-2.*.jsonl")
    (minerva,) = tmp_path.glob("minerva_math.limit-2.*.jsonl")
    math, minerva = ([json.loads(line) for line in open(path)] for path in (math, minerva))
    assert [row["question"] for row in math] == [e["problem"] for e in load_examples(TASKS["math"])[:2]]
    assert [row["question"] for row in minerva] == [e["problem"] for e in load_examples(TASKS["minerva_math"])[:2]]
    assert minerva[0]["subject"] == "Precalculus" and math[0]["type"] == "Algebra"  # kept for breakdowns


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
    available = "unknown task(s) 'gsm9k'; available: gsm8k, minerva_math, math, svamp,"
    with pytest.raises(ValueError, match=re.escape(available)):
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


# Issue 32, evaluate: results merged and never rewritten, a checkpoint known by its content and checked against its
# recorded checksums, the output folder checked before any work, no number over nothing.


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_second_checkpoint_keeps_the_first_ones_row_and_predictions(tiny_checkpoint, tmp_path):
    other = make_checkpoint(tmp_path / "other", "tinyllama-1.1b", block_size=2048, padded_vocab_size=32000)
    torch.save({k: v + 0.01 for k, v in torch.load(other / "lit_model.pth").items()}, other / "lit_model.pth")
    out = tmp_path / "out"
    evaluate(tiny_checkpoint, tasks="gsm8k", limit=2, max_new_tokens=2, out_dir=out, precision="32-true")
    (first,) = read_csv(out / "results.csv")
    kept = (out / first["predictions"]).read_bytes()
    evaluate(other, tasks="gsm8k", limit=2, max_new_tokens=2, out_dir=out, precision="32-true")

    rows = read_csv(out / "results.csv")
    assert [row["checkpoint"] for row in rows] == [str(tiny_checkpoint), str(other)]
    assert rows[0] == first and (out / first["predictions"]).read_bytes() == kept
    assert rows[1]["predictions"] != first["predictions"] and (out / rows[1]["predictions"]).is_file()
    # A checkpoint is its content: the sha256 of its weights, computed here with hashlib.
    for row, checkpoint in zip(rows, (tiny_checkpoint, other)):
        assert row["checkpoint_sha256"] == hashlib.sha256((checkpoint / "lit_model.pth").read_bytes()).hexdigest()
    table_1 = (out / "results.md").read_text().splitlines()
    assert table_1[2].startswith(f"| {tiny_checkpoint} |") and table_1[3].startswith(f"| {other} |")

    # Trained again in the same folder: another checkpoint, with a row of its own; the path alone no longer tells.
    torch.save({k: v + 0.02 for k, v in torch.load(other / "lit_model.pth").items()}, other / "lit_model.pth")
    evaluate(other, tasks="gsm8k", limit=2, max_new_tokens=2, out_dir=out, precision="32-true")
    rows = read_csv(out / "results.csv")
    assert [row["checkpoint"] for row in rows] == [str(tiny_checkpoint), str(other), str(other)]
    assert len({row["checkpoint_sha256"] for row in rows}) == 3
    shown = [line.split("|")[1].strip() for line in (out / "results.md").read_text().splitlines()[2:5]]
    assert shown[1:] == [f"{other} @{rows[1]['checkpoint_sha256'][:8]}", f"{other} @{rows[2]['checkpoint_sha256'][:8]}"]


def test_bits_per_byte_keeps_a_row_per_checkpoint_and_file_and_refuses_a_bpb_csv_of_the_users(
    tiny_checkpoint, tmp_path, monkeypatch
):
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "b.txt").write_text(TEXT[:60])
    out = tmp_path / "out"
    evaluate(tiny_checkpoint, bpb=tmp_path / "a.txt", out_dir=out, precision="32-true")
    (first,) = read_csv(out / "bpb.csv")
    evaluate(tiny_checkpoint, bpb=tmp_path / "b.txt", out_dir=out, precision="32-true")  # another held-out file
    rows = read_csv(out / "bpb.csv")
    assert [row["file"] for row in rows] == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")] and rows[0] == first
    evaluate(tiny_checkpoint, bpb=tmp_path / "a.txt", out_dir=out, precision="32-true")  # the same again: its own row
    rows = read_csv(out / "bpb.csv")
    assert len(rows) == 2 and rows[0]["bits_per_byte"] == first["bits_per_byte"]
    assert [line.count(str(tmp_path / "a.txt")) for line in (out / "bpb.md").read_text().splitlines()[2:]] == [1, 0]

    monkeypatch.setattr(evaluate_module, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "bpb.csv").write_text("model,bpb\nmy-model,0.91\n")
    with pytest.raises(PathTaken, match=re.escape(f"{mine / 'bpb.csv'} has columns ['model', 'bpb']")):
        evaluate(tiny_checkpoint, bpb=tmp_path / "a.txt", out_dir=mine)
    assert (mine / "bpb.csv").read_text() == "model,bpb\nmy-model,0.91\n"
    (mine / "bpb.csv").unlink()
    (mine / "bpb.md").write_text("my notes\n")  # a view without the file it is drawn from: not evaluate's
    with pytest.raises(PathTaken, match="bpb.md exists without the bpb.csv it is drawn from"):
        evaluate(tiny_checkpoint, bpb=tmp_path / "a.txt", out_dir=mine)
    assert (mine / "bpb.md").read_text() == "my notes\n"


def damage(weights: Path) -> None:
    """4 KB of 0xff written in place, inside the tensor data: the file still loads, with 1,024 NaN weights."""
    with open(weights, "r+b") as f:
        f.seek(weights.stat().st_size // 2 // 4096 * 4096)  # on a float's first byte: tensor data is 64-byte aligned
        f.write(b"\xff" * 4096)


def test_a_damaged_weights_file_with_a_recorded_checksum_is_refused(tiny_checkpoint, tmp_path, no_model_load):
    checkpoint = tmp_path / "final"
    shutil.copytree(tiny_checkpoint, checkpoint)
    # checksums.json as a training checkpoint's final/ records its files (`Checkpointer.finish`).
    (checkpoint / CHECKSUMS).write_text(json.dumps(file_checksums(checkpoint)))
    damage(checkpoint / "lit_model.pth")
    weights = torch.load(checkpoint / "lit_model.pth", weights_only=True)
    assert sum(int(tensor.isnan().sum()) for tensor in weights.values()) == 1024
    with pytest.raises(UnreadableCheckpoint, match=re.escape(f"{checkpoint / 'lit_model.pth'} does not match its")):
        evaluate(checkpoint, tasks="gsm8k", limit=1, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_out_dir_onto_a_file_or_an_unwritable_folder_is_refused_before_any_work(
    tiny_checkpoint, tmp_path, read_only_folder, no_model_load
):
    (tmp_path / "taken").write_text("a file\n")
    with pytest.raises(PathTaken, match="is a file, not a folder"):
        evaluate(tiny_checkpoint, tasks="gsm8k", limit=1, out_dir=tmp_path / "taken" / "out")
    with pytest.raises(PathTaken, match="is a file, not a folder"):
        evaluate(tiny_checkpoint, tasks="gsm8k", limit=1, out_dir=tmp_path / "taken")
    with pytest.raises(InvalidArgument, match="can't be created: .* is not writable by this user"):
        evaluate(tiny_checkpoint, tasks="gsm8k", limit=1, out_dir=read_only_folder / "out")
    assert not (read_only_folder / "out").exists()


def test_bits_per_byte_of_a_file_without_text_is_refused_not_reported(tiny_checkpoint, tmp_path, no_model_load):
    (tmp_path / "good.txt").write_text(TEXT)
    (tmp_path / "blank.jsonl").write_text(json.dumps({"text": ""}) + "\n" + json.dumps({"text": ""}) + "\n")
    with pytest.raises(InvalidArgument, match=re.escape(f"--bpb: {tmp_path / 'blank.jsonl'} holds no text")):
        evaluate(tiny_checkpoint, bpb=[tmp_path / "good.txt", tmp_path / "blank.jsonl"], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
