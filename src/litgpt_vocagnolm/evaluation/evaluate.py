"""`vocagnolm evaluate`: the paper's nine math benchmarks (few-shot chain of thought, greedy) and bits per byte.

Accuracy is measured as the math evaluation harness of Rho-1, ProX and the paper measures it (prompts, extraction
and grading in math_tasks.py), offline, from a LitGPT checkpoint. Generation is greedy, LitGPT's `GPT` with a KV cache
whose rows each hold one question at its own positions (continuous batching, as vLLM, which the harness runs, does):
a step is one forward of every row, and a question that ends leaves its row to the next waiting one, so the device
is never busy with rows that have ended. Each question gets the harness's budget within its own context.

Accuracy of a 1B model trained on a laptop is ~0, so there is also bits per byte of held-out text: summed token losses
divided by the bytes of the text they encode. It does not depend on the tokenizer, so a TinyLlama student and a Qwen
teacher are measured in the same unit.
"""

import json
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from litgpt.config import Config
from litgpt.model import KVCache
from tqdm import tqdm

from litgpt_vocagnolm.data.documents import parse_text_key, read_whole_files
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, check_writable
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

# Prompt positions per prefill forward, and prompts prefilled together in it at most: a prefill's activations are
# those of PREFILL_ROWS x PREFILL_CHUNK tokens.
PREFILL_CHUNK = 512
PREFILL_ROWS = 8
# The most questions decoded at a time on CPU by default: a bound on a CPU run's memory and on its wait for results.
CPU_BATCH_SIZE = 32
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
    documents = read_whole_files(bpb, parse_text_key(text_key), "--bpb") if bpb else {}
    empty = [str(path) for path, texts in documents.items() if not any(texts)]
    if empty:  # bits per byte over no bytes is no number
        raise InvalidArgument(f"--bpb: {', '.join(empty)} holds no text, only empty records: give text to measure")
    if documents:  # bits per byte sums the per-token loss
        gpt.check_per_token_loss(Config.from_file(checkpoint_dir / "model_config.yaml"), f"--bpb of {checkpoint_dir}")
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
    if selected:  # each task's row was written as it ended: a later task's failure loses nothing
        print((out_dir / "results.md").read_text(encoding="utf-8"))
    print(f"Wrote results to {out_dir}")


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


# Generation


def default_batch_size(model) -> int:
    """The most questions whose decoding fits in 80% of the device's free memory (the rest is for a prefill's
    activations), at most `CPU_BATCH_SIZE` on CPU; printed. A row holds the KV cache of a whole block and, for one
    layer at a time, its keys and values repeated for every query head (grouped-query attention), its attention
    scores and its logits."""
    config, param = model.config, next(model.parameters())
    # A row's KV cache as LitGPT shapes it; on the meta device, where nothing is allocated.
    model.set_kv_cache(batch_size=1, max_seq_length=config.block_size, device=torch.device("meta"), dtype=param.dtype)
    cache = sum(block.attn.kv_cache.k.nbytes + block.attn.kv_cache.v.nbytes for block in model.transformer.h)
    model.clear_kv_cache()
    buffers = ((2 * config.head_size + 1) * config.n_head * config.block_size + config.padded_vocab_size) * 4  # fp32
    per_row = cache + buffers
    free, where, most = device_memory(param.device)
    fits = int(0.8 * free) // per_row
    if fits < 1:
        raise MemoryError(
            f"decoding one question needs {per_row / 2**20:.0f} MiB, more than 80% of the {free / 2**20:.0f} MiB free"
            f" in {where}: free memory, or evaluate on a larger device"
        )
    batch = fits if most is None else min(fits, most)
    print(
        f"Decoding {batch} questions at a time: a row (its KV cache for a block of {config.block_size} tokens and its"
        f" buffers) takes {per_row / 2**20:.1f} MiB, and 80% of the {free / 2**30:.1f} GiB free in {where} holds"
        f" {fits}" + ("" if most is None else f" (at most {most} on CPU)") + "; --batch_size sets another"
    )
    return batch


def device_memory(device: torch.device) -> tuple[int, str, int | None]:
    """What `default_batch_size` reads of `device`: its free bytes, its name, and the most rows it decodes by default
    (None on a GPU: as many as fit; `CPU_BATCH_SIZE` on a CPU, whose threads gain nothing from wider rows)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], torch.cuda.get_device_name(device), None
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "RAM", CPU_BATCH_SIZE


class RowKVCache(KVCache):
    """LitGPT's KV cache with rows that hold different questions at different positions.

    LitGPT's own cache writes rows 0 .. bs-1, with a Python loop over the rows when their positions differ. This one
    writes a decode step's token of every row at that row's own position in one `scatter_`, and a prefill into the
    rows `rows` alone, leaving the others as they are: waiting questions take the places of finished ones.
    """

    rows: Optional[torch.Tensor] = None
    """The rows a prefill writes, (R,) long; None for a decode step, which writes every row."""

    def forward(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`input_pos` (T,) for a prefill of `rows`, (B, 1) for a decode step; `k`, `v` (R or B, groups, T, head
        size). Returns the keys and values of the rows written, (R or B, groups, cache length, head size)."""
        if self.k.dtype != k.dtype:  # the activations' dtype, as LitGPT's cache does under autocast
            self.k, self.v = self.k.to(k.dtype), self.v.to(v.dtype)
        index = input_pos.expand(k.shape[0], -1)[:, None, :, None]  # (R or B, 1, T, 1)
        if self.rows is None:
            self.k.scatter_(2, index.expand_as(k), k)
            self.v.scatter_(2, index.expand_as(v), v)
            return self.k, self.v
        keys = self.k.index_select(0, self.rows).scatter_(2, index.expand_as(k), k)
        values = self.v.index_select(0, self.rows).scatter_(2, index.expand_as(v), v)
        self.k.index_copy_(0, self.rows, keys)
        self.v.index_copy_(0, self.rows, values)
        return keys, values


def set_row_kv_cache(model, batch_size: int, max_seq_length: int) -> list[RowKVCache]:
    """Gives every block of `model` a `RowKVCache` of `batch_size` rows and `max_seq_length` positions; returns them.
    LitGPT's `set_kv_cache` (for one row) builds its causal mask and tells each cache's shape."""
    param = next(model.parameters())
    model.set_kv_cache(batch_size=1, max_seq_length=max_seq_length, device=param.device, dtype=param.dtype)
    caches = []
    for block in model.transformer.h:
        one = block.attn.kv_cache
        cache = RowKVCache((batch_size, *one.k.shape[1:]), (batch_size, *one.v.shape[1:]), param.device, param.dtype)
        block.attn.kv_cache = cache
        caches.append(cache)
    return caches


def prefill(model, caches: list[RowKVCache], rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> list[int]:
    """Writes each prompt's keys and values into its row of the caches, all of them together; returns each one's
    greedy first new token.

    The prompts are right-padded to the longest and run through the model in chunks of positions, one forward per
    chunk for all of them: a question prefilled alone is a few forwards at batch 1, which on a GPU is launches more than
    arithmetic (`benchmarks/bench_evaluate.py --profile`). A padded position writes keys past its prompt's end, into
    its own row, which that row's question overwrites before it attends to them. Only each prompt's last position
    needs logits, so the head runs on those alone (`HeadAtPositions`; for a tiny model the (T, vocab) projection is
    most of the cost).
    """
    device = next(model.parameters()).device
    lengths = torch.tensor([len(prompt) for prompt in prompts])
    ids = torch.zeros(len(prompts), int(lengths.max()), dtype=torch.int64)  # (R, longest)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.as_tensor(prompt)
    ids, last = ids.to(device), (lengths - 1).to(device)  # last: each prompt's last position
    written = torch.tensor(list(rows), device=device)
    for cache in caches:
        cache.rows = written
    head = model.lm_head
    model.lm_head = at_positions = HeadAtPositions(head)
    logits = None  # (R, vocab) each prompt's logits at its last position
    try:
        for start in range(0, ids.shape[1], PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, ids.shape[1])
            at_positions.positions = (last - start).clamp(0, end - start - 1)
            here = model(ids[:, start:end], torch.arange(start, end, device=device), input_pos_maxp1=end)[:, 0]
            inside = ((last >= start) & (last < end))[:, None]
            logits = here if logits is None else torch.where(inside, here, logits)
    finally:
        model.lm_head = head
        for cache in caches:
            cache.rows = None
    return logits.argmax(dim=-1).tolist()  # a CPU-GPU sync per prefill: a first token may end its question


class HeadAtPositions(torch.nn.Module):
    """A model's head on one position of each row, put in the head's place for a prefill: it runs inside the model's
    forward, under the precision Fabric sets there (the weights' bf16 under `bf16-true`, autocast under `bf16-mixed`),
    as a decode step's head does. Called on what the forward returns instead, it would get the activations as Fabric
    hands them back, in float32, against bf16 weights."""

    positions: Optional[torch.Tensor] = None
    """(R,) long: the position, within the forward's chunk, whose logits each row returns."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(R, T, embedding) -> (R, 1, vocab): the logits at each row's position."""
        return self.head(x[torch.arange(x.shape[0], device=x.device), self.positions][:, None])


@dataclass
class Continuation:
    """One question's new tokens, and their text decoded a few tokens at a time, as vLLM's incremental detokenizer
    does: the text of `tokens[start:]` less that of `tokens[start:read]` is what the tokens after `read` add. The
    context before `read` keeps what a tokenizer does at a text's start (SentencePiece's leading space) out of the
    middle; a text that ends in an unfinished character (U+FFFD) waits for the next tokens."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    start: int = 0
    read: int = 0

    def add(self, token: int, decode: Callable[[list[int]], str], stop_strings: Sequence[str] = ()) -> bool:
        """Appends `token`; whether the text it adds completes a stop string. The stop strings are looked for in that
        text and the characters before it where one could start, not in the whole text."""
        self.tokens.append(token)
        known, new = decode(self.tokens[self.start : self.read]), decode(self.tokens[self.start :])
        if len(new) <= len(known) or new.endswith("\ufffd"):
            return False
        piece = new[len(known) :]
        self.text += piece
        self.start, self.read = self.read, len(self.tokens)
        tail = self.text[-(len(piece) + max(map(len, stop_strings), default=1) - 1) :]
        return any(stop in tail for stop in stop_strings)


class Generation(NamedTuple):
    text: str
    """The decoded new tokens, cut at the first stop string."""
    new_tokens: int
    """Tokens generated: up to the one that completed a stop string, EOS not counted."""


@torch.inference_mode()
def generate_greedy(
    model,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_strings: Sequence[str] = (),
    batch_size: int = 8,
    desc: Optional[str] = None,
) -> list[Generation]:
    """Greedy continuations of `prompts`, decoded together with continuous batching.

    Each prompt gets its own budget: up to `max_new_tokens` new tokens within the model's block size, so a prompt of
    T tokens gets min(max_new_tokens, block_size - T). Prompts must be shorter than the block. Up to `batch_size`
    questions are decoded at once, longest prompts first, each in its own row of a `RowKVCache` at its own positions;
    one step is one forward of every row (its last token at its next position, a (B, 1) `input_pos` that LitGPT
    turns into per-row RoPE angles and causal masks). A question ends at EOS, once its text holds a stop string, or
    at its budget; waiting questions are then prefilled into the rows that ended at that step, together (`prefill`,
    up to `PREFILL_ROWS` in one forward per chunk; at the start, the first `batch_size`). Stop strings are looked for
    in the text that the step's token adds (and the characters before it that a stop string could start in), not in
    the whole text. The returned text is the whole of a question's new tokens decoded at once, cut at its first stop
    string. Each row computes what it would alone (up to float rounding). `desc` shows a progress bar of questions.
    """
    block_size = model.config.block_size
    too_long = [len(prompt) for prompt in prompts if not 0 < len(prompt) < block_size]
    if too_long:
        raise ValueError(
            f"prompts need 1 to {block_size - 1} tokens (a block of {block_size} less one new token), got {too_long[0]}"
        )
    if not prompts:
        return []
    budgets = [min(max_new_tokens, block_size - len(prompt)) for prompt in prompts]
    seq_len = max(len(prompt) + budget for prompt, budget in zip(prompts, budgets))
    window = model.config.sliding_window_size
    if window is not None and any(model.config.sliding_window_indices) and window < seq_len:
        # The causal mask has no window, and LitGPT's ring-buffer KV cache cannot prefill past one.
        raise InvalidArgument(
            f"{model.config.name} attends over a sliding window of {window} tokens, and a question here takes"
            f" {seq_len} prompt and new tokens, which this decoding does not support: lower --max_new_tokens."
        )
    device = next(model.parameters()).device
    decode, eos = tokenizer.processor.decode, tokenizer.eos_id
    continuations = [Continuation() for _ in prompts]
    # Longest first: running out of memory shows at once, and the short prompts fill the last rows.
    waiting = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
    progress = tqdm(total=len(prompts), desc=desc, unit="question", disable=desc is None)

    def ends(i: int, token: int) -> bool:
        """Adds `token` to question i; whether the question has ended."""
        if token == eos:
            return True
        return continuations[i].add(token, decode, stop_strings) or len(continuations[i].tokens) == budgets[i]

    batch = min(batch_size, len(prompts))
    caches = set_row_kv_cache(model, batch, seq_len)
    questions: list[Optional[int]] = [None] * batch  # the question in each row of the caches; None: nothing left
    positions, last = [0] * batch, [0] * batch  # each row's next position, and the token that goes there

    def fill(free: list[int]) -> None:
        """Prefills waiting questions into the `free` rows, up to PREFILL_ROWS at a time, until each holds one that
        needs more than its first token or nothing waits."""
        for row in free:
            questions[row] = None
        while free and waiting:
            taken = [waiting.popleft() for _ in range(min(len(free), PREFILL_ROWS, len(waiting)))]
            rows = free[: len(taken)]
            for row, i, token in zip(rows, taken, prefill(model, caches, rows, [prompts[i] for i in taken])):
                if ends(i, token):
                    progress.update()
                else:
                    questions[row], positions[row], last[row] = i, len(prompts[i]), token
            free = [row for row in free if questions[row] is None]

    try:
        fill(list(range(batch)))
        while any(i is not None for i in questions):
            keep = [row for row, i in enumerate(questions) if i is not None]
            if len(keep) < len(questions):  # nothing waits for these rows: the batch shrinks
                index = torch.tensor(keep, device=device)
                for cache in caches:
                    cache.k, cache.v = cache.k.index_select(0, index), cache.v.index_select(0, index)
                questions, positions, last = ([values[row] for row in keep] for values in (questions, positions, last))
            input_pos = torch.tensor(positions, device=device)[:, None]  # (B, 1)
            tokens = torch.tensor(last, device=device)[:, None]  # (B, 1)
            logits = model(tokens, input_pos, input_pos_maxp1=max(positions) + 1)  # (B, 1, vocab)
            new = logits[:, -1].argmax(dim=-1).tolist()  # a CPU-GPU sync per step: stop strings are found in text
            ended = []
            for row, token in enumerate(new):
                positions[row] += 1
                if ends(questions[row], token):
                    progress.update()
                    ended.append(row)
                else:
                    last[row] = token
            fill(ended)  # the rows that ended together are prefilled together
    finally:
        progress.close()
        model.clear_kv_cache()
    # Each question's new tokens decoded at once, as the harness does; the incremental text only found the stop.
    texts = [tokenizer.decode(torch.tensor(c.tokens)) if c.tokens else "" for c in continuations]
    return [Generation(cut_at_stop(text, stop_strings), len(c.tokens)) for text, c in zip(texts, continuations)]


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
