"""`vocagnolm demo`: the whole method in miniature on a CPU, in minutes.

A recipe, read top to bottom: settings, corpus, tokenizers, prepared data, teacher, students, evaluation, table, plot.

1. Corpus: the math text shipped in data/ (GSM8K train, math.stackexchange Q&A), split by document into held-out
   text and two training halves: clean for the teacher, noisy for the students. The students' documents get `noise`
   of their characters replaced by spans of random letters and digits and by shuffled spans: tokens not worth
   learning, as web text (OpenWebMath, the paper's corpus) holds them. The held-out text stays clean: it is what the
   students should learn to model.
2. Tokenizers of two families trained on the teacher's text, the paper's hardest pair in miniature: the student's like
   TinyLlama's (SentencePiece-style BPE, Metaspace, digits split, byte fallback), the teacher's like Qwen2.5's
   (byte-level BPE, Qwen's pre-tokenizer), with twice the vocabulary; for `vocagnolm-2teachers` a second teacher's, of
   the student's family with its own merges and size (as Mistral's beside TinyLlama's).
3. Prepared data: `vocagnolm prepare` on the documents each budget reads once; for two teachers, the students' text
   once per teacher (the same student blocks, each teacher's windows).
4. Teacher: larger than the students, trained with its own tokenizer on clean text (the recipe with `ce`), frozen;
   the second teacher alike, on the same text.
5. Students: one initialisation per seed, the same noisy text and token budget, one run of the `vocagnolm` recipe
   (`recipe.setup`) per method: `ce` (naive training), `random` (as many tokens as the teacher would pick, drawn
   uniformly: the control), `chunk` (chunk-level alignment), `uld` (logit distillation across vocabularies),
   `vocagnolm`, the Table 3 ablations (mean aggregation; unmapped tokens excluded) and `vocagnolm-2teachers` (both
   teachers, each token's lower loss as its reference). The selecting methods read the teachers' per-token losses
   from caches scored once (`vocagnolm score-teacher`); `uld` needs the teacher's logits, so it runs the teacher on
   every batch.
6. Evaluation: held-out bits per byte during training (comparable across tokenizers, so the teacher's too); the share
   of training tokens that touch noise, of all of them and of those each method trains (as its final student selects
   them); the table, the plot and the claims the runs support, printed and written to out_dir.

Why noise: on clean text every token is worth learning, and a student trained on 40% of them falls behind one trained
on all of them. Selection pays off when some training tokens are not worth learning and the teacher can tell which.
docs/demo.md gives a full run's numbers and what the miniature does and does not show.
"""

import contextlib
import csv
import hashlib
import itertools
import json
import logging
import resource
import shutil
import string
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from litgpt.args import EvalArgs, TrainArgs
from litgpt.config import Config
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from litgpt_vocagnolm.alignment import encode, vocab_overlap
from litgpt_vocagnolm.checkpoints import load_weights
from litgpt_vocagnolm.data import VocAgnoData, collate_blocks, load_manifest
from litgpt_vocagnolm.documents import Segment, Stats
from litgpt_vocagnolm.loss import GuidanceArgs, method_selection, selection_generator
from litgpt_vocagnolm.model import GPT
from litgpt_vocagnolm.models import llama_config
from litgpt_vocagnolm.packing import BlockDtypes, aligned_streams, pack_blocks
from litgpt_vocagnolm.recipe import setup
from litgpt_vocagnolm.prepare import prepare
from litgpt_vocagnolm.score_teacher import score_teacher
from litgpt_vocagnolm.teacher import TeacherArgs, teacher_token_loss
from litgpt_vocagnolm.tokenizer_files import cached_tokenizer, find_tokenizer_file, load_tokenizer, tokenizer_info

DATA = Path(__file__).resolve().parents[2] / "data"  # the repository's data/ folder, in a clone
CORPUS = (  # (file, the fields that make one document)
    ("gsm8k/train.jsonl", ("question", "answer")),
    ("stackexchange/math_stackexchange_33votes.jsonl", ("input", "output")),
)
NOISE_CHARACTERS = np.array([ord(c) for c in string.ascii_letters + string.digits], dtype=np.uint32)
# Qwen2.5's pre-tokenizer: letters, single digits, punctuation runs, whitespace (tests/fixtures/tokenizers/qwen2.5).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass
class DemoSizes:
    """How big the miniature is. The defaults take about 5 minutes on 2 idle CPU cores (the demo prints its time)."""

    documents: int | None = None
    """Documents read from the corpus (None: all 8,461); the budgets take what they need of them."""
    heldout_share: float = 0.01
    """Share of the documents held out (clean) for evaluation, chosen by a hash of their text."""
    student_vocab_size: int = 3000
    """Student vocabulary, 259 special and byte-fallback tokens included."""
    teacher_vocab_size: int = 6000
    """Teacher vocabulary."""
    second_teacher_vocab_size: int = 4000
    """The second teacher's vocabulary (`vocagnolm-2teachers`): of the student's family, its merges learnt from half
    the teacher's text, so that its ids differ from the student's, as Mistral's from TinyLlama's."""
    max_seq_length: int = 128
    """Student tokens per training sequence."""
    micro_batch_size: int = 16
    """Sequences per optimizer step."""
    student_layers: int = 2
    """Student transformer blocks."""
    student_width: int = 128
    """Student embedding size (heads of 32)."""
    teacher_layers: int = 3
    """Teacher transformer blocks."""
    teacher_width: int = 192
    """Teacher embedding size (heads of 32)."""
    teacher_tokens: int = 204_800
    """The teacher's training budget in its own tokens (100 steps of 16 x 128), which hold more text than the
    students'."""
    student_tokens: int = 204_800
    """Each student's training budget (100 steps of 16 x 128)."""
    evaluations: int = 5
    """Held-out evaluations per run: the points of each curve."""
    eval_batches: int = 1000
    """Held-out batches per evaluation at most: more than the held-out set holds, so all of it, the same for all."""
    noise_batches: int = 4
    """Micro-batches of the students' first training blocks on which the tokens touching noise are counted, of all
    tokens and of those each method trains."""


QUICK = DemoSizes(
    documents=400, heldout_share=0.1, student_vocab_size=600, teacher_vocab_size=1000, second_teacher_vocab_size=800,
    max_seq_length=32,
    micro_batch_size=4, student_layers=1, student_width=32, teacher_layers=1, teacher_width=64,
    teacher_tokens=4096, student_tokens=2048, evaluations=2, eval_batches=4, noise_batches=2,
)  # fmt: skip
"""A few steps of everything: what `--quick` and the tests run."""

# The compared students: name -> `GuidanceArgs` fields (`top_k` comes from `demo(top_k=...)` for the selecting ones).
METHODS: dict[str, dict[str, str]] = {
    "ce": {"method": "ce"},
    "random": {"method": "random"},
    "chunk": {"method": "chunk"},
    "uld": {"method": "uld"},
    "vocagnolm": {"method": "vocagnolm"},
    "vocagnolm-mean": {"method": "vocagnolm", "aggregation": "mean"},
    "vocagnolm-exclude": {"method": "vocagnolm", "unmapped": "exclude"},
    "vocagnolm-2teachers": {"method": "vocagnolm", "teachers": "min"},
}
TWO_TEACHERS = ("vocagnolm-2teachers",)  # guided by both teachers' loss caches, the lower loss of the two per token
TEACHER_FREE = ("ce", "random")  # `random` draws among the mapped tokens: it needs the alignment, not the teacher
LOGIT_DISTILLATION = ("uld",)  # needs the teacher's logits: the teacher runs online; the others read the loss cache
LEARNING_RATE = 2e-3  # AdamW, cosine to a tenth of it; tiny models take a large rate


def demo(
    out_dir: Path = Path("out/demo"),
    methods: tuple[str, ...] = tuple(METHODS),
    seeds: tuple[int, ...] = (1, 2),
    seeded_methods: tuple[str, ...] = ("ce", "vocagnolm", "vocagnolm-2teachers"),
    noise: float = 0.3,
    top_k: float = 0.4,
    sizes: DemoSizes = DemoSizes(),
    quick: bool = False,
    workers: int = 2,
    data_dir: Path = DATA,
) -> None:
    """The whole method in miniature on a CPU: a teacher with one tokenizer guides students with another.

    Writes out_dir/results.csv (one row per method), results.md and bpb.png (held-out bits per byte against training
    tokens), and prints the table, the noise shares and what the runs show.

    Arguments:
        out_dir: Where everything goes (corpus, tokenizers, prepared data, runs, results); the demo's folders in it
            are replaced.
        methods: The students, from: ce, random, chunk, uld, vocagnolm, vocagnolm-mean (Table 3: mean aggregation),
            vocagnolm-exclude (Table 3: unmapped tokens not trained), vocagnolm-2teachers (a second teacher, of
            another tokenizer family, beside the first: each token's lower teacher loss is its reference).
        seeds: Student seeds (initialisation and data order). Every method runs with the first.
        seeded_methods: The methods run with every seed, to tell a small difference from seed noise.
        noise: Share of each student document's characters replaced by noise (0: clean text).
        top_k: Share of the mapped tokens trained by the selecting methods (vocagnolm, chunk, random); the paper's 0.4.
        sizes: Corpus, vocabulary, model and budget sizes. See ``DemoSizes``.
        quick: Tiny sizes instead (``QUICK``): every stage in well under a minute; a smoke test, its numbers mean
            nothing.
        workers: Training runs at a time, each a process of one thread.
        data_dir: The shipped corpus (the repository's data/ folder).
    """
    # Settings, checked before any work.
    sizes, out_dir, data_dir = (QUICK if quick else sizes), Path(out_dir), Path(data_dir)
    unknown = [m for m in (*methods, *seeded_methods) if m not in METHODS]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}: choose from {', '.join(METHODS)}.")
    if not methods or not seeds or workers < 1:
        raise ValueError("Give at least one method, one seed and one worker.")
    if not 0 <= noise < 1:
        raise ValueError(f"--noise is a share of characters in [0, 1), got {noise}.")
    sample_tokens = sizes.noise_batches * sizes.micro_batch_size * (sizes.max_seq_length + 1)
    if not 0 < sample_tokens <= sizes.student_tokens:
        raise ValueError(
            f"--sizes.noise_batches {sizes.noise_batches} counts noise on {sample_tokens:,} training tokens: it must"
            f" be at least 1 and fit the students' budget of {sizes.student_tokens:,} tokens."
        )
    missing = [file for file, _ in CORPUS if not (data_dir / file).is_file()]
    if missing:
        raise FileNotFoundError(
            f"The demo's corpus is not in {data_dir} (missing {', '.join(missing)}): run it from a clone of the"
            " repository, or pass --data_dir DIR with the repository's data/ folder."
        )
    for folder in ("corpus", "tokenizers", "data", "runs"):
        shutil.rmtree(out_dir / folder, ignore_errors=True)
    runs = [(m, s) for s in seeds for m in methods if s == seeds[0] or m in seeded_methods]
    t0 = time.perf_counter()

    def stage(title: str) -> None:
        print(f"== {title} [{time.perf_counter() - t0:.0f} s]")

    # 1. Corpus: held-out text; the training documents in two halves, clean for the teacher, noisy for the students
    # (so that the teacher's guidance comes from knowing math text, not from having read these documents).
    stage(f"Corpus: {', '.join(file for file, _ in CORPUS)} in {data_dir}")
    train_texts, heldout_texts = split_heldout(read_corpus(data_dir, sizes.documents), sizes.heldout_share)
    teacher_texts, student_texts = train_texts[0::2], train_texts[1::2]

    # 2. Tokenizers of two families, trained on the teacher's text.
    stage("Tokenizers")
    tokenizers = out_dir / "tokenizers"
    student_tokenizer = train_student_tokenizer(teacher_texts, sizes.student_vocab_size, tokenizers / "student")
    teacher_tokenizer = train_teacher_tokenizer(teacher_texts, sizes.teacher_vocab_size, tokenizers / "teacher")
    print(describe_tokenizers(student_tokenizer, teacher_tokenizer, heldout_texts[0]))
    two_teachers = any(m in TWO_TEACHERS for m in methods)
    if two_teachers:  # the student's family, its merges learnt from half the text: a third vocabulary, other ids
        teacher2_tokenizer = train_student_tokenizer(teacher_texts[1::2], sizes.second_teacher_vocab_size,
                                                     tokenizers / "teacher2")  # fmt: skip
        ours = load_tokenizer(student_tokenizer).get_vocab()
        theirs = load_tokenizer(teacher2_tokenizer).get_vocab()
        print(f"Second teacher: SentencePiece-style BPE from half the teacher's text, {len(theirs):,} tokens; it holds"
              f" {len(ours.keys() & theirs.keys()):,} of the student's {len(ours):,},"
              f" {sum(theirs.get(token) == i for token, i in ours.items()):,} with the same id.")  # fmt: skip

    # 3. Prepared data (`vocagnolm prepare`): the documents each budget reads, once. The students' get noise.
    stage("Prepared data (`vocagnolm prepare`)")
    rng = np.random.default_rng(0)
    noisy = [add_noise(text, noise, rng) for text in student_texts]  # (text, its noisy characters) per document
    teacher_texts = documents_for(teacher_texts, teacher_tokenizer, sizes.teacher_tokens)
    noisy_texts = documents_for([text for text, _ in noisy], student_tokenizer, sizes.student_tokens)
    corpus = out_dir / "corpus"
    write_texts(corpus / "teacher.jsonl", teacher_texts)
    write_texts(corpus / "students.jsonl", noisy_texts)
    write_texts(corpus / "heldout.jsonl", heldout_texts)
    print(
        f"{len(teacher_texts):,} clean documents for the teacher, {len(noisy_texts):,} for the students with"
        f" {noise:.0%} of their characters replaced by noise, {len(heldout_texts):,} held out (clean)."
        f" A student's document:\n  {noisy_texts[0][:200]!r}"
    )
    window = 2 * sizes.max_seq_length  # teacher tokens per student block at most; the teacher's context covers it
    student_data = prepare_data(student_tokenizer, teacher_tokenizer, corpus / "students.jsonl",
                                corpus / "heldout.jsonl", out_dir / "data" / "students", sizes.max_seq_length, window)
    teacher_data = prepare_data(teacher_tokenizer, teacher_tokenizer, corpus / "teacher.jsonl",
                                corpus / "heldout.jsonl", out_dir / "data" / "teacher", sizes.max_seq_length, window)
    if two_teachers:  # the same student blocks, aligned to the second teacher; and its own training data
        student_data2 = prepare_data(student_tokenizer, teacher2_tokenizer, corpus / "students.jsonl",
                                     corpus / "heldout.jsonl", out_dir / "data" / "students-teacher2",
                                     sizes.max_seq_length, window)  # fmt: skip
        teacher2_data = prepare_data(teacher2_tokenizer, teacher2_tokenizer, corpus / "teacher.jsonl",
                                     corpus / "heldout.jsonl", out_dir / "data" / "teacher2", sizes.max_seq_length,
                                     window)  # fmt: skip

    # 4-5. Teacher and students: the recipe, `workers` runs at a time in processes of one thread each (on 2 cores
    # small matrices gain little from a second thread, and the threads of a busy machine wait on each other: a tiny
    # model's matrix products ran 100x slower with 2 threads than with 1, seen here).
    stage(f"Teacher, then {len(runs)} students ({workers} runs at a time)")
    teacher_config = model_config("teacher", sizes.teacher_vocab_size, sizes.teacher_layers, sizes.teacher_width,
                                  window)
    student_config = model_config("student", sizes.student_vocab_size, sizes.student_layers, sizes.student_width,
                                  sizes.max_seq_length)
    teacher2_config = model_config("teacher2", sizes.second_teacher_vocab_size, sizes.teacher_layers,
                                   sizes.teacher_width, window)  # fmt: skip
    teacher_dir = out_dir / "runs" / "teacher" / "final"  # lit_model.pth, model_config.yaml, the tokenizer files
    teacher2_dir = out_dir / "runs" / "teacher2" / "final"
    cache, cache2 = out_dir / "data" / "teacher-loss", out_dir / "data" / "teacher2-loss"

    def student(pool: ProcessPoolExecutor, method: str, seed: int) -> Future:
        kind = METHODS[method]["method"]
        guidance = {**METHODS[method], **({} if kind in ("ce", "uld") else {"top_k": top_k})}
        teacher = None if kind in TEACHER_FREE else teacher_dir
        loss_cache = None if kind in TEACHER_FREE + LOGIT_DISTILLATION else cache
        more = {}
        if method in TWO_TEACHERS:  # the second teacher's data beside the first's, a cache for each
            teacher, loss_cache = [teacher_dir, teacher2_dir], [cache, cache2]
            more = {"other_teachers": (student_data2,)}
        return pool.submit(train_run, out_dir / "runs" / f"{method}-seed{seed}", student_config, student_data,
                           student_tokenizer, sizes, sizes.student_tokens, seed, guidance, teacher, loss_cache, **more)

    results: dict[str, list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=one_thread) as pool:
        # The teacher: larger, on clean text with its own tokenizer; then frozen.
        trained = pool.submit(train_run, out_dir / "runs" / "teacher", teacher_config, teacher_data,
                              teacher_tokenizer, sizes, sizes.teacher_tokens, 0, {"method": "ce"})
        if two_teachers:  # the same clean text and budget (in its own tokens), its own tokenizer and initialisation
            trained2 = pool.submit(train_run, out_dir / "runs" / "teacher2", teacher2_config, teacher2_data,
                                   teacher2_tokenizer, sizes, sizes.teacher_tokens, 1, {"method": "ce"})
        # Per seed one initialisation, the same noisy text and budget. Students that need no teacher start at once.
        futures = {student(pool, m, s): (m, s) for m, s in runs if METHODS[m]["method"] in TEACHER_FREE}
        teacher = trained.result()
        print(summarize_run("teacher", teacher))
        teacher2 = trained2.result() if two_teachers else None
        if teacher2 is not None:
            print(summarize_run("second teacher", teacher2))
        # uld runs the teacher on every batch and sorts both vocabularies' probabilities for every token (5x the cost
        # of a `ce` step), so it starts first. The others need only the teacher's per-token losses, scored once.
        futures |= {student(pool, m, s): (m, s) for m, s in runs if METHODS[m]["method"] in LOGIT_DISTILLATION}
        cached = [(m, s) for m, s in runs if METHODS[m]["method"] not in TEACHER_FREE + LOGIT_DISTILLATION]
        if cached:
            scored = [pool.submit(score_run, student_data, teacher_dir, cache)]
            if two_teachers:
                scored.append(pool.submit(score_run, student_data2, teacher2_dir, cache2))
            for future in scored:
                future.result()
        futures |= {student(pool, m, s): (m, s) for m, s in cached}
        for future in as_completed(futures):
            method, seed = futures[future]
            results.setdefault(method, []).append(future.result())
            print(summarize_run(f"{method} (seed {seed})", results[method][-1]))
    results = {m: sorted(results[m], key=lambda run: run["seed"]) for m in methods}

    # 6. Evaluation: held-out bits per byte (logged by the runs); noise in the tokens each method trains; table, plot,
    # claims.
    stage("Noise: the share of training tokens that touch it, of all and of those each method trains")
    teachers = [(teacher_tokenizer, teacher_dir)] + ([(teacher2_tokenizer, teacher2_dir)] if two_teachers else [])
    samples, touched = noise_sample(noisy[: len(noisy_texts)], student_tokenizer, [t for t, _ in teachers], sizes,
                                    window)  # fmt: skip
    samples = [score_blocks(d, blocks) for (_, d), blocks in zip(teachers, samples)]  # each teacher's losses
    noise_all = touched[:, 1:].float().mean().item()  # the targets of full blocks
    for method in methods:
        guidance = GuidanceArgs(**{**METHODS[method], "top_k": top_k})
        scored = samples if method in TWO_TEACHERS else samples[:1]
        for run in results[method]:
            run_dir = out_dir / "runs" / f"{method}-seed{run['seed']}" / "final"
            run["noise_trained"] = trained_noise_share(run_dir, guidance, scored, touched, sizes, run["seed"])
    rows = [method_row(method, results[method], noise_all) for method in methods]
    write_csv(out_dir / "results.csv", rows)
    table = markdown_table(rows, teacher, teacher2)
    summary = noise_summary(rows, touched[:, 1:].numel())
    (out_dir / "results.md").write_text(f"{table}\n\n{summary}\n", encoding="utf-8")
    plot(out_dir / "bpb.png", results, teacher, noise, top_k)
    stage(f"Results: held-out bits per byte after {rows[0]['tokens']:,} training tokens")
    print(table)
    stage("What these runs show")
    print("\n".join([summary, *claims(results, teacher)]))
    # ru_maxrss: KiB on Linux; the children's is the largest of the training processes, once the pool has ended.
    peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) * 1024
    print(f"Wrote {out_dir / 'results.csv'}, {out_dir / 'results.md'} and {out_dir / 'bpb.png'}"
          f" in {time.perf_counter() - t0:.0f} s; the largest process peaked at {peak / 1e9:.1f} GB.")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# 1. Corpus


def read_corpus(data_dir: Path, limit: int | None = None) -> list[str]:
    """The shipped math documents (question and answer joined by a blank line), GSM8K's and Stack Exchange's
    interleaved so that any `limit` keeps both kinds."""
    sources = []
    for file, keys in CORPUS:
        with open(data_dir / file, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        sources.append(["\n\n".join(record[key] for key in keys) for record in records])
    # Document i of a source of n goes at position i / n.
    order = sorted((i / len(docs), s, i) for s, docs in enumerate(sources) for i in range(len(docs)))
    return [sources[s][i] for _, s, i in order][:limit]


def split_heldout(documents: list[str], share: float) -> tuple[list[str], list[str]]:
    """(training, held-out) documents; a document is held out by a hash of its text, the same on every machine."""
    heldout = [int(hashlib.sha256(d.encode()).hexdigest()[:8], 16) < share * 16**8 for d in documents]
    return [d for d, h in zip(documents, heldout) if not h], [d for d, h in zip(documents, heldout) if h]


def add_noise(text: str, share: float, rng: np.random.Generator, span: float = 8.0) -> tuple[str, np.ndarray]:
    """`text` with about `share` of its characters replaced by noise, in spans of `span` characters on average, and
    which characters lie in noisy stretches: (noisy text, (len(text),) bool).

    Clean and noisy stretches alternate, both of geometric length (noise: mean `span`; clean: mean
    `span * (1 - share) / share`, so that noise covers `share` in expectation). A noisy stretch is, by a coin flip,
    random letters and digits or its own characters shuffled: no model can predict either, whatever its vocabulary.
    Vectorized: per-stretch calls into numpy would take ~6 s for the corpus.
    """
    if share == 0 or not text:
        return text, np.zeros(len(text), dtype=bool)
    chars = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).copy()  # (n,) code points
    n = len(chars)
    # Stretch lengths, clean and noisy in turn, until they cover the text: (2k,) -> the stretch of each character.
    lengths = np.zeros(0, dtype=np.int64)
    while lengths.sum() < n:
        k = int(n * share / span) + 8
        more = np.stack([rng.geometric(share / (span * (1 - share)), k), rng.geometric(1 / span, k)], axis=1)
        lengths = np.concatenate([lengths, more.ravel()])
    stretch = np.repeat(np.arange(len(lengths)), lengths)[:n]  # (n,)
    shuffled = rng.random(len(lengths)) < 0.5  # per stretch; only the noisy (odd) ones matter
    noisy = stretch % 2 == 1
    letters = np.flatnonzero(noisy & ~shuffled[stretch])
    chars[letters] = NOISE_CHARACTERS[rng.integers(0, len(NOISE_CHARACTERS), len(letters))]
    mixed = np.flatnonzero(noisy & shuffled[stretch])
    order = np.lexsort((rng.random(len(mixed)), stretch[mixed]))  # a random order within each stretch
    chars[mixed] = chars[mixed][order]
    return chars.tobytes().decode("utf-32-le"), noisy


def documents_for(texts: Iterable[str], tokenizer_dir: Path, tokens: int) -> list[str]:
    """The first documents of `texts` that hold `tokens` tokens of this tokenizer, and 5% more: a run of `tokens`
    tokens then reads each of their blocks once, and nothing is prepared that no run reads."""
    tokenizer, documents, count, texts = load_tokenizer(tokenizer_dir), [], 0, iter(texts)
    for batch in iter(lambda: list(itertools.islice(texts, 64)), []):
        for text, encoding in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False)):
            documents.append(text)
            count += len(encoding.ids) + 1  # and a BOS or EOS
            if count >= 1.05 * tokens:
                return documents
    raise ValueError(
        f"The corpus holds {count:,} tokens for this budget of {tokens:,} (plus 5%): lower the budget, or raise"
        " --sizes.documents."
    )


def write_texts(path: Path, texts: list[str]) -> None:
    """One `{"text": ...}` record per line, the input `vocagnolm prepare` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in texts)


# ----------------------------------------------------------------------------------------------------------------
# 2. Tokenizers


def train_student_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> Path:
    """A SentencePiece-style BPE like TinyLlama's (Llama 2's): "▁" marks spaces, digits are split, characters outside
    the learned alphabet fall back to `<0x..>` byte tokens. Ids: `<unk>` 0, `<s>` 1, `</s>` 2, bytes 3-258 (Llama's
    layout), then the merges. Written with a tokenizer_config.json (BOS per document, as Llama's)."""
    specials, byte_tokens = ["<unk>", "<s>", "</s>"], [f"<0x{b:02X}>" for b in range(256)]
    if vocab_size < len(specials) + len(byte_tokens) + 100:
        raise ValueError(f"The student vocabulary needs room for 259 special and byte tokens, not {vocab_size}.")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
        pre_tokenizers.Digits(individual_digits=True),
    ])  # fmt: skip
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(byte_tokens), special_tokens=specials, limit_alphabet=100, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    # The byte tokens go in as plain vocabulary entries (added tokens would match "<0x41>" typed in a text).
    spec = json.loads(tokenizer.to_str())
    learned = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)[len(specials) :]
    spec["model"]["vocab"] = {token: i for i, token in enumerate(specials + byte_tokens + learned)}
    return save_tokenizer(out_dir, json.dumps(spec, ensure_ascii=False), {
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
    })  # fmt: skip


def train_teacher_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> Path:
    """A byte-level BPE like Qwen2.5's: its pre-tokenizer regex (single digits, letter runs), NFC, no unknown token.
    Written with a tokenizer_config.json like Qwen's: no BOS, `<|endoftext|>` ends each document."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return save_tokenizer(out_dir, tokenizer.to_str(), {
        "tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False, "add_prefix_space": False,
        "bos_token": None, "eos_token": "<|endoftext|>",
    })  # fmt: skip


def save_tokenizer(out_dir: Path, tokenizer_json: str, config: dict[str, Any]) -> Path:
    """A tokenizer directory as LitGPT and `vocagnolm prepare` read it: tokenizer.json and tokenizer_config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out_dir


def describe_tokenizers(student_dir: Path, teacher_dir: Path, text: str) -> str:
    """Vocabulary overlap (the paper's Figure 1 measure) and the start of one text in both tokenizations."""
    student, teacher = load_tokenizer(student_dir), load_tokenizer(teacher_dir)
    sample = text[:60]
    return (
        f"Student: SentencePiece-style BPE, {student.get_vocab_size():,} tokens; teacher: byte-level BPE,"
        f" {teacher.get_vocab_size():,} tokens. Vocabulary overlap {vocab_overlap(student, teacher):.1%} of the"
        f" teacher's (TinyLlama vs Qwen2.5: 6.3%).\n"
        f"  student: {student.encode(sample, add_special_tokens=False).tokens}\n"
        f"  teacher: {teacher.encode(sample, add_special_tokens=False).tokens}"
    )


# ----------------------------------------------------------------------------------------------------------------
# 3-5. Prepared data, teacher and students: the package's own commands, in-process


def prepare_data(
    student: Path, teacher: Path, train: Path, heldout: Path, out_dir: Path, max_seq_length: int, window: int
) -> Path:
    """`vocagnolm prepare` with the held-out text as its validation split; its report goes to out_dir.log."""
    with logged(out_dir.with_suffix(".log")):
        prepare(student=student, teacher=teacher, input=[train], val_input=[heldout], output=out_dir,
                max_seq_length=max_seq_length, teacher_max_length=window, num_workers=2, text_key="text")  # fmt: skip
    split = load_manifest(out_dir)["splits"]["train"]
    print(
        f"{out_dir.name}: {split['student_tokens']:,} training tokens, {split['mapped_share']:.1%} of them mapped to"
        " teacher tokens."
    )
    return out_dir


def score_run(data_path: Path, teacher_dir: Path, cache: Path) -> None:
    """`vocagnolm score-teacher`: the teacher's per-token losses on the students' data, once; report in cache.log."""
    with logged(cache.with_suffix(".log")):
        score_teacher(data=data_path, teacher=teacher_dir, output=cache)


def model_config(name: str, vocab_size: int, layers: int, width: int, block_size: int) -> Config:
    """A Llama-style `litgpt.Config` (RMSNorm, SwiGLU, RoPE), heads of 32 dimensions."""
    return llama_config(f"demo-{name}", vocab_size, layers, width, n_head=max(1, width // 32),
                        intermediate_size=int(8 * width / 3) // 8 * 8, block_size=block_size)  # fmt: skip


def train_run(
    out_dir: Path,
    config: Config,
    data_path: Path,
    tokenizer_dir: Path,
    sizes: DemoSizes,
    tokens: int,
    seed: int,
    guidance: dict[str, Any],
    teacher_dir: Path | list[Path] | None = None,
    teacher_cache: Path | list[Path] | None = None,
    other_teachers: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """One run of the recipe (`recipe.setup`), its console output in out_dir/train.log; returns what its logs say.
    Several teachers: `other_teachers` (their prepared data), and a list of checkpoint dirs and of caches.

    The budget is rounded down to whole evaluation intervals, so the last evaluation falls on the last step.
    """
    tokens_per_step = sizes.micro_batch_size * sizes.max_seq_length
    interval = max(1, tokens // tokens_per_step // sizes.evaluations)
    steps = interval * sizes.evaluations
    t0 = time.perf_counter()
    with logged(out_dir / "train.log"):
        setup(
            model_config=config,
            out_dir=out_dir,
            precision="32-true",
            data=VocAgnoData(path=data_path, num_workers=0, seed=seed, other_teachers=list(other_teachers)),
            train=TrainArgs(
                save_interval=None,
                log_interval=interval,
                global_batch_size=sizes.micro_batch_size,
                micro_batch_size=sizes.micro_batch_size,
                max_tokens=steps * tokens_per_step,
                max_seq_length=sizes.max_seq_length,
                lr_warmup_steps=max(1, steps // 20),
                max_norm=1.0,
                min_lr=LEARNING_RATE / 10,
                tie_embeddings=False,
            ),
            eval=EvalArgs(interval=interval, max_iters=sizes.eval_batches, final_validation=False),
            optimizer={
                "class_path": "torch.optim.AdamW",
                "init_args": {"lr": LEARNING_RATE, "weight_decay": 0.1, "betas": [0.9, 0.95]},
            },
            devices=1,
            tokenizer_dir=tokenizer_dir,
            logger_name="csv",
            seed=seed,
            teacher=TeacherArgs(checkpoint_dir=teacher_dir, cache=teacher_cache),
            guidance=GuidanceArgs(**guidance),
        )
    return {**read_metrics(out_dir, tokens_per_step), "seed": seed, "seconds": time.perf_counter() - t0}


def one_thread() -> None:
    """Sets up a training process: one thread, and Lightning's "Seed set to" lines (to the console) silenced."""
    torch.set_num_threads(1)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)


@contextlib.contextmanager
def logged(path: Path) -> Iterator[None]:
    """Sends what a stage prints (progress lines, warnings) to `path`, keeping the demo's console readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        yield


def read_metrics(out_dir: Path, tokens_per_step: int) -> dict[str, Any]:
    """The run's held-out curve and last training figures, from LitGPT's CSV log (out_dir/logs/csv/*/metrics.csv)."""
    (path,) = out_dir.glob("logs/csv/*/metrics.csv")
    with open(path, encoding="utf-8") as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    evaluations = [row for row in rows if "val_bpb" in row]
    logged = [row for row in rows if "loss" in row]
    last = logged[-1]
    shares = [row["reference_share_1"] for row in logged if "reference_share_1" in row]  # several teachers only
    return {
        "second_teacher_share": float(np.mean(shares)) if shares else None,
        "tokens": [int(row["step"] + 1) * tokens_per_step for row in evaluations],  # logged at step - 1
        "bpb": [row["val_bpb"] for row in evaluations],
        "heldout_loss": evaluations[-1]["val_loss"],
        "train_loss": last["loss"],
        "student_loss": last.get("student_loss", last["loss"]),
        "tokens_per_sec": last["tokens_per_sec"],
    }


def summarize_run(name: str, run: dict[str, Any]) -> str:
    return (
        f"{name}: held-out {run['bpb'][-1]:.3f} bits per byte after {run['tokens'][-1]:,} tokens"
        f" ({run['tokens_per_sec']:,.0f} tokens/s, {run['seconds']:.0f} s)"
    )


# ----------------------------------------------------------------------------------------------------------------
# 6. Noise in the trained tokens; table, plot, claims


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
        _, offsets = encode(cached_tokenizer(student.path), text)  # (N, 2) character spans
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
    student_dir: Path, guidance: GuidanceArgs, samples: list[list[dict[str, Any]]], touched: torch.Tensor,
    sizes: DemoSizes, seed: int,
) -> float:
    """Share of the tokens a method trains that touch noise, with its final student (in `student_dir`) selecting them
    in the blocks of `samples` (one list per teacher, the same student blocks with that teacher's windows scored by
    `score_blocks`), micro-batch by micro-batch as training ranks them; `random` draws as its run did, without the
    teacher's losses. `ce` and `uld` train every token.

    A selection depends on the student, which changes as it trains: this is the last step's, not the run's average.
    """
    model = load_model(student_dir)
    block_tokens, num_chunks = sizes.max_seq_length + 1, guidance.num_chunks if guidance.method == "chunk" else None
    counts = torch.zeros(2)  # (trained tokens touching noise, trained tokens)
    for k, start in enumerate(range(0, len(samples[0]), sizes.micro_batch_size)):
        rows = slice(start, start + sizes.micro_batch_size)
        batch, *more = [collate_blocks(blocks[rows], block_tokens, num_chunks) for blocks in samples]
        trained = batch["targets"] != -100  # (B, T)
        if guidance.method not in ("ce", "uld"):
            ls = model(batch["input_ids"], targets=batch["targets"])  # (B, T)
            sides = [batch, *more]  # each teacher's losses and ranges
            teacher_loss = None if guidance.method in TEACHER_FREE else [side["teacher_loss"] for side in sides]
            ranges = [side["ranges"] for side in sides]
            generator = selection_generator(seed, 0, k + 1, torch.device("cpu"))
            selection = method_selection(guidance, ls, trained, teacher_loss, ranges, generator=generator)
            trained = selection.weights > 0
        counts += torch.stack([(trained & touched[rows, 1:]).sum(), trained.sum()])
    return (counts[0] / counts[1]).item()


def load_model(checkpoint_dir: Path) -> GPT:
    """A demo run's checkpoint, in eval mode."""
    model = GPT(Config.from_file(checkpoint_dir / "model_config.yaml"))
    load_weights(model, checkpoint_dir / "lit_model.pth")
    return model.eval()



def method_row(method: str, runs: list[dict[str, Any]], noise_all: float) -> dict[str, Any]:
    """One method's results, averaged over its seeds: final held-out bits per byte (with the seeds' range), held-out
    loss and training loss (nats per student token), throughput, the share of training tokens touching noise (of all:
    `noise_all`, the same for every method; of those the method trains: `noise_trained`, see `trained_noise_share`),
    and the held-out curve as `bpb@<tokens>` columns."""
    finals = [run["bpb"][-1] for run in runs]
    row = {
        "method": method,
        "seeds": len(runs),
        "tokens": runs[0]["tokens"][-1],
        "heldout_bpb": float(np.mean(finals)),
        "heldout_bpb_min": min(finals),
        "heldout_bpb_max": max(finals),
        "heldout_loss": float(np.mean([run["heldout_loss"] for run in runs])),
        "train_loss": float(np.mean([run["train_loss"] for run in runs])),
        "train_ce": float(np.mean([run["student_loss"] for run in runs])),
        "tokens_per_sec": float(np.mean([run["tokens_per_sec"] for run in runs])),
        "noise_all": noise_all,
        "noise_trained": float(np.mean([run["noise_trained"] for run in runs])),
    }
    for i, tokens in enumerate(runs[0]["tokens"]):
        row[f"bpb@{tokens}"] = float(np.mean([run["bpb"][i] for run in runs]))
    return row


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: list[dict[str, Any]], teacher: dict[str, Any], teacher2: dict[str, Any] | None = None) -> str:
    """Held-out bits per byte (the seeds' range where there are several), losses, the share of trained tokens that
    touch noise and throughput per method, under the teachers' held-out bits per byte (comparable across
    tokenizers)."""
    header = ("method", "seeds", "held-out bits/byte", "held-out loss", "training objective",
              "training CE, all tokens", "trained tokens touching noise", "tokens/s")  # fmt: skip
    bpb, speed = teacher["bpb"][-1], teacher["tokens_per_sec"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
        f"| teacher (own tokenizer, clean text) | 1 | {bpb:.3f} | | | | | {speed:,.0f} |",
    ]
    if teacher2 is not None:
        lines.append(f"| second teacher (vocagnolm-2teachers) | 1 | {teacher2['bpb'][-1]:.3f} | | | | |"
                     f" {teacher2['tokens_per_sec']:,.0f} |")  # fmt: skip
    for row in rows:
        spread = f" ({row['heldout_bpb_min']:.3f}-{row['heldout_bpb_max']:.3f})" if row["seeds"] > 1 else ""
        lines.append(
            f"| {row['method']} | {row['seeds']} | {row['heldout_bpb']:.3f}{spread} | {row['heldout_loss']:.3f}"
            f" | {row['train_loss']:.3f} | {row['train_ce']:.3f} | {row['noise_trained']:.1%}"
            f" | {row['tokens_per_sec']:,.0f} |"
        )
    return "\n".join(lines)


def noise_summary(rows: list[dict[str, Any]], sample_tokens: int) -> str:
    """The measured noise shares in one sentence."""
    trained = ", ".join(f"{row['method']} {row['noise_trained']:.1%}" for row in rows)
    return (
        f"Noise: {rows[0]['noise_all']:.1%} of the students' training tokens touch noise (counted on the first"
        f" {sample_tokens:,}); of the tokens each method trains, as its final student selects them: {trained}."
    )


def plot(
    path: Path, results: dict[str, list[dict[str, Any]]], teacher: dict[str, Any], noise: float, top_k: float
) -> None:
    """Held-out bits per byte against training tokens: one line per method (the mean of its seeds, each seed faint;
    the ablations dashed), the teacher's final figure as a dashed black line."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, runs in results.items():
        tokens = np.array(runs[0]["tokens"]) / 1e3
        style = "--" if method.startswith("vocagnolm-") else "-"
        (line,) = ax.plot(tokens, np.mean([run["bpb"] for run in runs], axis=0), style, marker="o", label=method)
        if len(runs) > 1:
            for run in runs:
                ax.plot(tokens, run["bpb"], color=line.get_color(), alpha=0.3, linewidth=0.8)
    ax.axhline(teacher["bpb"][-1], color="black", linestyle="--", linewidth=1, label="teacher")
    ax.set_xlabel("student training tokens (thousands)")
    ax.set_ylabel("held-out bits per byte (lower is better)")
    ax.set_title(f"Students on math text with {noise:.0%} noise; selection top-k {top_k}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", ncol=2)  # below the curves, which fall from the upper left
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(a: list[float], b: list[float], spread: float | None) -> str:
    """How final bits per byte `a` compare to `b` (lower is better), claimed only beyond seed noise: with several
    seeds on both sides, when every seed of one beats every seed of the other; otherwise when the gap exceeds
    `spread`, the largest range between the seeds of one method (None: no method ran with several seeds)."""
    gap = float(np.mean(a) - np.mean(b))
    if len(a) > 1 and len(b) > 1:
        verdict = "better" if max(a) < min(b) else "worse" if min(a) > max(b) else "no clear difference"
        basis = f"{len(a)} and {len(b)} seeds"
    elif spread is None:
        verdict, basis = "not claimed", "one seed, no seed range measured"
    else:
        verdict = "better" if gap < -spread else "worse" if gap > spread else "no clear difference"
        basis = f"one seed; largest range between seeds {spread:.3f}"
    return f"{gap:+.3f} bits/byte: {verdict} ({basis})"


def claims(results: dict[str, list[dict[str, Any]]], teacher: dict[str, Any]) -> list[str]:
    """The paper's comparisons that these runs can make, each as far as the runs support it."""
    finals = {method: [run["bpb"][-1] for run in runs] for method, runs in results.items()}
    spreads = [max(f) - min(f) for f in finals.values() if len(f) > 1]
    spread = max(spreads) if spreads else None
    best = min(finals, key=lambda method: np.mean(finals[method]))
    lines = [
        f"teacher vs the best student ({best}): {teacher['bpb'][-1] - np.mean(finals[best]):+.3f} bits/byte (the"
        " teacher must know the text better than the students to guide them)"
    ]
    pairs = [
        ("vocagnolm", "ce", "teacher-guided selection vs naive training (Table 1)"),
        ("vocagnolm", "random", "the teacher's choice vs as many tokens drawn at random"),
        ("vocagnolm", "chunk", "token-level vs chunk-level alignment (Table 2)"),
        ("vocagnolm", "uld", "selection vs logit distillation across vocabularies (Table 1)"),
        ("vocagnolm-mean", "vocagnolm", "mean vs max aggregation (Table 3)"),
        ("vocagnolm-exclude", "vocagnolm", "unmapped tokens excluded vs included (Table 3)"),
        ("vocagnolm-2teachers", "vocagnolm", "two teachers (each token's lower loss) vs the first alone"),
    ]
    for a, b, what in pairs:
        if a in finals and b in finals:
            lines.append(f"{a} vs {b}, {what}: {compare(finals[a], finals[b], spread)}")
    for method in TWO_TEACHERS:
        shares = [run["second_teacher_share"] for run in results.get(method, [])]
        if shares:
            lines.append(f"{method}: the second teacher set the reference of {np.mean(shares):.1%} of the selected"
                         " tokens (mean of the logged steps and seeds)")  # fmt: skip
    return lines
