"""The demo's text: the shipped math documents, a held-out split, and noise added to the students' half."""

import hashlib
import itertools
import json
import string
from pathlib import Path
from typing import Iterable

import numpy as np

from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer
from litgpt_vocagnolm.demo.settings import CORPUS, DemoSizes
from litgpt_vocagnolm.errors import InvalidArgument

NOISE_CHARACTERS = np.array([ord(c) for c in string.ascii_letters + string.digits], dtype=np.uint32)


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


def demo_texts(data_dir: Path, sizes: DemoSizes) -> tuple[list[str], list[str], list[str]]:
    """The demo's documents: (the teacher's, the students', held out). `sizes.documents` of the corpus, a share
    `sizes.heldout_share` held out (`split_heldout`), the others dealt in turn to the teacher's half (clean text, on
    which the tokenizers are trained) and the students' (to which noise is added)."""
    train_texts, heldout_texts = split_heldout(read_corpus(data_dir, sizes.documents), sizes.heldout_share)
    return train_texts[0::2], train_texts[1::2], heldout_texts


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
    raise InvalidArgument(
        f"The corpus holds {count:,} tokens for this budget of {tokens:,} (plus 5%): lower the budget, or raise"
        " --sizes.documents."
    )


def write_texts(path: Path, texts: list[str]) -> None:
    """One `{"text": ...}` record per line, the input `vocagnolm prepare` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in texts)
