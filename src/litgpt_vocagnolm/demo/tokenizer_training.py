"""The demo's tokenizers, two families trained on the teacher's text: the student's like TinyLlama's, the teacher's
like Qwen2.5's."""

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from litgpt_vocagnolm.alignment.lexical import vocab_overlap
from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer
from litgpt_vocagnolm.demo.settings import PAPER_PAIR, STUDENT_ALPHABET, STUDENT_VOCAB_MIN, DemoSizes
from litgpt_vocagnolm.errors import InvalidArgument

# Qwen2.5's pre-tokenizer: letters, single digits, punctuation runs, whitespace (tests/fixtures/tokenizers/qwen2.5).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizers(
    texts: list[str], sizes: DemoSizes, out_dir: Path, second_teacher: bool
) -> tuple[Path, Path, Path | None]:
    """The demo's tokenizers, trained on the teacher's `texts`: (out_dir/student, out_dir/teacher, out_dir/teacher2
    with `second_teacher`, else None). The second teacher's is of the student's family, its merges learnt from half
    the text: a third vocabulary, other ids."""
    student = train_student_tokenizer(texts, sizes.student_vocab_size, out_dir / "student")
    teacher = train_teacher_tokenizer(texts, sizes.teacher_vocab_size, out_dir / "teacher")
    if not second_teacher:
        return student, teacher, None
    return student, teacher, train_student_tokenizer(texts[1::2], sizes.second_teacher_vocab_size, out_dir / "teacher2")


def train_student_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> Path:
    """A SentencePiece-style BPE like TinyLlama's (Llama 2's): "▁" marks spaces, digits are split, characters outside
    the learned alphabet fall back to `<0x..>` byte tokens. Ids: `<unk>` 0, `<s>` 1, `</s>` 2, bytes 3-258 (Llama's
    layout), then the alphabet, then the merges. Written with a tokenizer_config.json (BOS per document, as Llama's).

    The same texts give the same file, byte for byte, in every process. The alphabet is chosen here
    (`frequent_characters`), not by the trainer's `limit_alphabet` alone: that keeps the most frequent characters but
    breaks ties in frequency in the order of a hash map seeded anew in every process (the quick demo's student then
    changed from run to run: another alphabet, so other merges).
    """
    specials, byte_tokens = ["<unk>", "<s>", "</s>"], [f"<0x{b:02X}>" for b in range(256)]
    if vocab_size < STUDENT_VOCAB_MIN:
        raise InvalidArgument(f"The student vocabulary needs at least {STUDENT_VOCAB_MIN} tokens, not {vocab_size}.")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    # The trainer keeps every character of `initial_alphabet`, and the limit then drops all others.
    alphabet = frequent_characters(tokenizer, texts, STUDENT_ALPHABET)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(byte_tokens),
        special_tokens=specials,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    # The byte tokens go in as plain vocabulary entries (added tokens would match "<0x41>" typed in a text).
    spec = json.loads(tokenizer.to_str())
    learned = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)[len(specials) :]
    spec["model"]["vocab"] = {token: i for i, token in enumerate(specials + byte_tokens + learned)}
    return save_tokenizer(
        out_dir,
        json.dumps(spec, ensure_ascii=False),
        {
            "tokenizer_class": "LlamaTokenizer",
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
        },
    )


def frequent_characters(tokenizer: Tokenizer, texts: list[str], size: int) -> list[str]:
    """The `size` most frequent characters of `texts` as the trainer counts them, in the words of `tokenizer`'s
    pre-tokenizer ("▁" for a space; the student's has no normalizer), ties broken by the character."""
    words = (word for text in texts for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text))
    counts = Counter("".join(words))
    return sorted(counts, key=lambda char: (-counts[char], char))[:size]


def train_teacher_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> Path:
    """A byte-level BPE like Qwen2.5's: its pre-tokenizer regex (single digits, letter runs), NFC, no unknown token.
    Written with a tokenizer_config.json like Qwen's: no BOS, `<|endoftext|>` ends each document. Its alphabet is the
    256 byte characters whatever the text, so nothing is left to the trainer's hash-map order: the same texts give
    the same file in every process."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return save_tokenizer(
        out_dir,
        tokenizer.to_str(),
        {
            "tokenizer_class": "Qwen2Tokenizer",
            "add_bos_token": False,
            "add_prefix_space": False,
            "bos_token": None,
            "eos_token": "<|endoftext|>",
        },
    )


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
    paper = ""
    if all(path.is_dir() for path in PAPER_PAIR):  # a clone: the paper's pair is in tests/fixtures
        paper = f" (TinyLlama vs Qwen2.5: {vocab_overlap(*(load_tokenizer(path) for path in PAPER_PAIR)):.1%})"
    return (
        f"Student: SentencePiece-style BPE, {student.get_vocab_size():,} tokens; teacher: byte-level BPE,"
        f" {teacher.get_vocab_size():,} tokens. Vocabulary overlap {vocab_overlap(student, teacher):.1%} of the"
        f" teacher's{paper}.\n"
        f"  student: {student.encode(sample, add_special_tokens=False).tokens}\n"
        f"  teacher: {teacher.encode(sample, add_special_tokens=False).tokens}"
    )


def describe_second_teacher(student_dir: Path, teacher2_dir: Path) -> str:
    """The second teacher's vocabulary beside the student's: its size, the tokens they share, those with the same id."""
    ours = load_tokenizer(student_dir).get_vocab()
    theirs = load_tokenizer(teacher2_dir).get_vocab()
    return (
        f"Second teacher: SentencePiece-style BPE from half the teacher's text, {len(theirs):,} tokens; it holds"
        f" {len(ours.keys() & theirs.keys()):,} of the student's {len(ours):,},"
        f" {sum(theirs.get(token) == i for token, i in ours.items()):,} with the same id."
    )
