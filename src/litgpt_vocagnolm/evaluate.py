"""`vocagnolm evaluate`: the paper's nine math benchmarks (few-shot chain of thought, greedy) and bits per byte.

Accuracy is measured as the math evaluation harness of Rho-1, ProX and the paper measures it (prompts, extraction
and grading in math_tasks.py), offline, from a LitGPT checkpoint. Generation is LitGPT's `GPT` with its KV cache,
batched: a batch's prompts are left-padded and a per-row mask hides the padding, so a batch costs one prefill and one
forward per new token, and rows that finish leave the batch.

Accuracy of a 1B model trained on a laptop is ~0, so there is also bits per byte of held-out text: summed token losses
divided by the bytes of the text they encode. It does not depend on the tokenizer, so a TinyLlama student and a Qwen
teacher are measured in the same unit.
"""

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn.functional as F
from tqdm import tqdm

from litgpt_vocagnolm import gpt
from litgpt_vocagnolm.checkpoints import check_checkpoint_dir
from litgpt_vocagnolm.documents import parse_text_key, read_whole_files
from litgpt_vocagnolm.loss import bits_per_byte
from litgpt_vocagnolm.math_tasks import (
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

# Prompt tokens per prefill forward.
PREFILL_CHUNK = 512
# Example fields copied into the predictions file, for per-subject and per-level breakdowns.
EXTRA_FIELDS = ("type", "subject", "level", "pid", "ques_type", "ans_type")


def evaluate(
    checkpoint_dir: Path,
    tasks: Optional[str] = None,
    data_dir: Optional[Path] = None,
    limit: Optional[int] = None,
    batch_size: int = 8,
    max_new_tokens: int = 1024,
    bpb: Optional[Union[Path, list[Path]]] = None,
    text_key: str = "text",
    out_dir: Optional[Path] = None,
    precision: Optional[str] = None,
) -> None:
    """Evaluates a LitGPT checkpoint on the paper's math benchmarks and/or bits per byte of held-out text.

    Writes, under `out_dir`: `results.csv` and `results.md` (accuracy per task in the paper's Table 1 column order,
    then the unweighted average), `<task>.jsonl` (every question's generation, extracted answer and score), and with
    `--bpb` also `bpb.csv` and `bpb.md`.

    Arguments:
        checkpoint_dir: A LitGPT checkpoint directory: lit_model.pth, model_config.yaml, tokenizer.json (or
            tokenizer.model) and tokenizer_config.json.
        tasks: Comma-separated tasks among gsm8k, minerva_math, math, svamp, asdiv, mawps, tabmwp, mathqa,
            mmlu_stem, sat_math. `minerva_math` is Table 1's MATH: MATH-500 with the 4-shot Minerva prompt, as in the
            harness's base-model table; `math` is all 5,000 MATH test problems with the harness's 5-shot prompt.
            Default: Table 1's nine (all but `math`), or none when `--bpb` is given.
        data_dir: Directory with the test files in the harness layout (`gsm8k/test.jsonl`, `math_oai/test.jsonl`,
            ..., `tabmwp/problems_test1k.json`). Default: the copies shipped with this package.
        limit: Evaluate only the first N questions of each task (a quick check; the paper uses all).
        batch_size: Questions decoded together (and text windows scored together for `--bpb`).
        max_new_tokens: Most tokens generated per question; the harness's 1024. Generation also stops at the
            harness's stop strings and at EOS, and where the model's block size is full.
        bpb: Text to report bits per byte on: files or directories, as `vocagnolm prepare --input` reads them
            (`--bpb [a.txt,b.jsonl]`): a .txt file is one document, a .jsonl file one per line, a .parquet file one
            per row. Every record must be readable.
        text_key: The field(s) of a --bpb record that hold its text; several, comma-separated, are joined with a
            blank line between them.
        out_dir: Where to write the results. Default: `checkpoint_dir/evaluate`.
        precision: Fabric precision, e.g. "bf16-true" or "32-true". Default: bf16 (16-bit on GPUs without bf16).
    """
    checkpoint_dir = Path(checkpoint_dir)
    data_dir = Path(data_dir) if data_dir is not None else DATA_DIR
    out_dir = Path(out_dir) if out_dir is not None else checkpoint_dir / "evaluate"
    # Bad input fails here, before the model loads.
    check_checkpoint_dir(checkpoint_dir, what="checkpoint_dir", tokenizer=True)
    selected = parse_tasks(tasks if tasks is not None else ("" if bpb else ",".join(TABLE_1)))
    check_task_files(selected, data_dir)
    if selected:
        check_latex_parser()
    documents = read_whole_files(bpb, parse_text_key(text_key), "--bpb") if bpb else {}
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens), ("limit", limit)):
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be at least 1, got {value}")
    if not selected and not documents:
        raise ValueError("nothing to evaluate: give --tasks, --bpb FILE, or both")

    model, tokenizer = load_model(checkpoint_dir, precision)
    out_dir.mkdir(parents=True, exist_ok=True)

    if documents:
        rows = [
            {"file": str(path)} | bits_per_byte_of_documents(model, tokenizer, texts, batch_size)
            for path, texts in documents.items()
        ]
        write_bpb_tables(rows, out_dir)
        print((out_dir / "bpb.md").read_text(encoding="utf-8"))

    accuracy = {}
    for task in selected:
        predictions = evaluate_task(model, tokenizer, task, data_dir, limit, batch_size, max_new_tokens)
        with open(out_dir / f"{task.name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in predictions)
        accuracy[task.name] = 100 * sum(row["score"] for row in predictions) / len(predictions)
    if accuracy:
        write_accuracy_tables(accuracy, out_dir, model_name=str(checkpoint_dir))
        print((out_dir / "results.md").read_text(encoding="utf-8"))
    print(f"Wrote results to {out_dir}")


# Input checks


def parse_tasks(tasks: str) -> list[Task]:
    """`"gsm8k,math"` -> the tasks, in Table 1 order."""
    names = [name.strip() for name in tasks.split(",") if name.strip()]
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(map(repr, unknown))}; available: {', '.join(TASKS)}")
    return [task for name, task in TASKS.items() if name in names]


def check_task_files(tasks: list[Task], data_dir: Path) -> None:
    missing = [task for task in tasks if not (data_dir / task.file).is_file()]
    if not missing:
        return
    present = sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())
    raise FileNotFoundError(
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


@torch.inference_mode()
def generate_greedy(
    model, tokenizer, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_strings: Sequence[str] = ()
) -> list[str]:
    """Greedy continuations of prompts of different lengths, decoded together with LitGPT's KV cache.

    The prompts are left-padded to the longest, T0. All rows share positions 0 .. T0 + max_new_tokens - 1 and a
    (B, 1, S, S) mask, put in place of the model's causal mask cache, hides every padding key. RoPE attention depends
    on relative positions only, so each row continues as it would alone (up to float rounding). A row stops at EOS or
    once its text holds a stop string, and is cut there; finished rows leave the batch and the KV cache.
    """
    param = next(model.parameters())
    device = param.device
    batch, longest = len(prompts), max(len(prompt) for prompt in prompts)
    seq_len = longest + max_new_tokens
    window = model.config.sliding_window_size
    if window is not None and any(model.config.sliding_window_indices) and window < seq_len:
        # The mask below has no window, and LitGPT's ring-buffer KV cache cannot prefill past one.
        raise NotImplementedError(
            f"sliding-window attention over {window} tokens with {seq_len} prompt and new tokens is not supported;"
            " lower --max_new_tokens or evaluate a model whose window covers its block size"
        )
    ids = torch.zeros(batch, longest, dtype=torch.int64, device=device)  # padding id 0, never attended to
    real = torch.ones(batch, seq_len, dtype=torch.bool, device=device)  # (B, S): key is not padding
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.int64)
        real[row, : longest - len(prompt)] = False
    model.set_kv_cache(batch_size=batch, max_seq_length=seq_len, device=device, dtype=param.dtype)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    itself = torch.eye(seq_len, dtype=torch.bool, device=device)
    # A padding query sees only itself: a fully masked row gives NaN, and NaN times a zero weight spreads through V.
    model.mask_cache = (causal & (real[:, None, :] | itself))[:, None]  # (B, 1, S, S)

    # Prefill: only the last position's logits are needed, so the head is skipped before it (for a tiny model the
    # (B, T0, vocab) projection is most of the cost), and chunks bound the (B, heads, chunk, T0) attention scores.
    head, model.lm_head = model.lm_head, torch.nn.Identity()
    try:
        for start in range(0, longest - 1, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, longest - 1)
            model(ids[:, start:end], torch.arange(start, end, device=device), input_pos_maxp1=end)
    finally:
        model.lm_head = head
    last = torch.tensor([longest - 1], device=device)
    next_tokens = model(ids[:, -1:], last, input_pos_maxp1=longest)[:, -1].argmax(dim=-1)  # (B,)

    rows = list(range(batch))  # the prompt index of each row still in the batch
    generated: list[list[int]] = [[] for _ in range(batch)]
    texts = [""] * batch
    for step in range(max_new_tokens):
        new = next_tokens.tolist()  # a CPU-GPU sync per step: stop strings are found in the text
        stay = []
        for position, (row, token) in enumerate(zip(rows, new)):
            if token == tokenizer.eos_id:
                continue
            generated[row].append(token)
            texts[row] = tokenizer.decode(torch.tensor(generated[row]))
            if not any(stop in texts[row] for stop in stop_strings):
                stay.append(position)
        if not stay or step == max_new_tokens - 1:
            break
        if len(stay) < len(rows):
            keep = torch.tensor(stay, device=device)
            for block in model.transformer.h:
                block.attn.kv_cache.k = block.attn.kv_cache.k.index_select(0, keep)
                block.attn.kv_cache.v = block.attn.kv_cache.v.index_select(0, keep)
            model.mask_cache = model.mask_cache.index_select(0, keep)
            rows, next_tokens = [rows[p] for p in stay], next_tokens[keep]
        position = longest + step
        logits = model(next_tokens[:, None], torch.tensor([position], device=device), input_pos_maxp1=position + 1)
        next_tokens = logits[:, -1].argmax(dim=-1)
    model.clear_kv_cache()
    return [cut_at_stop(text, stop_strings) for text in texts]


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first stop string in it."""
    return text[: min((text.index(stop) for stop in stop_strings if stop in text), default=len(text))]


# Math benchmarks


def evaluate_task(
    model, tokenizer, task: Task, data_dir: Path, limit: Optional[int], batch_size: int, max_new_tokens: int
) -> list[dict]:
    """Every question of `task` (the first `limit`) with the model's generation, extracted answer and score."""
    examples = load_examples(task, data_dir)[:limit]
    if not examples:
        raise ValueError(f"{data_dir / task.file} holds no examples")
    shots = load_prompt(task)
    block_size = model.config.block_size
    rows, prompts = [], []
    for example in examples:
        question = parse_question(example, task)
        ids = tokenizer.encode(build_prompt(question, task, shots)).tolist()
        row = {"idx": example["idx"], "question": question, "gt": parse_ground_truth(example, task)}
        if len(ids) >= block_size:  # keep the end, where the question is, and room for one new token
            ids, row["prompt_truncated"] = ids[len(ids) - block_size + 1 :], True
        rows.append(row | {key: example[key] for key in EXTRA_FIELDS if key in example})
        prompts.append(ids)

    lengths = sorted(len(prompt) for prompt in prompts)
    truncated = sum("prompt_truncated" in row for row in rows)
    print(
        f"{task.name}: {len(rows)} questions, {task.prompt} shots, prompts of {lengths[0]}-{lengths[-1]} tokens"
        f" (median {lengths[len(lengths) // 2]}), up to {max_new_tokens} new tokens in a block of {block_size}"
        + (f"; {truncated} prompts cut to fit the block" if truncated else "")
    )
    # Longest first: similar lengths share a batch (little padding), and running out of memory shows at once.
    order = sorted(range(len(rows)), key=lambda i: -len(prompts[i]))
    with tqdm(total=len(rows), desc=task.name, unit="question") as progress:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            new_tokens = min(max_new_tokens, block_size - max(len(prompts[i]) for i in batch))
            generations = generate_greedy(model, tokenizer, [prompts[i] for i in batch], new_tokens, STOP_STRINGS)
            for i, generation in zip(batch, generations):
                # The harness strips the generation; the answer is extracted from what remains.
                generation = generation.strip()
                prediction = extract_answer(generation, task)
                score = is_correct(prediction, rows[i]["gt"])
                rows[i] |= {"pred": prediction, "score": score, "generation": generation}
            progress.update(len(batch))
    return rows


def write_accuracy_tables(accuracy: dict[str, float], out_dir: Path, model_name: str) -> None:
    """`results.csv` and `results.md`: one row, the tasks in Table 1 order, then the unweighted average."""
    names = [name for name in TASKS if name in accuracy]
    columns = [TASKS[name].column for name in names] + ["AVG"]
    values = [accuracy[name] for name in names]
    cells = [f"{value:.1f}" for value in values + [sum(values) / len(values)]]
    with open(out_dir / "results.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["model", *columns], [model_name, *cells]])
    lines = [["model", *columns], ["---"] + ["---:"] * len(columns), [model_name, *cells]]
    (out_dir / "results.md").write_text("".join(f"| {' | '.join(line)} |\n" for line in lines), encoding="utf-8")


# Bits per byte


@torch.inference_mode()
def bits_per_byte_of_documents(model, tokenizer, documents: Sequence[str], batch_size: int) -> dict:
    """Bits per byte of `documents` under `model`: every token of every document is predicted, the first from BOS
    (EOS, the document separator, for tokenizers without BOS). Documents longer than the block size are scored in
    consecutive windows of block-size predictions; a window's first tokens see only the context inside it."""
    context = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if context is None:
        raise ValueError("bits per byte needs a BOS or EOS token to predict a document's first token from")
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


def write_bpb_tables(rows: list[dict], out_dir: Path) -> None:
    """`bpb.csv` (full precision) and `bpb.md`: one row per file."""
    columns = ["file", "documents", "tokens", "bytes", "nats", "bits_per_byte"]
    with open(out_dir / "bpb.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([columns] + [[row[c] for c in columns] for row in rows])
    columns.remove("nats")
    lines = [columns, ["---"] + ["---:"] * (len(columns) - 1)]
    lines += [[str(row[c]) for c in columns[:-1]] + [f"{row['bits_per_byte']:.4f}"] for row in rows]
    (out_dir / "bpb.md").write_text("".join(f"| {' | '.join(line)} |\n" for line in lines), encoding="utf-8")
