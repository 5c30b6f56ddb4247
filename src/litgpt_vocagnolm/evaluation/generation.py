"""Greedy generation for `vocagnolm evaluate`: LitGPT's `GPT` with a KV cache whose rows each hold one question at
its own positions (continuous batching, as vLLM, which the math evaluation harness runs, does): a step is one forward
of every row, and a question that ends leaves its row to the next waiting one, so the device is never busy with rows
that have ended. Each question gets its own budget within its own context, and stops at EOS or a stop string."""

import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch
from litgpt.config import Config
from litgpt.model import KVCache
from tqdm import tqdm

from litgpt_vocagnolm.errors import InvalidArgument

# Prompt positions per prefill forward, and prompts prefilled together in it at most: a prefill's activations are
# those of PREFILL_ROWS x PREFILL_CHUNK tokens.
PREFILL_CHUNK = 512
PREFILL_ROWS = 8
# The most questions decoded at a time on CPU by default: a bound on a CPU run's memory and on its wait for results.
CPU_BATCH_SIZE = 32


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
    budgets = new_token_budgets(model.config, prompts, max_new_tokens)
    if not prompts:
        return []
    seq_len = max(len(prompt) + budget for prompt, budget in zip(prompts, budgets))
    check_window(model.config, seq_len)
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
                keep_rows(caches, keep, device)
                questions, positions, last = ([values[row] for row in keep] for values in (questions, positions, last))
            ended = []
            for row, token in enumerate(greedy_step(model, positions, last, device)):
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


def new_token_budgets(config: Config, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[int]:
    """Each prompt's budget of new tokens: up to `max_new_tokens` within the block size. A prompt must leave room for
    one new token."""
    block_size = config.block_size
    too_long = [len(prompt) for prompt in prompts if not 0 < len(prompt) < block_size]
    if too_long:
        raise ValueError(
            f"prompts need 1 to {block_size - 1} tokens (a block of {block_size} less one new token), got {too_long[0]}"
        )
    return [min(max_new_tokens, block_size - len(prompt)) for prompt in prompts]


def check_window(config: Config, seq_len: int) -> None:
    """Refuses a model that attends over a sliding window shorter than `seq_len`, a question's prompt and new tokens:
    the causal mask has no window, and LitGPT's ring-buffer KV cache cannot prefill past one."""
    window = config.sliding_window_size
    if window is not None and any(config.sliding_window_indices) and window < seq_len:
        raise InvalidArgument(
            f"{config.name} attends over a sliding window of {window} tokens, and a question here takes"
            f" {seq_len} prompt and new tokens, which this decoding does not support: lower --max_new_tokens."
        )


def keep_rows(caches: list[RowKVCache], keep: list[int], device: torch.device) -> None:
    """Keeps the `keep` rows of every layer's cache, in that order, and drops the others."""
    index = torch.tensor(keep, device=device)
    for cache in caches:
        cache.k, cache.v = cache.k.index_select(0, index), cache.v.index_select(0, index)


def greedy_step(model, positions: list[int], last: list[int], device: torch.device) -> list[int]:
    """One forward of every row, its `last` token at its next position; each row's most likely next token."""
    input_pos = torch.tensor(positions, device=device)[:, None]  # (B, 1)
    tokens = torch.tensor(last, device=device)[:, None]  # (B, 1)
    logits = model(tokens, input_pos, input_pos_maxp1=max(positions) + 1)  # (B, 1, vocab)
    return logits[:, -1].argmax(dim=-1).tolist()  # a CPU-GPU sync per step: stop strings are found in text


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first stop string in it."""
    return text[: min((text.index(stop) for stop in stop_strings if stop in text), default=len(text))]
