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

import json
import resource
import shutil
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from functools import partial
from multiprocessing import get_context
from multiprocessing.queues import SimpleQueue
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from litgpt_vocagnolm.data.prepared import byte_table
from litgpt_vocagnolm.demo.corpus import add_noise, demo_texts, documents_for, write_texts
from litgpt_vocagnolm.demo.noise import noise_sample, score_blocks, trained_noise_share
from litgpt_vocagnolm.demo.plot import plot
from litgpt_vocagnolm.demo.runs import (
    Guided,
    model_config,
    one_thread,
    prepare_data,
    score_run,
    summarize_run,
    train_run,
)
from litgpt_vocagnolm.demo.settings import CORPUS, DATA, QUICK, STUDENTS, TWO_TEACHERS, DemoSizes, method_of
from litgpt_vocagnolm.demo.table import claims, markdown_table, method_row, noise_summary, write_csv
from litgpt_vocagnolm.demo.tokenizer_training import describe_second_teacher, describe_tokenizers, train_tokenizers
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, PathTaken, check_writable
from litgpt_vocagnolm.files import write_json
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.loss.selection import check_top_k

# What the demo writes in out_dir, and the record that says a folder holds only that (so a rerun may replace it).
OUTPUTS = ("corpus", "tokenizers", "data", "runs", "results.csv", "results.md", "bpb.png")
RECORD = ".vocagnolm-demo.json"
# The tokenizers the demo trains (`train_tokenizers`): the student's, the teacher's, the second teacher's (or None).
Tokenizers = tuple[Path, Path, Path | None]
# Each teacher's run, and the prepared data of the students' text aligned to it (out_dir/runs/NAME, out_dir/data/DATA).
TEACHERS = {"teacher": "students", "teacher2": "students-teacher2"}


def demo_paths(runs: Sequence[tuple[str, int]]) -> list[str]:
    """What a demo of these student `runs` (method, seed) writes in out_dir, each a file or a folder it makes whole
    (a folder's `.log` beside it): the record of a demo stopped before it finished, so that a rerun replaces those and
    no other file."""
    paths = [f"tokenizers/{name}" for name in ("student", "teacher", "teacher2")]
    paths += [f"corpus/{name}.jsonl" for name in ("teacher", "students", "heldout")]
    data = ("students", "teacher", "students-teacher2", "teacher2", "teacher-loss", "teacher2-loss")
    paths += [f"data/{name}{log}" for name in data for log in ("", ".log")]
    paths += [f"runs/{name}" for name in ("teacher", "teacher2", *(f"{m}-seed{s}" for m, s in runs))]
    return paths + ["results.csv", "results.md", "bpb.png"]


def claim_out_dir(out_dir: Path, paths: Sequence[str] = ()) -> None:
    """Makes out_dir the demo's: refuses a folder that holds anything the demo did not write, deletes what an earlier
    demo wrote there, and records its own `paths` (`demo_paths`) before writing any. What an earlier demo wrote is
    what its record lists: every file it wrote once it finished (`record_finished`), else the paths it would write
    (stopped in the middle, its folders may hold a stage's unfinished files, and a file of yours beside them)."""
    check_writable(out_dir, "--out_dir")  # and not a file
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    record = json.loads((out_dir / RECORD).read_text(encoding="utf-8")) if RECORD in entries else {}
    ours = [name for name in record.get("outputs", []) if name in OUTPUTS]  # never a path an edited record names
    others = [name for name in entries if name not in (RECORD, *ours)]
    if "files" in record:  # a finished demo's: a file put in its folders since (runs/notes.txt) is not its own
        written = set(record["files"])
        others += [name for name in written_files(out_dir, ours) if name not in written]
    else:  # stopped before it finished: the files under the paths it would write are its own, no others
        under = tuple(record.get("paths", []))
        others += [
            name
            for name in written_files(out_dir, ours)
            if not any(name == p or name.startswith(f"{p}/") for p in under)
        ]
    if others:
        more = f" and {len(others) - 5} more" if len(others) > 5 else ""
        raise PathTaken(
            f"--out_dir {out_dir} holds {', '.join(others[:5])}{more}, which `vocagnolm demo` did not write; it"
            " would replace its own folders there. Give a new or empty folder (e.g. --out_dir out/demo)."
        )
    for name in ours:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / RECORD, {"written_by": "vocagnolm demo", "outputs": list(OUTPUTS), "paths": list(paths)})


def record_finished(out_dir: Path) -> None:
    """Adds every file the demo wrote to its record: a rerun then keeps, and refuses to delete, any other file."""
    write_json(
        out_dir / RECORD,
        {"written_by": "vocagnolm demo", "outputs": list(OUTPUTS), "files": written_files(out_dir, OUTPUTS)},
    )


def written_files(out_dir: Path, outputs: Sequence[str]) -> list[str]:
    """Every file under `out_dir`'s `outputs`, by its path relative to `out_dir`."""
    paths = [out_dir / name for name in outputs]
    files = [p for p in paths if p.is_file()] + [f for p in paths if p.is_dir() for f in p.rglob("*") if f.is_file()]
    return sorted(str(f.relative_to(out_dir)) for f in files)


def demo(
    out_dir: Path = Path("out/demo"),
    methods: tuple[str, ...] = tuple(STUDENTS),
    seeds: tuple[int, ...] = (1, 2),
    seeded_methods: tuple[str, ...] = ("ce", "vocagnolm", "vocagnolm-2teachers", "vocagnolm-2teachers-byte"),
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
        out_dir: Where everything goes (corpus, tokenizers, prepared data, runs, results): a new or empty folder, or
            one an earlier demo wrote (it records its own files in .vocagnolm-demo.json): their files are replaced.
            A folder that holds anything else is refused.
        methods: The students, from: ce, random, chunk, uld, vocagnolm, vocagnolm-mean (Table 3: mean aggregation),
            vocagnolm-exclude (Table 3: unmapped tokens not trained), vocagnolm-2teachers (a second teacher, of
            another tokenizer family, beside the first: each token's lower teacher loss is its reference),
            vocagnolm-2teachers-byte (the same, the two teachers' losses compared per byte: `--guidance.compare`).
        seeds: Student seeds (initialisation and data order). Every method runs with the first.
        seeded_methods: The methods run with every seed, to tell a small difference from seed noise.
        noise: Share of each student document's characters replaced by noise, from 0 (clean text) to below 1.
        top_k: Share of the mapped tokens trained by the selecting methods (vocagnolm, chunk, random), above 0 and at
            most 1; the paper's 0.4.
        sizes: Corpus, vocabulary, model and budget sizes. See ``DemoSizes``.
        quick: Tiny sizes instead (``QUICK``): every stage in well under a minute; a smoke test, its numbers mean
            nothing. Not with ``--sizes.*``.
        workers: Training runs at a time, each a process of one thread; at least 1.
        data_dir: The demo's corpus: by default the copy the package carries (the repository's data/ folder).
    """
    started = [time.process_time()]  # this process's start: Python, its imports, the command line (CPU seconds)
    # Settings, checked before any work.
    if quick and sizes != DemoSizes():
        raise InvalidArgument("--quick true sets every size (QUICK): drop the --sizes.* options, or --quick.")
    sizes, out_dir, data_dir = (QUICK if quick else sizes), Path(out_dir), Path(data_dir)
    check_settings(methods, seeds, seeded_methods, noise, top_k, sizes, workers, data_dir)
    runs = [(m, s) for s in seeds for m in methods if s == seeds[0] or m in seeded_methods]
    claim_out_dir(out_dir, demo_paths(runs))
    t0 = time.perf_counter()

    # 1. Corpus: held-out text; the training documents in two halves, clean for the teacher, noisy for the students
    # (so that the teacher's guidance comes from knowing math text, not from having read these documents).
    stage(f"Corpus: {', '.join(file for file, _ in CORPUS)} in {data_dir}", t0)
    texts = demo_texts(data_dir, sizes)

    # 2. Tokenizers of two families, trained on the teacher's text (the same files on every run).
    stage("Tokenizers", t0)
    two_teachers = any(m in TWO_TEACHERS for m in methods)
    tokenizers = train_tokenizers(texts[0], sizes, out_dir / "tokenizers", two_teachers)
    print(describe_tokenizers(tokenizers[0], tokenizers[1], texts[2][0]))
    if tokenizers[2] is not None:
        print(describe_second_teacher(tokenizers[0], tokenizers[2]))

    # 3. Prepared data (`vocagnolm prepare`): the documents each budget reads, once. The students' get noise.
    stage("Prepared data (`vocagnolm prepare`)", t0)
    noisy = write_corpus(out_dir / "corpus", texts, tokenizers, noise, sizes)
    prepare_all(out_dir, tokenizers, sizes)

    # 4-5. Teacher and students: the recipe, `workers` runs at a time in processes of one thread each (on 2 cores
    # small matrices gain little from a second thread, and the threads of a busy machine wait on each other: a tiny
    # model's matrix products ran 100x slower with 2 threads than with 1, seen here).
    stage(f"Teacher, then {len(runs)} students ({workers} runs at a time)", t0)
    teachers, results, training_starts = train_all(out_dir, runs, tokenizers, sizes, top_k, workers)
    results = {m: sorted(results[m], key=lambda run: run["seed"]) for m in methods}

    # 6. Evaluation: held-out bits per byte (logged by the runs); noise in the tokens each method trains; table, plot,
    # claims.
    stage("Noise: the share of training tokens that touch it, of all and of those each method trains", t0)
    noise_all, sampled = count_trained_noise(out_dir, noisy, tokenizers, results, sizes, top_k)
    rows = [method_row(method, results[method], noise_all) for method in methods]
    table, summary = write_results(out_dir, rows, results, teachers, sampled, noise, top_k)
    stage(f"Results: held-out bits per byte after {rows[0]['tokens']:,} training tokens", t0)
    print(table)
    stage("What these runs show", t0)
    print("\n".join([summary, *claims(results, teachers[0])]))
    written = f"{out_dir / 'results.csv'}, {out_dir / 'results.md'} and {out_dir / 'bpb.png'}"
    print(f"Wrote {written} {costs(t0, started + training_starts)}")


def check_settings(
    methods: Sequence[str],
    seeds: Sequence[int],
    seeded_methods: Sequence[str],
    noise: float,
    top_k: float,
    sizes: DemoSizes,
    workers: int,
    data_dir: Path,
) -> None:
    """Refuses `demo`'s settings that cannot run, before any work: unknown methods, nothing to run, shares out of
    range, a noise sample beyond the students' budget, a corpus folder without the corpus."""
    unknown = [m for m in (*methods, *seeded_methods) if m not in STUDENTS]
    if unknown:
        raise InvalidArgument(f"Unknown method(s) {unknown}: choose from {', '.join(STUDENTS)}.")
    if not methods or not seeds or workers < 1:
        raise InvalidArgument("Give at least one method, one seed and one worker.")
    if not 0 <= noise < 1:
        raise InvalidArgument(f"--noise is a share of characters in [0, 1), got {noise}.")
    check_top_k(top_k, what="--top_k")
    sample_tokens = sizes.noise_batches * sizes.micro_batch_size * (sizes.max_seq_length + 1)
    if not 0 < sample_tokens <= sizes.student_tokens:
        raise InvalidArgument(
            f"--sizes.noise_batches {sizes.noise_batches} counts noise on {sample_tokens:,} training tokens: it must"
            f" be at least 1 and fit the students' budget of {sizes.student_tokens:,} tokens."
        )
    missing = [file for file, _ in CORPUS if not (data_dir / file).is_file()]
    if missing:
        raise PathMissing(
            f"The demo's corpus is not in {data_dir} (missing {', '.join(missing)}): leave --data_dir out to use the"
            " corpus the package carries, or give a folder laid out as the repository's data/."
        )


def costs(t0: float, started: list[float]) -> str:
    """What the demo cost: its wall-clock time since `t0`, its CPU time (this process's and that of every process it
    started: the training processes, LitData's workers), the part spent starting Python and importing in this
    process and each training process (`started`: each one's CPU seconds when it was ready), and the largest
    process's peak memory. A loaded machine stretches the wall-clock time, not the CPU time."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    peak = max(u.ru_maxrss for u in usage) * 1024  # KiB on Linux; the children's: the largest of them, once ended
    return (
        f"in {time.perf_counter() - t0:.0f} s, {cpu:.0f} s of CPU time ({sum(started):.0f} s of it starting its"
        f" {len(started)} processes: Python and imports); the largest process peaked at {peak / 1e9:.1f} GB."
    )


def start_training_process(started: SimpleQueue) -> None:
    """Sets up a training process (`runs.one_thread`) and puts in `started` the CPU seconds it took to get here:
    Python's start and the imports (torch, Lightning, LitGPT), which a loaded machine stretches most."""
    one_thread()
    started.put(time.process_time())


def stage(title: str, t0: float) -> None:
    """Prints a stage's title and the seconds since the demo began (at `t0`, a `time.perf_counter`)."""
    print(f"== {title} [{time.perf_counter() - t0:.0f} s]")


def write_corpus(
    corpus: Path, texts: tuple[list[str], list[str], list[str]], tokenizers: Tokenizers, noise: float, sizes: DemoSizes
) -> list[tuple[str, np.ndarray]]:
    """Writes the teacher's, the students' (with `noise` of their characters replaced) and the held-out documents
    (`demo_texts`) to `corpus`, as many as each budget reads; returns the students' documents, each with its noisy
    characters."""
    teacher_texts, student_texts, heldout_texts = texts
    rng = np.random.default_rng(0)
    noisy = [add_noise(text, noise, rng) for text in student_texts]  # (text, its noisy characters) per document
    teacher_texts = documents_for(teacher_texts, tokenizers[1], sizes.teacher_tokens)
    noisy_texts = documents_for([text for text, _ in noisy], tokenizers[0], sizes.student_tokens)
    write_texts(corpus / "teacher.jsonl", teacher_texts)
    write_texts(corpus / "students.jsonl", noisy_texts)
    write_texts(corpus / "heldout.jsonl", heldout_texts)
    print(
        f"{len(teacher_texts):,} clean documents for the teacher, {len(noisy_texts):,} for the students with"
        f" {noise:.0%} of their characters replaced by noise, {len(heldout_texts):,} held out (clean)."
        f" A student's document:\n  {noisy_texts[0][:200]!r}"
    )
    return noisy[: len(noisy_texts)]


def prepare_all(out_dir: Path, tokenizers: Tokenizers, sizes: DemoSizes) -> None:
    """`vocagnolm prepare` into out_dir/data: the students' text aligned to the teacher, the teacher's own text; with
    a second teacher, the same student blocks aligned to it, and its own training data."""
    student, teacher, teacher2 = tokenizers
    window = 2 * sizes.max_seq_length  # teacher tokens per student block at most; the teacher's context covers it
    pairs = {"students": (student, teacher, "students"), "teacher": (teacher, teacher, "teacher")}
    if teacher2 is not None:
        pairs |= {"students-teacher2": (student, teacher2, "students"), "teacher2": (teacher2, teacher2, "teacher")}
    corpus = out_dir / "corpus"
    for name, (ours, theirs, text) in pairs.items():
        train, heldout = corpus / f"{text}.jsonl", corpus / "heldout.jsonl"
        prepare_data(ours, theirs, train, heldout, out_dir / "data" / name, sizes.max_seq_length, window)


def teacher_dir(out_dir: Path, name: str) -> Path:
    """A teacher's final checkpoint: lit_model.pth, model_config.yaml, the tokenizer files."""
    return out_dir / "runs" / name / "final"


def loss_cache(out_dir: Path, name: str) -> Path:
    """A teacher's losses on the students' data, scored once (`vocagnolm score-teacher`)."""
    return out_dir / "data" / f"{name}-loss"


def train_all(
    out_dir: Path, runs: Sequence[tuple[str, int]], tokenizers: Tokenizers, sizes: DemoSizes, top_k: float, workers: int
) -> tuple[tuple[dict[str, Any], dict[str, Any] | None], dict[str, list[dict[str, Any]]], list[float]]:
    """Trains the teachers, then the students' `runs` (method, seed), `workers` at a time; returns what the teachers'
    logs say (the second's None without one), each method's runs' and each training process's start (CPU s)."""
    two_teachers = tokenizers[2] is not None
    results: dict[str, list[dict[str, Any]]] = {}
    context = get_context("spawn")
    started = context.SimpleQueue()
    with ProcessPoolExecutor(workers, context, initializer=start_training_process, initargs=(started,)) as pool:
        # The teacher: larger, on clean text with its own tokenizer; then frozen.
        trained = submit_teacher(pool, out_dir, "teacher", sizes.teacher_vocab_size, tokenizers[1], sizes, 0)
        if two_teachers:  # the same clean text and budget (in its own tokens), its own tokenizer and initialisation
            vocab_size = sizes.second_teacher_vocab_size
            trained2 = submit_teacher(pool, out_dir, "teacher2", vocab_size, tokenizers[2], sizes, 1)
        # Per seed one initialisation, the same noisy text and budget. Students that need no teacher start at once.
        student = partial(submit_student, pool, out_dir, tokenizer=tokenizers[0], sizes=sizes, top_k=top_k)
        futures = {student(m, s): (m, s) for m, s in runs if not method_of(m).needs_teacher}
        teacher = trained.result()
        print(summarize_run("teacher", teacher))
        teacher2 = trained2.result() if two_teachers else None
        if teacher2 is not None:
            print(summarize_run("second teacher", teacher2))
        # uld runs the teacher on every batch and sorts both vocabularies' probabilities for every token (5x the cost
        # of a `ce` step), so it starts first. The others need only the teacher's per-token losses, scored once.
        futures |= {student(m, s): (m, s) for m, s in runs if method_of(m).teacher_logits}
        cached = [(m, s) for m, s in runs if method_of(m).teacher_loss]
        if cached:
            names = list(TEACHERS)[: 1 + two_teachers]
            scored = [
                pool.submit(score_run, out_dir / "data" / TEACHERS[n], teacher_dir(out_dir, n), loss_cache(out_dir, n))
                for n in names
            ]
            for future in scored:
                future.result()
        futures |= {student(m, s): (m, s) for m, s in cached}
        for future in as_completed(futures):
            method, seed = futures[future]
            results.setdefault(method, []).append(future.result())
            print(summarize_run(f"{method} (seed {seed})", results[method][-1]))
    starts = []
    while not started.empty():
        starts.append(started.get())
    return (teacher, teacher2), results, starts


def submit_teacher(
    pool: ProcessPoolExecutor, out_dir: Path, name: str, vocab_size: int, tokenizer: Path, sizes: DemoSizes, seed: int
) -> Future:
    """A teacher's run (`ce`, no teacher) on its own prepared data, out_dir/data/`name`."""
    config = model_config(name, vocab_size, sizes.teacher_layers, sizes.teacher_width, 2 * sizes.max_seq_length)
    data = out_dir / "data" / name
    return pool.submit(train_run, out_dir / "runs" / name, config, data, tokenizer, sizes, sizes.teacher_tokens, seed)


def submit_student(
    pool: ProcessPoolExecutor, out_dir: Path, method: str, seed: int, tokenizer: Path, sizes: DemoSizes, top_k: float
) -> Future:
    """A student's run of `method` on the students' prepared data, guided by the teachers it needs."""
    kind = method_of(method)
    guidance = {**STUDENTS[method], **({"top_k": top_k} if kind.selects else {})}
    teachers = (teacher_dir(out_dir, "teacher"),) if kind.needs_teacher else ()
    caches = (loss_cache(out_dir, "teacher"),) if kind.teacher_loss else ()  # logit distillation runs the teacher
    guided = Guided(guidance, teachers, caches)
    if method in TWO_TEACHERS:  # the second teacher's data beside the first's, a cache for each
        other_data = (out_dir / "data" / TEACHERS["teacher2"],)
        checkpoints = tuple(teacher_dir(out_dir, n) for n in TEACHERS)
        guided = Guided(guidance, checkpoints, tuple(loss_cache(out_dir, n) for n in TEACHERS), other_data)
    config = model_config(
        "student", sizes.student_vocab_size, sizes.student_layers, sizes.student_width, sizes.max_seq_length
    )
    run = out_dir / "runs" / f"{method}-seed{seed}"
    return pool.submit(
        train_run, run, config, out_dir / "data" / "students", tokenizer, sizes, sizes.student_tokens, seed, guided
    )


def count_trained_noise(
    out_dir: Path,
    noisy: list[tuple[str, np.ndarray]],
    tokenizers: Tokenizers,
    results: dict[str, list[dict[str, Any]]],
    sizes: DemoSizes,
    top_k: float,
) -> tuple[float, int]:
    """Adds to each run the share of the tokens it trains that touch noise (`noise_trained`), as its final student
    selects them on a sample of the students' blocks; returns the share of all the sample's targets and their count."""
    names = list(TEACHERS)[: 1 + (tokenizers[2] is not None)]
    teachers = [(tokenizer, teacher_dir(out_dir, name)) for tokenizer, name in zip(tokenizers[1:], names)]
    samples, touched = noise_sample(noisy, tokenizers[0], [t for t, _ in teachers], sizes, 2 * sizes.max_seq_length)
    samples = [score_blocks(d, blocks) for (_, d), blocks in zip(teachers, samples)]  # each teacher's losses
    noise_all = touched[:, 1:].float().mean().item()  # the targets of full blocks
    tables = [byte_table(d, torch.device("cpu")) for d in (tokenizers[0], *(t for t, _ in teachers))]  # per id
    for method, runs in results.items():
        guidance = GuidanceArgs(**{**STUDENTS[method], "top_k": top_k})
        scored = samples if method in TWO_TEACHERS else samples[:1]
        for run in runs:
            run_dir = out_dir / "runs" / f"{method}-seed{run['seed']}" / "final"
            run["noise_trained"] = trained_noise_share(
                run_dir, guidance, scored, touched, sizes, run["seed"], tables[: 1 + len(scored)]
            )
    return noise_all, touched[:, 1:].numel()


def write_results(
    out_dir: Path,
    rows: list[dict[str, Any]],
    results: dict[str, list[dict[str, Any]]],
    teachers: tuple[dict[str, Any], dict[str, Any] | None],
    sampled: int,
    noise: float,
    top_k: float,
) -> tuple[str, str]:
    """Writes results.csv, results.md and bpb.png, and records the demo finished; returns the table and the noise
    summary (over `sampled` training tokens)."""
    write_csv(out_dir / "results.csv", rows)
    table = markdown_table(rows, *teachers)
    summary = noise_summary(rows, sampled)
    (out_dir / "results.md").write_text(f"{table}\n\n{summary}\n", encoding="utf-8")
    plot(out_dir / "bpb.png", results, teachers[0], noise, top_k)
    record_finished(out_dir)
    return table, summary
