"""`vocagnolm evaluate`: the paper's nine math benchmarks (few-shot chain of thought, greedy) and bits per byte.

Accuracy is measured as the math evaluation harness of Rho-1, ProX and the paper measures it (prompts, extraction
and grading in math_tasks.py), offline, from a LitGPT checkpoint. Generation is greedy, with continuous batching
(`generation`); each question gets the harness's budget within its own context.

Accuracy of a 1B model trained on a laptop is ~0, so there is also bits per byte of held-out text: summed token losses
divided by the bytes of the text they encode. It does not depend on the tokenizer, so a TinyLlama student and a Qwen
teacher are measured in the same unit.
"""

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Optional, Union

import torch
import torch.nn.functional as F
from tqdm import tqdm

from litgpt_vocagnolm.data.documents import parse_text_key, read_whole_files
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, check_writable
from litgpt_vocagnolm.evaluation.generation import default_batch_size, generate_greedy
from litgpt_vocagnolm.evaluation.math_tasks import (
    DATA_DIR,
    STOP_STRINGS,
    TABLE_1,
    TASKS,
    Task,
    build_prompt,
    check_latex_parser,
    extract_answer,
    is_correct,
    load_examples,
    load_prompt,
    parse_ground_truth,
    parse_question,
)
from litgpt_vocagnolm.evaluation.results import check_results_files, predictions_name, record_accuracy, record_bpb
from litgpt_vocagnolm.loss.selection import bits_per_byte
from litgpt_vocagnolm.models import gpt
from litgpt_vocagnolm.models.weights import check_checkpoint_dir, verified_weights_sha256

# Example fields copied into the predictions file, for per-subject and per-level breakdowns.
EXTRA_FIELDS = ("type", "subject", "level", "pid", "ques_type", "ans_type")


def evaluate(
    checkpoint_dir: Path,
    tasks: Optional[str] = None,
    data_dir: Optional[Path] = None,
    limit: Optional[int] = None,
    batch_size: Optional[int] = None,
    max_new_tokens: int = 1024,
    bpb: Optional[Union[Path, list[Path]]] = None,
    text_key: str = "text",
    out_dir: Optional[Path] = None,
    precision: Optional[Literal["bf16-true", "bf16-mixed", "16-true", "16-mixed", "32-true"]] = None,
) -> None:
    """Evaluates a LitGPT checkpoint on the paper's math benchmarks and/or bits per byte of held-out text.

    Writes, under `out_dir`: each task's predictions (every question's generation, new tokens, extracted answer and
    score), `results.csv` and `results.md` (see `--out_dir`), and with `--bpb` also `bpb.csv` and `bpb.md`. A
    checkpoint whose checksums.json records its weights (a training checkpoint's `final/`, one `vocagnolm export`
    wrote) is checked against it first: a damaged file is refused.

    Arguments:
        checkpoint_dir: A LitGPT checkpoint directory: lit_model.pth, model_config.yaml, tokenizer.json (or
            tokenizer.model) and tokenizer_config.json.
        tasks: Comma-separated tasks among gsm8k, minerva_math, math, svamp, asdiv, mawps, tabmwp, mathqa,
            mmlu_stem, sat_math. `minerva_math` is Table 1's MATH: MATH-500 with the 4-shot Minerva prompt, as in the
            harness's base-model table; `math` is all 5,000 MATH test problems with the harness's 5-shot prompt.
            Default: Table 1's nine (all but `math`), or none when `--bpb` is given.
        data_dir: Directory with the test files in the harness layout (`gsm8k/test.jsonl`, `math_oai/test.jsonl`,
            ..., `tabmwp/problems_test1k.json`). Default: the copies shipped with this package.
        limit: Evaluate only the first N questions of each task (a quick check; the paper uses all). Such a run
            writes `<task>.limit-N.<id>.jsonl` and a row of its own in results.csv, marked * where results.md's Table
            1 shows it: it never replaces a whole run's predictions or row.
        batch_size: Questions decoded together (and text windows scored together for `--bpb`). Default: as many as
            the KV cache of a whole block fits in 80% of the device's free memory (on CPU, at most 32), printed at
            start; 8 text windows for `--bpb`. A question that ends leaves its row to the next waiting one.
        max_new_tokens: Most tokens generated per question; the harness's 1024. Each question gets its own: up to
            `max_new_tokens` within the model's block size after its own prompt (a prompt longer than the block keeps
            its last tokens, with room for one new token). Generation also stops at the harness's stop strings and at
            EOS.
        bpb: Text to report bits per byte on: files or directories, as `vocagnolm prepare --input` reads them
            (`--bpb [a.txt,b.jsonl]`): a .txt file is one document, a .jsonl file one per line, a .parquet file one
            per row. Every record must be readable, and every file must hold some text.
        text_key: The field(s) of a --bpb record that hold its text; several, comma-separated, are joined with a
            blank line between them.
        out_dir: Where to write the results. Earlier results in `out_dir` are kept: results.csv holds one row per
            checkpoint, task, settings (max_new_tokens, precision, data_dir) and limit, with its accuracy, questions,
            date and predictions file (`<task>.<id>.jsonl`, <id> naming the checkpoint and the settings); a run again
            with all of these the same replaces only its own row and predictions file. A checkpoint is known by the
            sha256 of its weights, not by its path alone. results.md shows Table 1 (a row per checkpoint and settings:
            the tasks in the paper's column order, each from its whole run if there is one, then their unweighted
            average) above every row. bpb.csv holds one row per checkpoint, file and precision. Results files that
            evaluate did not write are refused, never replaced. Default: `checkpoint_dir/evaluate`.
        precision: Fabric precision. Default: "bf16-true" (on CPUs too), "16-true" on GPUs without bf16. On a CPU
            "16-mixed" runs as "bf16-mixed" (Fabric's choice: torch has no float16 autocast there).
    """
    from litgpt.utils import get_default_supported_precision

    checkpoint_dir = Path(checkpoint_dir)
    test_sets = Path(data_dir) if data_dir is not None else DATA_DIR
    out_dir = Path(out_dir) if out_dir is not None else checkpoint_dir / "evaluate"
    # Bad input fails here, before the model loads.
    check_checkpoint_dir(checkpoint_dir, what="checkpoint_dir", tokenizer=True, verify=False)  # verified below
    selected = parse_tasks(tasks if tasks is not None else ("" if bpb else ",".join(TABLE_1)))
    check_task_files(selected, test_sets)
    if selected:
        check_latex_parser()
    documents = bpb_documents(bpb, text_key) if bpb else {}
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens), ("limit", limit)):
        if value is not None and value < 1:
            raise InvalidArgument(f"--{name} must be at least 1, got {value}")
    if not selected and not documents:
        raise InvalidArgument("nothing to evaluate: give --tasks, --bpb FILE, or both")
    check_writable(out_dir, "--out_dir")
    check_results_files(out_dir, ["results.csv"] * bool(selected) + ["bpb.csv"] * bool(documents))
    # The run's row: the checkpoint by its content, checked against its recorded checksums; the settings.
    run = {
        "checkpoint": str(checkpoint_dir),
        "checkpoint_sha256": verified_weights_sha256(checkpoint_dir),
        "precision": precision or get_default_supported_precision(training=False),
        "max_new_tokens": max_new_tokens,
        "data_dir": "" if data_dir is None else str(data_dir),
    }

    model, tokenizer = load_model(checkpoint_dir, run["precision"])
    out_dir.mkdir(parents=True, exist_ok=True)

    for path, texts in documents.items():
        result = bits_per_byte_of_documents(model, tokenizer, texts, batch_size or 8)
        record_bpb(out_dir, {"file": str(path), **result, **run, "date": now()})
    if documents:
        print((out_dir / "bpb.md").read_text(encoding="utf-8"))

    if selected and batch_size is None:
        batch_size = default_batch_size(model)
    for task in selected:
        predictions = evaluate_task(model, tokenizer, task, test_sets, limit, batch_size, max_new_tokens)
        record_task(out_dir, task, predictions, limit, run)
    if selected:  # each task's row was written as it ended: a later task's failure loses nothing
        print((out_dir / "results.md").read_text(encoding="utf-8"))
    print(f"Wrote results to {out_dir}")


def bpb_documents(bpb: Union[Path, list[Path]], text_key: str) -> dict[Path, list[str]]:
    """`--bpb`'s files read, each file's documents: refused when a file holds no text."""
    documents = read_whole_files(bpb, parse_text_key(text_key), "--bpb")
    empty = [str(path) for path, texts in documents.items() if not any(texts)]
    if empty:  # bits per byte over no bytes is no number
        raise InvalidArgument(f"--bpb: {', '.join(empty)} holds no text, only empty records: give text to measure")
    return documents


def record_task(out_dir: Path, task: Task, predictions: list[dict], limit: Optional[int], run: dict) -> None:
    """Writes a task's predictions file and its row of results.csv (and results.md): its accuracy, the `run`'s
    checkpoint and settings."""
    name = predictions_name(task.name, limit, run)
    with open(out_dir / name, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in predictions)
    accuracy = 100 * sum(prediction["score"] for prediction in predictions) / len(predictions)
    record_accuracy(
        out_dir,
        {
            "task": task.name,
            "accuracy": accuracy,
            "questions": len(predictions),
            "limit": limit,
            **run,
            "date": now(),
            "predictions": name,
        },
    )


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# Input checks


def parse_tasks(tasks: str) -> list[Task]:
    """`"gsm8k,math"` -> the tasks, in Table 1 order."""
    names = [name.strip() for name in tasks.split(",") if name.strip()]
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise InvalidArgument(f"unknown task(s) {', '.join(map(repr, unknown))}; available: {', '.join(TASKS)}")
    return [task for name, task in TASKS.items() if name in names]


def check_task_files(tasks: list[Task], data_dir: Path) -> None:
    missing = [task for task in tasks if not (data_dir / task.file).is_file()]
    if not missing:
        return
    present = sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())
    raise PathMissing(
        f"--data_dir {str(data_dir)!r} lacks "
        + ", ".join(f"{task.file} (task {task.name})" for task in missing)
        + f"; it holds: {', '.join(present) or 'nothing'}."
        " Leave --data_dir out to use the test files shipped with litgpt-vocagnolm."
    )


# Model


def load_model(checkpoint_dir: Path, precision: Optional[str] = None):
    """The checkpoint's `GPT` (eval mode, set up by a 1-device Fabric; `gpt.load_model`) and its `litgpt.Tokenizer`."""
    import lightning as L
    from litgpt import Tokenizer
    from litgpt.utils import get_default_supported_precision

    fabric = L.Fabric(devices=1, precision=precision or get_default_supported_precision(training=False))
    return gpt.load_model(checkpoint_dir, fabric), Tokenizer(checkpoint_dir)


# Math benchmarks


def evaluate_task(
    model, tokenizer, task: Task, data_dir: Path, limit: Optional[int], batch_size: int, max_new_tokens: int
) -> list[dict]:
    """Every question of `task` (the first `limit`) with the model's generation, extracted answer and score."""
    examples = load_examples(task, data_dir)[:limit]
    if not examples:
        raise InvalidArgument(f"{data_dir / task.file} holds no examples")
    shots = load_prompt(task)
    block_size = model.config.block_size
    rows, prompts = [], []
    for example in examples:
        question = parse_question(example, task)
        ids = tokenizer.encode(build_prompt(question, task, shots)).tolist()
        row = {"idx": example["idx"], "question": question, "gt": parse_ground_truth(example, task)}
        if len(ids) >= block_size:  # keep the end, where the question is: the block has room for one new token
            ids, row["prompt_truncated"] = ids[len(ids) - block_size + 1 :], True
        rows.append(row | {key: example[key] for key in EXTRA_FIELDS if key in example})
        prompts.append(ids)

    lengths = sorted(len(prompt) for prompt in prompts)
    truncated = sum("prompt_truncated" in row for row in rows)
    short = sum(length + max_new_tokens > block_size for length in lengths)
    print(
        f"{task.name}: {len(rows)} questions, {task.prompt} shots, prompts of {lengths[0]}-{lengths[-1]} tokens"
        f" (median {lengths[len(lengths) // 2]}), up to {max_new_tokens} new tokens each within a block of"
        f" {block_size}"
        + (f" ({short} get fewer: the block ends first)" if short else "")
        + (f"; {truncated} prompts cut to fit the block, with room for one new token" if truncated else "")
    )
    generations = generate_greedy(model, tokenizer, prompts, max_new_tokens, STOP_STRINGS, batch_size, task.name)
    for row, (generation, new_tokens) in zip(rows, generations):
        # The harness strips the generation; the answer is extracted from what remains.
        generation = generation.strip()
        prediction = extract_answer(generation, task)
        row |= {
            "pred": prediction,
            "score": is_correct(prediction, row["gt"]),
            "generation": generation,
            "new_tokens": new_tokens,
        }
    return rows


# Bits per byte


@torch.inference_mode()
def bits_per_byte_of_documents(model, tokenizer, documents: Sequence[str], batch_size: int) -> dict:
    """Bits per byte of `documents` under `model`: every token of every document is predicted, the first from BOS
    (EOS, the document separator, for tokenizers without BOS). Documents longer than the block size are scored in
    consecutive windows of block-size predictions; a window's first tokens see only the context inside it."""
    context = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if context is None:
        raise InvalidArgument(
            "--bpb needs a tokenizer with a BOS or EOS token to predict a document's first token from; this"
            " checkpoint's has neither: add them to its tokenizer_config.json, or measure --tasks only."
        )
    block_size = model.config.block_size
    windows = []  # each: block_size + 1 ids or fewer; its first id is context only
    for text in documents:
        ids = [context] + tokenizer.encode(text, bos=False).tolist()
        windows += [ids[start : start + block_size + 1] for start in range(0, len(ids) - 1, block_size)]

    device = next(model.parameters()).device
    nats, tokens = 0.0, 0
    for start in tqdm(range(0, len(windows), batch_size), desc="bits per byte", unit="batch"):
        batch = windows[start : start + batch_size]
        width = max(len(window) for window in batch) - 1
        inputs = torch.zeros(len(batch), width, dtype=torch.int64)
        targets = torch.full((len(batch), width), -100, dtype=torch.int64)  # -100: padding, not scored
        for row, window in enumerate(batch):
            inputs[row, : len(window) - 1] = torch.tensor(window[:-1])
            targets[row, : len(window) - 1] = torch.tensor(window[1:])
        logits = model(inputs.to(device))  # (B, width, padded vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten().to(device), reduction="sum")
        nats += loss.item()  # a CPU-GPU sync per batch; summed in float64 on the host
        tokens += int((targets != -100).sum())
    total_bytes = sum(len(text.encode("utf-8")) for text in documents)
    return {
        "documents": len(documents),
        "tokens": tokens,
        "bytes": total_bytes,
        "nats": nats,
        "bits_per_byte": bits_per_byte(nats, total_bytes),
    }
