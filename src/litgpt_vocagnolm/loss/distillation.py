"""The logit-distillation baselines (kld, uld): what the student pays per token for disagreeing with the teacher's
next-token distribution. Pure functions, as the guidance in `loss`.
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def paired_teacher_positions(ranges: Tensor) -> Tensor:
    """The teacher position whose prediction meets each student target, for logit distillation across tokenizers.

    The teacher's prediction of the first teacher token of a target's range (made at the position before it) and the
    student's prediction of the target both continue the same characters. ranges (B, T, 2) -> (B, T) long, -1 where
    unpaired (unmapped, or the range starts the teacher window).
    """
    start, end = ranges.unbind(-1)  # (B, T) each
    return torch.where((end > start) & (start > 0), start - 1, -1)


def kld_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    valid: Tensor,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_size: int = 128,
) -> Tensor:
    """Forward KL(teacher || student) of each position's next-token distributions over the student's vocabulary.

    Every student token has the same id in the teacher's vocabulary (ids [0, vocab_size)); the teacher's other columns
    (tokens the student lacks, such as Llemma's 16 infill tokens after TinyLlama's 32,000, and padding rows) are
    dropped and its distribution renormalised over the student's tokens. The student's distribution is its softmax
    over all its rows, as its cross-entropy sees it, so mass on its padding rows (which the teacher gives 0) counts.
    Both are softened by `temperature` and the result scaled by temperature**2 (Hinton et al., 2015), so the
    gradient's size does not change with the temperature. Computed in float32, `chunk_size` rows at a time; autograd
    keeps the student's float32 log-probabilities (B * T * Vs * 4 bytes), a cost only this baseline pays.

    Args:
        student_logits: (B, T, Vs), Vs >= vocab_size.
        teacher_logits: (B, T, Vt), Vt >= vocab_size; no gradient flows into it.
        valid: (B, T) bool.
        vocab_size: the student tokenizer's vocabulary size (with added tokens).

    Returns: (B, T) float32, 0 where not valid.
    """
    (B, T, Vs), Vt = student_logits.shape, teacher_logits.shape[-1]
    if teacher_logits.shape[:2] != (B, T) or valid.shape != (B, T) or not 0 < vocab_size <= min(Vs, Vt):
        raise ValueError(
            f"kld needs student logits (B, T, Vs), teacher logits (B, T, Vt) and valid (B, T) with vocab_size <="
            f" min(Vs, Vt), got {tuple(student_logits.shape)}, {tuple(teacher_logits.shape)}, {tuple(valid.shape)},"
            f" vocab_size {vocab_size}: the teacher's vocabulary must hold the student's"
        )
    student = student_logits.reshape(B * T, Vs)
    teacher = teacher_logits.detach().reshape(B * T, Vt)
    chunks = []
    for start in range(0, B * T, chunk_size):
        rows = slice(start, start + chunk_size)
        log_q = torch.log_softmax(student[rows].float() / temperature, dim=-1)[:, :vocab_size]
        log_p = torch.log_softmax(teacher[rows, :vocab_size].float() / temperature, dim=-1)
        chunks.append(F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1))
    kl = torch.cat(chunks).view(B, T) * temperature**2
    return torch.where(valid, kl, 0.0)


def uld_loss(
    student_logits: Tensor, teacher_logits: Tensor, pair_index: Tensor, valid: Tensor, chunk_size: int = 128
) -> Tensor:
    """Universal Logit Distillation (Boizard et al., 2024): L1 distance between sorted probability vectors.

    Both probability vectors are sorted in decreasing order and the shorter is zero-padded to the larger vocabulary.
    Only the top `min(Vs, Vt)` entries are sorted (`topk`); the larger vocabulary's tail enters as its summed mass.
    Student position i is paired with teacher position `pair_index[b, i]`, taken from the alignment (e.g. the last
    teacher token of i's range), never by index. Sorting a 152k teacher vocabulary per token is this baseline's cost.

    Args:
        student_logits: (B, T, Vs).
        teacher_logits: (B, M, Vt), no gradient flows into it.
        pair_index: (B, T) long into the teacher positions of the row, -1 = unpaired.
        valid: (B, T) bool.

    Returns: (B, T) float32, 0 where not valid or unpaired.
    """
    (B, T, Vs), (Bt, M, Vt) = student_logits.shape, teacher_logits.shape
    if B != Bt or pair_index.shape != (B, T) or valid.shape != (B, T):
        raise ValueError(
            f"uld needs student logits (B, T, Vs), teacher logits (B, M, Vt), pair_index and valid (B, T), got"
            f" {tuple(student_logits.shape)}, {tuple(teacher_logits.shape)}, {tuple(pair_index.shape)},"
            f" {tuple(valid.shape)}"
        )
    paired = valid & (pair_index >= 0)
    torch._assert_async((pair_index < M).all(), f"pair_index must be < M={M} (or -1: unpaired)")
    student = student_logits.reshape(B * T, Vs)
    teacher = teacher_logits.detach().reshape(B * M, Vt)
    teacher_row = (pair_index.clamp(min=0) + torch.arange(B, device=pair_index.device)[:, None] * M).reshape(-1)
    width = min(Vs, Vt)
    chunks = []
    for start in range(0, B * T, chunk_size):
        rows = slice(start, start + chunk_size)
        q = torch.softmax(student[rows].float(), dim=-1)
        with torch.no_grad():
            p = torch.softmax(teacher[teacher_row[rows]].float(), dim=-1)
            p_top = p.topk(width, dim=-1, sorted=True).values
        q_top = q.topk(width, dim=-1, sorted=True).values
        distance = (q_top - p_top).abs().sum(-1)
        # The zero-padded entries of the smaller vocabulary meet the larger one's tail: |0 - x| = x.
        if Vs > width:
            distance = distance + (1.0 - q_top.sum(-1)).clamp(min=0)
        elif Vt > width:
            distance = distance + (1.0 - p_top.sum(-1)).clamp(min=0)
        chunks.append(distance)
    return torch.where(paired, torch.cat(chunks).view(B, T), 0.0)
