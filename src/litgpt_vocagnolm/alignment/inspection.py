"""`vocagnolm inspect`: how two tokenizers cut the same text, and how Token-level Lexical Alignment joins them.

A report for a tokenizer pair: vocabulary sizes and overlap, tokens per character, how student and teacher tokens
group (1:1, 1:many, many:1, many:many), teacher tokens per student token, unmapped tokens, IoS/IoU of token-level
against chunk alignment (the paper's Figure 3, see docs/figure-3.md), and the alignment of the text drawn side by side,
in the terminal and, on request, as an HTML page; the overlap figures also as a plot and as JSON.

Chunk alignment's overlap is reported two ways, labelled apart. Chunk spans, the paper's measure: the characters of
student chunk c against those of teacher chunk c; both IoS and IoU fall as chunks get finer. Per student token: each
student token against the teacher span it is mapped to, which for chunk alignment is its whole teacher chunk, so its
IoU rises as chunks shrink towards tokens; for token-level alignment this is the only view, and its IoS is 100%.
"""

import html as html_lib
import json as json_lib
from pathlib import Path
from typing import Optional

import numpy as np
from tokenizers import Tokenizer

from litgpt_vocagnolm.alignment.lexical import align, chunk_align, chunk_span_ios_iou, encode, ios_iou
from litgpt_vocagnolm.alignment.tokenizer_files import document_specials, find_tokenizer_file, load_tokenizer
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, at_least, check_output_file

# Written for this project: word problems, LaTeX and the Unicode that math text carries.
SAMPLE = """\
A train covers 120 km in 1½ hours. What is its average speed?
Speed = distance / time = 120 / 1.5 = 80 km/h, so in 3 hours it covers 3 × 80 = 240 km.
If $x^2 - 5x + 6 = 0$, then $(x - 2)(x - 3) = 0$, so $x \\in \\{2, 3\\}$.
$\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}$; for n = 100 that is 5050.
√2 ≈ 1.41421356 and π ≈ 3.14159265358979, while ∫₀¹ x² dx = ⅓.
"""
KINDS = ("1:1", "1:many", "many:1", "many:many")
HTML_GROUPS = 5000  # groups drawn in the HTML page: a 3 MB text has about a million
PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # what --plot writes, by the file's suffix


def mapping_groups(ranges: np.ndarray) -> np.ndarray:
    """Groups of mapped student tokens and the teacher tokens they share characters with.

    Consecutive mapped student tokens fall in one group while their teacher ranges overlap (they share a teacher
    token). Unmapped student tokens belong to no group.

    Arguments:
        ranges: (N, 2) from `align`.

    Returns:
        (G, 4) int64: `[student_start, student_stop, teacher_start, teacher_stop]` per group, in text order.
    """
    mapped = np.flatnonzero(ranges[:, 0] < ranges[:, 1])  # (N',)
    firsts, stops = ranges[mapped, 0], ranges[mapped, 1]
    opens = np.ones(len(mapped), dtype=bool)
    opens[1:] = firsts[1:] >= stops[:-1]  # shares no teacher token with the previous mapped token
    heads = np.flatnonzero(opens)  # (G,) into mapped
    tails = np.flatnonzero(np.roll(opens, -1))  # (G,) the token before the next head; opens[0] closes the last
    return np.stack([mapped[heads], mapped[tails] + 1, firsts[heads], stops[tails]], axis=1)


def group_kinds(groups: np.ndarray) -> np.ndarray:
    """(G,) index into KINDS: 1:1, 1:many, many:1 or many:many student:teacher tokens."""
    many_students = groups[:, 1] - groups[:, 0] > 1
    many_teachers = groups[:, 3] - groups[:, 2] > 1
    return 2 * many_students + many_teachers


def covered_characters(offsets: np.ndarray, length: int) -> np.ndarray:
    """(length,) bool: the characters inside some token's span."""
    starts = np.bincount(offsets[:, 0], minlength=length + 1)
    ends = np.bincount(offsets[:, 1], minlength=length + 1)
    return np.cumsum(starts - ends)[:length] > 0


def _in_ranges(ranges: np.ndarray, size: int) -> np.ndarray:
    """(size,) bool: the indices inside some `[a, b)` row of `ranges`."""
    depth = np.bincount(ranges[:, 0], minlength=size + 1) - np.bincount(ranges[:, 1], minlength=size + 1)
    return np.cumsum(depth)[:size] > 0


def pair_report(student: Tokenizer, teacher: Tokenizer, text: str, chunks: list[int], eos: bool = False) -> dict:
    """The figures `inspect` prints, for `text` encoded without special tokens; `eos`: whether `prepare` ends the
    document with an EOS on both sides, the student's then mapped to the teacher's (if both sides hold a token)."""
    student_ids, student_offsets = encode(student, text)
    teacher_ids, teacher_offsets = encode(teacher, text)
    ranges = align(student_offsets, teacher_offsets)
    groups = mapping_groups(ranges)
    kinds = group_kinds(groups)
    student_vocab = student.get_vocab(with_added_tokens=True)
    teacher_vocab = teacher.get_vocab(with_added_tokens=True)
    nonempty = student_offsets[:, 0] < student_offsets[:, 1]
    spans = ranges[:, 1] - ranges[:, 0]  # teacher tokens per student token
    teacher_unmapped = int((~_in_ranges(ranges, len(teacher_ids))).sum())
    eos_mapped = eos and len(student_ids) > 0 and len(teacher_ids) > 0
    return {
        "text": text,
        "student_vocab": len(student_vocab),
        "teacher_vocab": len(teacher_vocab),
        "shared_vocab": len(student_vocab.keys() & teacher_vocab.keys()),
        "student_ids": student_ids,
        "teacher_ids": teacher_ids,
        "student_offsets": student_offsets,
        "teacher_offsets": teacher_offsets,
        "ranges": ranges,
        "groups": groups,
        "kinds": kinds,
        "group_counts": np.bincount(kinds, minlength=len(KINDS)),
        "group_student_tokens": np.bincount(kinds, weights=groups[:, 1] - groups[:, 0], minlength=len(KINDS)),
        "span_histogram": np.bincount(np.minimum(spans[nonempty], 5), minlength=6),  # 0, 1, 2, 3, 4, 5+
        "student_special": int((~nonempty).sum()),
        "student_unmapped": int((nonempty & (spans == 0)).sum()),
        "teacher_unmapped": teacher_unmapped,
        # The prediction targets of the document `prepare` makes of the text: its tokens and the EOS, the BOS none.
        "targets": (len(student_ids) + eos, len(teacher_ids) + eos),
        "mapped_targets": (int((spans > 0).sum()) + eos_mapped, len(teacher_ids) - teacher_unmapped + eos_mapped),
        "student_covered": int(covered_characters(student_offsets, len(text)).sum()),
        "teacher_covered": int(covered_characters(teacher_offsets, len(text)).sum()),
        "token_level": ios_iou(student_offsets, teacher_offsets, ranges),
        "chunks": {
            c: {
                "chunk_span": chunk_span_ios_iou(student_offsets, teacher_offsets, c),
                "per_token": ios_iou(
                    student_offsets, teacher_offsets, chunk_align(len(student_ids), len(teacher_ids), c)
                ),
            }
            for c in chunks
        },
    }


def alignment_rows(report: dict, limit: int) -> list[tuple[int, int, list[int], list[int], str]]:
    """The first `limit` rows of the alignment in text order: (char start, char stop, student token indices, teacher
    token indices, kind), kind from KINDS or "unmapped".

    One row per group, one per unmapped student token and one per teacher token in no range: every token shows once.
    """
    groups, ranges = report["groups"], report["ranges"]
    student, teacher = report["student_offsets"], report["teacher_offsets"]
    rows = []
    for (s0, s1, t0, t1), kind in zip(groups[:limit].tolist(), report["kinds"][:limit].tolist()):
        start = min(student[s0, 0], teacher[t0, 0])
        stop = max(student[s1 - 1, 1], teacher[t1 - 1, 1])
        rows.append((int(start), int(stop), list(range(s0, s1)), list(range(t0, t1)), KINDS[kind]))
    lone_students = np.flatnonzero(~_in_ranges(groups[:, :2], len(student)) & (ranges[:, 0] == ranges[:, 1]))
    lone_teachers = np.flatnonzero(~_in_ranges(ranges, len(teacher)))
    rows += [(int(student[i, 0]), int(student[i, 1]), [int(i)], [], "unmapped") for i in lone_students[:limit]]
    rows += [(int(teacher[j, 0]), int(teacher[j, 1]), [], [int(j)], "unmapped") for j in lone_teachers[:limit]]
    return sorted(rows, key=lambda row: (row[0], row[1]))[:limit]


def _shown(text: str) -> str:
    """`text` with line breaks, tabs and other control characters escaped, so one row stays one line."""
    return json_lib.dumps(text, ensure_ascii=False)[1:-1]


def document_frame(path: Path, tokenizer: Tokenizer) -> tuple[str, bool]:
    """The special tokens `prepare` puts around each document for this tokenizer, those LitGPT's `Tokenizer` adds:
    "<s> (1) … </s> (2)", or why `prepare` would refuse the tokenizer; and whether it ends documents with an EOS."""
    try:
        bos_id, eos_id = document_specials(find_tokenizer_file(path), tokenizer)
    except InvalidArgument as error:
        return f"none: {error}", False
    bos = "" if bos_id is None else f"{tokenizer.id_to_token(bos_id)} ({bos_id}) "
    return f"{bos}… {tokenizer.id_to_token(eos_id)} ({eos_id})", True


def token_table(report: dict) -> list[str]:
    """The report's lines on the text's tokens, student beside teacher: counts, coverage, unmapped tokens, and the
    mapped share of the prediction targets of the document `prepare` makes of the text."""
    n_student, n_teacher, n_chars = len(report["student_ids"]), len(report["teacher_ids"]), len(report["text"])
    unmapped = report["student_unmapped"] + report["student_special"]
    shares = [mapped / max(targets, 1) for mapped, targets in zip(report["mapped_targets"], report["targets"])]
    eos = " and its EOS, mapped to the teacher's EOS" if report["targets"][0] > n_student else ""
    return [
        f"  {'':<22}{'student':>12}{'teacher':>12}",
        f"  {'tokens':<22}{n_student:>12,}{n_teacher:>12,}",
        f"  {'tokens per character':<22}{n_student / max(n_chars, 1):>12.3f}{n_teacher / max(n_chars, 1):>12.3f}",
        f"  {'characters covered':<22}{report['student_covered'] / max(n_chars, 1):>12.2%}"
        f"{report['teacher_covered'] / max(n_chars, 1):>12.2%}",
        f"  {'unmapped tokens':<22}{unmapped:>12,}{report['teacher_unmapped']:>12,}",
        f"  {'mapped share':<22}{shares[0]:>12.2%}{shares[1]:>12.2%}",
        f"  (mapped share of the prediction targets: the text's tokens{eos}; the BOS is none)",
    ]


def format_report(report: dict, student_name: str, teacher_name: str, source: str, frames: tuple[str, str]) -> str:
    """The summary `inspect` prints; `frames`: each side's `document_frame`."""
    n_chars, shared = len(report["text"]), report["shared_vocab"]
    lines = [
        f"Student: {student_name} ({report['student_vocab']:,} tokens)",
        f"Teacher: {teacher_name} ({report['teacher_vocab']:,} tokens)",
        f"Vocabulary overlap: {shared:,} token strings, {shared / report['teacher_vocab']:.2%} of the teacher's"
        f" vocabulary ({shared / report['student_vocab']:.2%} of the student's)",
        f"Each document, as LitGPT's Tokenizer frames it: student {frames[0]}; teacher {frames[1]}",
        "",
        f"Text: {source}, {n_chars:,} characters",
        *token_table(report),
        "",
        "Groups of student and teacher tokens sharing characters (student:teacher):",
    ]
    n_groups = max(len(report["groups"]), 1)
    for kind, count, tokens in zip(KINDS, report["group_counts"], report["group_student_tokens"]):
        lines.append(f"  {kind:<10}{count:>8,} groups {count / n_groups:>7.1%}, {int(tokens):>8,} student tokens")
    lines.append("Teacher tokens per student token:")
    histogram = report["span_histogram"]
    for label, count in zip(["0 (unmapped)", "1", "2", "3", "4", "5+"], histogram):
        bar = "█" * round(40 * count / max(histogram.max(), 1))
        lines.append(f"  {label:<13}{count:>10,}  {bar}")
    if report["student_special"]:
        lines.append(f"  ({report['student_special']} student tokens have empty spans and are left out: unmapped)")
    lines += [
        "",
        "Alignment quality (the paper's Figure 3; IoS: the share of the student side the teacher side covers):",
        f"  {'':<16}{'chunk spans':^20}{'per student token':^20}",
        f"  {'alignment':<16}{'IoS':>10}{'IoU':>10}{'IoS':>10}{'IoU':>10}",
    ]
    token_ios, token_iou = report["token_level"]
    lines.append(f"  {'token-level':<16}{'—':>10}{'—':>10}{token_ios:>10.2%}{token_iou:>10.2%}")
    for c, figures in report["chunks"].items():
        (span_ios, span_iou), (token_ios, token_iou) = figures["chunk_span"], figures["per_token"]
        lines.append(
            f"  {f'{c} chunk' + ('s' if c > 1 else ''):<16}{span_ios:>10.2%}{span_iou:>10.2%}{token_ios:>10.2%}"
            f"{token_iou:>10.2%}"
        )
    if report["chunks"]:
        lines += [
            "  chunk spans: the characters of student chunk c against those of teacher chunk c, mean over chunks",
            "    (the paper's measure: both fall as chunks get finer).",
            "  per student token: each student token's span against the span of the teacher tokens it maps to, mean",
            "    over student tokens (under chunk alignment, its whole teacher chunk: IoU rises as chunks get finer).",
        ]
    return "\n".join(lines)


def format_rows(report: dict, student: Tokenizer, teacher: Tokenizer, rows: int) -> str:
    """The first `rows` rows of the alignment, side by side: text, student tokens, teacher tokens."""
    width = 30
    lines = [f"Alignment, first {rows} rows (tokens as the tokenizers spell them):"]
    lines.append(f"  {'text':<{width}}  {'student':<{width}}  teacher")
    for start, stop, s, t, _ in alignment_rows(report, rows):
        pieces = [
            json_lib.dumps(report["text"][start:stop], ensure_ascii=False),
            " ".join(_shown(student.id_to_token(int(report["student_ids"][i]))) for i in s) or "—",
            " ".join(_shown(teacher.id_to_token(int(report["teacher_ids"][j]))) for j in t) or "—",
        ]
        lines.append("  " + "  ".join(p[:width].ljust(width) for p in pieces).rstrip())
    return "\n".join(lines)


def format_html(report: dict, student: Tokenizer, teacher: Tokenizer, summary: str) -> str:
    """A page with the summary and every group (up to HTML_GROUPS) as a block: text over student over teacher tokens."""
    colors = {"1:1": "#e6f4ea", "1:many": "#e8f0fe", "many:1": "#fef7e0", "many:many": "#f3e8fd", "unmapped": "#fce8e6"}
    blocks = []
    for start, stop, s, t, kind in alignment_rows(report, HTML_GROUPS):
        student_pieces = [student.id_to_token(int(report["student_ids"][i])) for i in s]
        teacher_pieces = [teacher.id_to_token(int(report["teacher_ids"][j])) for j in t]
        title = f"{kind}, characters [{start}, {stop}), student tokens {s}, teacher tokens {t}"
        blocks.append(
            f'<div class="g" style="background:{colors[kind]}" title="{html_lib.escape(title)}">'
            f'<div class="t">{html_lib.escape(_shown(report["text"][start:stop])) or "&nbsp;"}</div>'
            f'<div class="s">{html_lib.escape(" ".join(map(_shown, student_pieces))) or "—"}</div>'
            f'<div class="s">{html_lib.escape(" ".join(map(_shown, teacher_pieces))) or "—"}</div></div>'
        )
    legend = " ".join(f'<span class="g" style="background:{c}">{k}</span>' for k, c in colors.items())
    more = len(report["groups"]) > HTML_GROUPS
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>vocagnolm inspect</title><style>
body {{ font-family: sans-serif; margin: 1.5em; }}
pre {{ background: #f8f9fa; padding: 1em; }}
.g {{ display: inline-block; margin: 2px; padding: 2px 4px; border-radius: 3px; vertical-align: top; }}
.t {{ font-family: monospace; font-weight: bold; white-space: pre; }}
.s {{ font-family: monospace; font-size: 85%; color: #444; white-space: pre; }}
</style></head><body>
<pre>{html_lib.escape(summary)}</pre>
<p>Each block: the text, then the student's tokens, then the teacher's. {legend}
{f"Only the first {HTML_GROUPS:,} blocks are drawn." if more else ""}</p>
<div>{"".join(blocks)}</div>
</body></html>
"""


def overlap_figures(report: dict) -> dict:
    """The report's overlap numbers as `--json` writes them: fractions, None where nothing was measured."""

    def number(x: float) -> Optional[float]:
        return None if np.isnan(x) else x

    return {
        "ios": number(report["token_level"][0]),
        "iou": number(report["token_level"][1]),
        "chunks": [
            {
                "num_chunks": c,
                "chunk_span_ios": number(figures["chunk_span"][0]),
                "chunk_span_iou": number(figures["chunk_span"][1]),
                "per_token_ios": number(figures["per_token"][0]),
                "per_token_iou": number(figures["per_token"][1]),
            }
            for c, figures in report["chunks"].items()
        ],
    }


def plot_overlap(figures: dict, path: Path, title: str) -> None:
    """Figure 3 as a plot: overlap against the chunk count, chunk spans and per student token, token-level as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chunks = figures["chunks"]
    counts = [entry["num_chunks"] for entry in chunks]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in [
        ("chunk_span_ios", "chunk spans, IoS", "o-C0"),
        ("chunk_span_iou", "chunk spans, IoU", "s-C1"),
        ("per_token_ios", "per student token, IoS", "o:C0"),
        ("per_token_iou", "per student token, IoU", "s:C1"),
    ]:
        values = [100 * entry[key] if entry[key] is not None else np.nan for entry in chunks]
        ax.plot(counts, values, style, label=label, alpha=1.0 if key.startswith("chunk") else 0.5)
    for key, label, color in [("ios", "token-level, IoS", "C0"), ("iou", "token-level, IoU", "C1")]:
        if figures[key] is not None:
            ax.axhline(100 * figures[key], color=color, linestyle="--", linewidth=1, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks per sequence")
    ax.set_ylabel("overlap (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_text_file(file: Path) -> str:
    """The contents of `--file`, or one clear error naming what is wrong with it and what to pass instead."""
    file = Path(file)
    if not file.exists():
        raise PathMissing(f"--file {file} does not exist: pass a UTF-8 text file.")
    if file.is_dir():
        raise InvalidArgument(f"--file {file} is a folder: pass one UTF-8 text file in it.")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise InvalidArgument(
            f"--file {file} is not UTF-8 text (byte {error.start}: {error.reason}): convert it first, e.g."
            f" `iconv -f latin1 -t utf-8 {file}`."
        ) from None


def inspect(
    *,
    student: Path,
    teacher: Path,
    text: Optional[str] = None,
    file: Optional[Path] = None,
    html: Optional[Path] = None,
    plot: Optional[Path] = None,
    json: Optional[Path] = None,
    chunks: list[int] = [1, 4, 16, 64, 256],
    rows: int = 40,
) -> None:
    """Report how a student and a teacher tokenizer cut the same text and how Token-level Lexical Alignment maps them.

    Arguments:
        student: The student's LitGPT checkpoint dir, tokenizer dir, or tokenizer.json (.gz accepted).
        teacher: The teacher's, likewise.
        text: The text to inspect. Without `text` or `file`, a built-in math sample.
        file: A UTF-8 text file to inspect instead.
        html: Also write the report, with the alignment drawn token by token (up to 5,000 groups), to this HTML file.
        plot: Also draw the overlap against the chunk count (the paper's Figure 3) to this image (.png, .pdf, .svg).
            The folder of each output file is created if need be.
        json: Also write the overlap figures, as fractions, to this JSON file (.json): token-level `iou` and `ios`, and
            `chunks`, one entry per chunk count with `num_chunks`, `chunk_span_iou`, `chunk_span_ios`,
            `per_token_iou` and `per_token_ios`.
        chunks: Chunk counts for the chunk-alignment baseline (the paper's Table 2 and Figure 3).
        rows: How many rows of the alignment to print (0: none).
    """
    if text is not None and file is not None:
        raise InvalidArgument("Pass --text or --file, not both.")
    if any(c < 1 for c in chunks):
        raise InvalidArgument(f"Chunk counts must be at least 1, got {chunks}.")
    at_least("--rows", rows, 0)
    for flag, path, suffixes in (
        ("--html", html, (".html", ".htm")),
        ("--json", json, (".json",)),
        ("--plot", plot, PLOT_SUFFIXES),
    ):
        if path is not None:
            check_output_file(path, flag, suffixes)
    if file is not None:
        source, text = str(file), read_text_file(file)
    elif text is not None:
        source = "--text"
    else:
        source, text = "built-in math sample", SAMPLE
    if not text:
        raise InvalidArgument(
            f"{'--file ' + source if file is not None else '--text'} is empty: give some text to inspect."
        )
    # As `prepare` loads them: a process that inspects and prepares a pair loads each tokenizer once.
    student_tokenizer, teacher_tokenizer = (
        load_tokenizer(str(find_tokenizer_file(p).resolve())) for p in (student, teacher)
    )
    (student_frame, student_eos), (teacher_frame, teacher_eos) = (
        document_frame(student, student_tokenizer),
        document_frame(teacher, teacher_tokenizer),
    )
    report = pair_report(student_tokenizer, teacher_tokenizer, text, chunks, eos=student_eos and teacher_eos)
    summary = format_report(report, str(student), str(teacher), source, (student_frame, teacher_frame))
    print(summary)
    if rows:
        print()
        print(format_rows(report, student_tokenizer, teacher_tokenizer, rows))
    if html is not None:
        Path(html).write_text(format_html(report, student_tokenizer, teacher_tokenizer, summary), encoding="utf-8")
        print(f"\nWrote {html}")
    figures = overlap_figures(report)
    if json is not None:
        record = {"student": str(student), "teacher": str(teacher), "text": source, "characters": len(text), **figures}
        Path(json).write_text(json_lib.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"Wrote {json}")
    if plot is not None:
        title = f"{Path(student).name} vs {Path(teacher).name}: {source}, {len(text):,} characters"
        plot_overlap(figures, Path(plot), title)
        print(f"Wrote {plot}")
