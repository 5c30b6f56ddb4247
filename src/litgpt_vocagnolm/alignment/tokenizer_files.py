"""Tokenizer files: finding and loading them, and what a prepared dataset records of each.

A tokenizer is a Hugging Face fast-tokenizer JSON (plain or gzipped) in a tokenizer or LitGPT checkpoint directory. A
prepared dataset records its sha256 (of the JSON content, so a .gz copy is the same tokenizer), its vocabulary size and
the BOS/EOS that each document gets, as the tokenizer_config.json next to it says.
"""

import functools
import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from tokenizers import Tokenizer

from litgpt_vocagnolm.errors import InvalidArgument, PathMissing

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.json.gz")


def find_tokenizer_file(path: Union[str, Path]) -> Path:
    """The file `load_tokenizer` reads: `path`, or the tokenizer.json[.gz] in a tokenizer or LitGPT checkpoint dir."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise PathMissing(f"Tokenizer path {str(path)!r} does not exist.")
    for name in TOKENIZER_FILES:
        if (path / name).is_file():
            return path / name
    names = sorted(p.name for p in path.iterdir())
    hint = ""
    if "tokenizer.model" in names:
        hint = (
            " There is a SentencePiece `tokenizer.model`, which reports no character offsets: write the fast tokenizer"
            " next to it with `transformers.AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)`."
        )
    raise PathMissing(
        f"No {' or '.join(TOKENIZER_FILES)} in {str(path)!r} (it holds: {', '.join(names) or 'nothing'}).{hint}"
        " Pass a LitGPT checkpoint dir, a tokenizer dir or the tokenizer.json file itself."
    )


def read_tokenizer_json(file: Path) -> bytes:
    """The bytes of a tokenizer.json, decompressed when gzipped: a .gz copy is the same tokenizer as the plain file."""
    data = Path(file).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def load_tokenizer(path: Union[str, Path]) -> Tokenizer:
    """A Hugging Face fast tokenizer from a tokenizer.json (gzipped or not), tokenizer dir or LitGPT checkpoint dir.

    Special tokens written out in the text (a literal "</s>" or "<|endoftext|>" in a web page) are encoded as the
    text they are: training data must not smuggle control tokens in, and every character must keep its offsets.
    """
    file = find_tokenizer_file(path)
    try:
        tokenizer = Tokenizer.from_str(read_tokenizer_json(file).decode("utf-8"))
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise InvalidArgument(
            f"{str(file)!r} is not a fast-tokenizer JSON file (the tokenizer.json written by Hugging Face tokenizers):"
            f" {error}"
        ) from error
    tokenizer.encode_special_tokens = True
    return tokenizer


@dataclass(frozen=True)
class TokenizerInfo:
    """What a prepared dataset records of one tokenizer."""

    path: str
    """The file `find_tokenizer_file` returns."""
    sha256: str
    vocab_size: int
    bos_id: Optional[int]
    """Added before each document, or None."""
    eos_id: Optional[int]
    """Added after each document, or None."""


def tokenizer_sha256(file: Path) -> str:
    """sha256 of the tokenizer's JSON: a gzipped copy of a tokenizer hashes the same as the plain file."""
    return hashlib.sha256(read_tokenizer_json(file)).hexdigest()


def document_specials(tokenizer_file: Path, tokenizer: Tokenizer) -> tuple[Optional[int], Optional[int]]:
    """(BOS id or None, EOS id or None) that each document gets, as tokenizer_config.json next to the file says."""
    config_file = tokenizer_file.parent / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}

    def token_id(key: str) -> Optional[int]:
        token = config.get(key)
        content = token.get("content") if isinstance(token, dict) else token
        if content is None:
            return None
        id_ = tokenizer.token_to_id(content)
        if id_ is None:
            raise InvalidArgument(f"{config_file}: {key} {content!r} is not in the vocabulary of {tokenizer_file}.")
        return id_

    bos_id, eos_id = token_id("bos_token"), token_id("eos_token")
    # Hugging Face's LlamaTokenizer adds BOS unless its config says otherwise; LitGPT's Tokenizer reads it the same way.
    add_bos = config.get("add_bos_token", config.get("tokenizer_class") == "LlamaTokenizer")
    add_eos = bool(config.get("add_eos_token"))
    if not add_bos and not add_eos:
        # Adds nothing (Qwen2.5): end each document with EOS, the separator such models saw in pretraining.
        add_eos, add_bos = eos_id is not None, eos_id is None and bos_id is not None
    wanted = ((add_bos, bos_id, "bos_token"), (add_eos, eos_id, "eos_token"))
    missing = [key for add, id_, key in wanted if add and id_ is None]
    if missing or not (add_bos or add_eos):
        raise InvalidArgument(
            f"{tokenizer_file}: documents need a {' and '.join(missing) or 'bos_token or eos_token'} to keep them"
            f" apart, and {config_file} names none{'' if config_file.is_file() else ' (the file is missing)'}."
            " Put the tokenizer_config.json of this tokenizer next to it."
        )
    return (bos_id if add_bos else None), (eos_id if add_eos else None)


@functools.lru_cache(maxsize=4)
def cached_tokenizer(path: str) -> Tokenizer:
    """One load per process: LitData's forked workers inherit what `prepare` loaded."""
    return load_tokenizer(path)


def tokenizer_info(file: Path) -> TokenizerInfo:
    path = str(file.resolve())
    tokenizer = cached_tokenizer(path)
    bos_id, eos_id = document_specials(file, tokenizer)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    return TokenizerInfo(path, tokenizer_sha256(file), vocab_size, bos_id, eos_id)


def same_vocabulary(student: Tokenizer, teacher: Tokenizer) -> bool:
    """Whether every student token has the same id in the teacher's vocabulary (what `rho1` and `kld` need).

    True for identical vocabularies and for a teacher's that extends the student's with equal ids: Llemma's 32,016
    tokens are TinyLlama's 32,000 and 16 Code Llama infill tokens. Added tokens count as tokens.
    """
    teacher_ids = teacher.get_vocab(with_added_tokens=True)
    return all(teacher_ids.get(token) == id_ for token, id_ in student.get_vocab(with_added_tokens=True).items())
