"""Tokenizer files: finding and loading them, and what a prepared dataset records of each.

A tokenizer is a Hugging Face fast-tokenizer JSON (plain or gzipped) in a tokenizer or LitGPT checkpoint directory. A
prepared dataset records its sha256 (of the JSON content, so a .gz copy is the same tokenizer), its vocabulary size and
the BOS/EOS that each document gets: those LitGPT's own `Tokenizer` gives it.
"""

import functools
import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from tokenizers import AddedToken, Tokenizer

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

    Text stays text: an added token written out in a document (a literal "</s>" or "<|endoftext|>" in a web page,
    Mistral v3's "[INST]", OLMo-2's "|||EMAIL_ADDRESS|||") is encoded as the characters it is, special or not, so
    that training data can't smuggle control tokens in and every character keeps its offsets. Added tokens made only
    of whitespace (GPT-NeoX's runs of spaces) are text already and stay as the model was trained on them.

    One load per file and process while the file stays as it was (Qwen2.5's takes a third of a second; LitData's
    forked workers inherit what `prepare` loaded); callers share the tokenizer and leave it as it is.
    """
    file = find_tokenizer_file(path)
    stat = file.stat()
    return text_only_tokenizer(file, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def text_only_tokenizer(file: Path, size: int, mtime_ns: int) -> Tokenizer:
    """`load_tokenizer`'s tokenizer of `file`, cached by its path, size and modification time."""
    try:
        tokenizer = Tokenizer.from_str(read_tokenizer_json(file).decode("utf-8"))
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise InvalidArgument(
            f"{str(file)!r} is not a fast-tokenizer JSON file (the tokenizer.json written by Hugging Face tokenizers):"
            f" {error}"
        ) from error
    # `encode_special_tokens` leaves special tokens to the model; marking the others special (same ids) does the rest.
    control = [t for t in tokenizer.get_added_tokens_decoder().values() if not t.special and t.content.strip()]
    tokenizer.add_special_tokens(
        [
            AddedToken(
                t.content,
                single_word=t.single_word,
                lstrip=t.lstrip,
                rstrip=t.rstrip,
                normalized=t.normalized,
                special=True,
            )
            for t in control
        ]
    )
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
    eos_id: int
    """Added after each document."""
    bos_token: Optional[str]
    """The token `bos_id` stands for, or None."""
    eos_token: str
    """The token `eos_id` stands for."""


def tokenizer_sha256(file: Path) -> str:
    """sha256 of the tokenizer's JSON: a gzipped copy of a tokenizer hashes the same as the plain file."""
    return hashlib.sha256(read_tokenizer_json(file)).hexdigest()


def uses_bos(folder: Path) -> bool:
    """Whether LitGPT's `Tokenizer(folder)` starts each text with BOS (its `use_bos`): LitGPT's own rule, which reads
    only the folder's name and tokenizer_config.json (`add_bos_token`; a `LlamaTokenizer`; Llama 3 by name)."""
    from litgpt.tokenizer import Tokenizer as LitTokenizer

    return LitTokenizer.check_if_bos_token_used(None, folder)  # the method reads nothing of the instance


def document_specials(tokenizer_file: Path, tokenizer: Tokenizer) -> tuple[Optional[int], int]:
    """(BOS id or None, EOS id) around each document, as LitGPT's `Tokenizer(checkpoint_dir).encode(text, eos=True)`
    puts them: BOS where its `use_bos` says (`uses_bos`), EOS always, both named by the tokenizer_config.json next to
    the file. A BOS that the tokenizer.json's post-processor adds (TinyLlama's template adds "<s>") is the same token:
    LitGPT keeps it or drops it by `use_bos` too."""
    config_file = tokenizer_file.parent / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}

    def token_id(key: str, why: str) -> int:
        token = config.get(key)
        content = token.get("content") if isinstance(token, dict) else token
        if content is None:
            fix = f"name it in {config_file}"
            if not config_file.is_file():
                fix = f"put this tokenizer's tokenizer_config.json next to it ({config_file} is missing)"
            raise InvalidArgument(f"{tokenizer_file}: {why}, and its tokenizer_config.json names no {key}: {fix}.")
        id_ = tokenizer.token_to_id(content)
        if id_ is None:
            raise InvalidArgument(f"{config_file}: {key} {content!r} is not in the vocabulary of {tokenizer_file}.")
        return id_

    eos_id = token_id("eos_token", "LitGPT ends each document with EOS to keep documents apart")
    bos_id = (
        token_id("bos_token", "LitGPT starts each document with BOS for it (its use_bos)")
        if uses_bos(config_file.parent)
        else None
    )
    return bos_id, eos_id


def tokenizer_info(file: Path) -> TokenizerInfo:
    path = str(file.resolve())
    tokenizer = load_tokenizer(path)
    bos_id, eos_id = document_specials(file, tokenizer)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    bos_token = None if bos_id is None else tokenizer.id_to_token(bos_id)
    return TokenizerInfo(
        path, tokenizer_sha256(file), vocab_size, bos_id, eos_id, bos_token, tokenizer.id_to_token(eos_id)
    )


def same_vocabulary(student: Tokenizer, teacher: Tokenizer) -> bool:
    """Whether every student token has the same id in the teacher's vocabulary (what `rho1` and `kld` need).

    True for identical vocabularies and for a teacher's that extends the student's with equal ids: Llemma's 32,016
    tokens are TinyLlama's 32,000 and 16 Code Llama infill tokens. Added tokens count as tokens.
    """
    teacher_ids = teacher.get_vocab(with_added_tokens=True)
    return all(teacher_ids.get(token) == id_ for token, id_ in student.get_vocab(with_added_tokens=True).items())
