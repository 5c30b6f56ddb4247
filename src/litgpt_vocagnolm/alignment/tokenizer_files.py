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
from typing import Any, Optional, Union

from tokenizers import AddedToken, Tokenizer

from litgpt_vocagnolm.errors import InvalidArgument, PathMissing

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.json.gz")
# transformers' special-token attributes of a tokenizer_config.json
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


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
    found = f"No {' or '.join(TOKENIZER_FILES)} in {str(path)!r} (it holds: {', '.join(names) or 'nothing'})."
    fix = " Pass a LitGPT checkpoint dir, a tokenizer dir or the tokenizer.json file itself."
    if "tokenizer.model" in names:
        # ChatGLM3's auto_map: `["tokenization_chatglm.ChatGLMTokenizer", null]`, code of its own and no fast class.
        remote = (read_config(path).get("auto_map") or {}).get("AutoTokenizer")
        if isinstance(remote, list) and remote and not remote[-1]:
            raise PathMissing(
                f"{found} Its SentencePiece `tokenizer.model` reports no character offsets and is read by the model's"
                f" own code ({remote[0]}, tokenizer_config.json's auto_map), which has no fast version: no"
                " tokenizer.json can be written for it, so this model's tokenizer can't be aligned."
            )
        fix = (
            " There is a SentencePiece `tokenizer.model`, which reports no character offsets: write the fast tokenizer"
            " next to it with `transformers.AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)`." + fix
        )
    raise PathMissing(found + fix)


def read_tokenizer_json(file: Path) -> bytes:
    """The bytes of a tokenizer.json, decompressed when gzipped: a .gz copy is the same tokenizer as the plain file."""
    data = Path(file).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def load_tokenizer(path: Union[str, Path]) -> Tokenizer:
    """A Hugging Face fast tokenizer from a tokenizer.json (gzipped or not), tokenizer dir or LitGPT checkpoint dir.

    Text stays text: a control string written out in a document (a literal "</s>" or "<|endoftext|>" in a web page,
    Mistral v3's "[INST]", OLMo-2's "|||EMAIL_ADDRESS|||") is encoded as the characters it is, so that training data
    can't smuggle control tokens in and every character keeps its offsets. Control strings are the tokenizer.json's
    added tokens, special or not, and the special tokens its tokenizer_config.json names (`config_specials`), which
    InternLM2's tokenizer.json holds only in its model's vocabulary. Added tokens made only of whitespace (GPT-NeoX's
    runs of spaces) are text already and stay as the model was trained on them.

    One load per file and process while the files stay as they were (Qwen2.5's takes a third of a second; LitData's
    forked workers inherit what `prepare` loaded); callers share the tokenizer and leave it as it is.
    """
    file = find_tokenizer_file(path)
    return text_only_tokenizer(file, file_stamp(file), file_stamp(file.parent / "tokenizer_config.json"))


def file_stamp(file: Path) -> Optional[tuple[int, int]]:
    """(size, modification time) of `file`, or None where there is none: what `text_only_tokenizer` is cached by."""
    if not file.is_file():
        return None
    stat = file.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=16)
def text_only_tokenizer(
    file: Path, stamp: Optional[tuple[int, int]], config_stamp: Optional[tuple[int, int]]
) -> Tokenizer:
    """`load_tokenizer`'s tokenizer of `file`, cached by its stamp and that of the tokenizer_config.json beside it."""
    data = read_tokenizer_json(file).decode("utf-8")
    tokenizer = parse_tokenizer(file, data)
    added = tokenizer.get_added_tokens_decoder().values()
    # Special tokens the config names that the tokenizer.json holds in its model's vocabulary only (InternLM2's "<s>"):
    # the model's merges may spell them from text, so those merges go (SentencePiece never spells its control pieces).
    in_model = sorted(
        token
        for token in config_specials(read_config(file.parent)) - {t.content for t in added}
        if tokenizer.token_to_id(token) is not None
    )
    if in_model:
        tokenizer = parse_tokenizer(file, without_merges_into(data, in_model))
    # `encode_special_tokens` leaves special tokens to the model; marking the others special (same ids) does the rest.
    control = [
        AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip, normalized=t.normalized)
        for t in added
        if not t.special and t.content.strip()
    ]
    control += [AddedToken(token, normalized=False) for token in in_model]
    tokenizer.add_special_tokens(control)  # which marks each one special
    tokenizer.encode_special_tokens = True
    for token in in_model:
        if tokenizer.token_to_id(token) in tokenizer.encode(token, add_special_tokens=False).ids:
            raise InvalidArgument(
                f"{file}: its {type(tokenizer.model).__name__} model spells {token!r}, a special token its"
                " tokenizer_config.json names, from that text: a document could hold the control token. Give a"
                " tokenizer.json that lists it among its added_tokens."
            )
    return tokenizer


def parse_tokenizer(file: Path, data: str) -> Tokenizer:
    """A tokenizer from the JSON `data` read from `file`, or one line saying why not."""
    try:
        return Tokenizer.from_str(data)
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise InvalidArgument(
            f"{str(file)!r} is not a fast-tokenizer JSON file (the tokenizer.json written by Hugging Face tokenizers):"
            f" {error}"
        ) from error


def read_config(folder: Path) -> dict:
    """The tokenizer_config.json in `folder` ({} if there is none), or one line saying why it can't be read."""
    config_file = Path(folder) / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidArgument(f"{config_file} is not a JSON file: {error}.") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"{config_file} holds no JSON object: give the tokenizer_config.json of the tokenizer.")
    return config


def config_specials(config: dict) -> set[str]:
    """The strings a tokenizer_config.json names as special tokens, but those of only whitespace: transformers' special
    tokens (bos, eos, unk, sep, pad, cls, mask), its `additional_special_tokens` and the tokens of its
    `added_tokens_decoder`, each a string or an AddedToken dict with its `content`."""
    named = [config.get(key) for key in SPECIAL_KEYS]
    named += config.get("additional_special_tokens") or []
    named += list((config.get("added_tokens_decoder") or {}).values())
    contents = map(token_content, named)
    return {content for content in contents if isinstance(content, str) and content.strip()}


def token_content(token: Any) -> Any:
    """A tokenizer_config.json's token: the string itself, or an AddedToken dict's `content`."""
    return token.get("content") if isinstance(token, dict) else token


def without_merges_into(data: str, tokens: list[str]) -> str:
    """The tokenizer.json `data` without the BPE merges that make one of `tokens`, so that no text spells them."""
    spec = json.loads(data)
    merges = spec["model"].get("merges") or []
    # A merge is "a b" (older files) or ["a", "b"].
    made = ["".join(merge) if isinstance(merge, list) else merge.replace(" ", "", 1) for merge in merges]
    spec["model"]["merges"] = [merge for merge, token in zip(merges, made) if token not in tokens]
    return json.dumps(spec, ensure_ascii=False)


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
    LitGPT keeps it or drops it by `use_bos` too. A post-processor that adds other tokens (GLM-4's "[gMASK]<sop>") is
    refused, saying why: LitGPT keeps them in each document, and documents here get the BOS and EOS only."""
    config_file = tokenizer_file.parent / "tokenizer_config.json"
    config = read_config(tokenizer_file.parent)

    named = {key: token_content(config.get(key)) for key in ("bos_token", "eos_token")}

    def token_id(key: str, why: str) -> int:
        if named[key] is None:
            fix = f"name it in {config_file}"
            if not config_file.is_file():
                fix = f"put this tokenizer's tokenizer_config.json next to it ({config_file} is missing)"
            raise InvalidArgument(f"{tokenizer_file}: {why}, and its tokenizer_config.json names no {key}: {fix}.")
        id_ = tokenizer.token_to_id(named[key])
        if id_ is None:
            raise InvalidArgument(f"{config_file}: {key} {named[key]!r} is not in the vocabulary of {tokenizer_file}.")
        return id_

    eos_id = token_id("eos_token", "LitGPT ends each document with EOS to keep documents apart")
    bos_id = (
        token_id("bos_token", "LitGPT starts each document with BOS for it (its use_bos)")
        if uses_bos(config_file.parent)
        else None
    )
    head, tail = template_tokens(tokenizer)
    # LitGPT adds or drops a BOS at the start and an EOS at the end of what the template gives; the rest it keeps.
    if named["bos_token"] is not None and head[:1] == [tokenizer.token_to_id(named["bos_token"])]:
        head = head[1:]
    if tail[-1:] == [eos_id]:
        tail = tail[:-1]
    if head or tail:
        around = " ".join(tokenizer.id_to_token(i) for i in head) + " … " + " ".join(map(tokenizer.id_to_token, tail))
        raise InvalidArgument(
            f"{tokenizer_file}: its post-processor frames every text as {around.strip()!r}, which LitGPT's Tokenizer"
            " keeps in each document; litgpt-vocagnolm puts only a BOS and an EOS around a document, so it refuses"
            " this tokenizer rather than frame documents otherwise than LitGPT."
        )
    return bos_id, eos_id


def template_tokens(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer.json's post-processor puts before and after a text (TinyLlama's: [1] and [])."""
    encoding = tokenizer.encode("x")
    ids, added = encoding.ids, encoding.special_tokens_mask  # 1 where the post-processor added the token
    start = added.index(0) if 0 in added else len(ids)  # a text of no token: every added one before it
    stop = len(ids) - added[::-1].index(0) if 0 in added else len(ids)
    return ids[:start], ids[stop:]


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
