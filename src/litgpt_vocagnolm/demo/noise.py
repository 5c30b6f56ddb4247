"""Noise in the trained tokens: which of the students' training tokens touch noise, and the share of those each
method trains, as its final student selects them."""

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from litgpt_vocagnolm.alignment.lexical import encode
from litgpt_vocagnolm.alignment.tokenizer_files import find_tokenizer_file, load_tokenizer, tokenizer_info
from litgpt_vocagnolm.data.documents import Segment, Stats
from litgpt_vocagnolm.data.packing import BlockDtypes, aligned_streams, pack_blocks
from litgpt_vocagnolm.data.prepared import batch_of_blocks
from litgpt_vocagnolm.demo.settings import DemoSizes
from litgpt_vocagnolm.loss.cross_entropy import IGNORE_INDEX
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss
from litgpt_vocagnolm.models.gpt import load_model
from litgpt_vocagnolm.training.micro_batch import loss_inputs
from litgpt_vocagnolm.training.teacher import teacher_token_loss


def noise_sample(
    documents: list[tuple[str, np.ndarray]], student_dir: Path, teacher_dirs: list[Path], sizes: DemoSizes, window: int
) -> tuple[list[list[dict[str, Any]]], torch.Tensor]:
    """The students' first `noise_batches` micro-batches of training blocks, packed from their first documents as
    `vocagnolm prepare` packs them (`packing.pack_blocks`, the same tokenizers and teacher window), and which student
    tokens of them touch noise: a token does when a character of its span lies in a noisy stretch (added tokens never).

    documents: (text, noisy characters) per document, from `add_noise`. Returns, for each teacher, the blocks as stored
    (the same student tokens, that teacher's windows), and (blocks, max_seq_length + 1) bool.
    """
    student = tokenizer_info(find_tokenizer_file(student_dir))
    block_tokens, wanted = sizes.max_seq_length + 1, sizes.noise_batches * sizes.micro_batch_size
    added = (int(student.bos_id is not None), int(student.eos_id is not None))  # BOS, EOS per document
    texts, touched = [], []
    for text, noisy in documents:
        _, offsets = encode(load_tokenizer(student.path), text)  # (N, 2) character spans
        before = np.concatenate([[0], np.cumsum(noisy)])  # (L + 1,) noisy characters before each character
        spans = before[offsets[:, 1]] > before[offsets[:, 0]]  # (N,)
        touched.append(np.concatenate([np.zeros(added[0], bool), spans, np.zeros(added[1], bool)]))
        texts.append(text)
        if sum(map(len, touched)) >= wanted * block_tokens:
            break
    samples = []
    for teacher in (tokenizer_info(find_tokenizer_file(d)) for d in teacher_dirs):
        dtypes = BlockDtypes.fitting(student.vocab_size, teacher.vocab_size, window)
        whole = (Segment(text, context="", first=True, last=True) for text in texts)  # each document whole, as above
        streams = aligned_streams(whole, student, teacher, Stats())
        samples.append(list(itertools.islice(pack_blocks(streams, block_tokens, window, dtypes, Stats()), wanted)))
    touched = np.concatenate(touched)[: wanted * block_tokens].reshape(wanted, block_tokens)  # the blocks' cut
    return samples, torch.from_numpy(touched)


@torch.no_grad()
def score_blocks(teacher_dir: Path, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks with their windows' teacher losses (`teacher_token_loss`, what `vocagnolm score-teacher` caches)."""
    teacher = load_model(teacher_dir)
    scored = []
    for block in blocks:
        ids = torch.from_numpy(block["teacher_ids"].astype(np.int64))[None]  # (1, M)
        loss = teacher_token_loss(teacher, ids, torch.ones_like(ids, dtype=torch.bool))  # (1, M), NaN first
        scored.append({**block, "teacher_loss": loss[0].numpy()})
    return scored


@torch.no_grad()
def trained_noise_share(
    student_dir: Path,
    guidance: GuidanceArgs,
    samples: list[list[dict[str, Any]]],
    touched: torch.Tensor,
    sizes: DemoSizes,
    seed: int,
    byte_tables: list[torch.Tensor] | None = None,
) -> float:
    """Share of the tokens a method trains that touch noise, with its final student (in `student_dir`) selecting them
    in the blocks of `samples` (one list per teacher, the same student blocks with that teacher's windows scored by
    `score_blocks`), micro-batch by micro-batch as training ranks them; `random` draws as its run does for the
    blocks at these places of the data order, without the teacher's losses. A method that selects no tokens
    (`selects` False in `methods.METHODS`) trains every token. `byte_tables` (`prepared.byte_table` of the
    student's, then each teacher's) for `compare="byte"`.

    A selection depends on the student, which changes as it trains: this is the last step's, not the run's average.
    """
    model, method = load_model(student_dir), guidance.spec
    guided = GuidedLoss(guidance, byte_tables=byte_tables or (), seed=seed)  # one process: rank 0
    block_tokens, num_chunks = sizes.max_seq_length + 1, guidance.num_chunks_if_chunked
    counts = torch.zeros(2)  # (trained tokens touching noise, trained tokens)
    for start in range(0, len(samples[0]), sizes.micro_batch_size):
        rows = slice(start, start + sizes.micro_batch_size)
        batch = batch_of_blocks([blocks[rows] for blocks in samples], block_tokens, num_chunks)
        trained = batch.targets != IGNORE_INDEX  # (B, T)
        if method.selects:
            ls = model(batch.input_ids, targets=batch.targets)  # (B, T)
            teacher_losses = [side.loss for side in batch.teachers] if method.teacher_loss else None
            inputs = loss_inputs(batch, guided, teacher_losses, positions=torch.arange(start, start + len(trained)))
            trained = guided.verdict(ls, trained, inputs).weights > 0
        counts += torch.stack([(trained & touched[rows, 1:]).sum(), trained.sum()])
    return (counts[0] / counts[1]).item()
