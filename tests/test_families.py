"""Every tokenizer family of tests/fixtures/tokenizers, each in a folder named as `litgpt download` names it: documents
get the special tokens LitGPT's own `Tokenizer` gives them, text stays text, and each family prepares, inspects and
trains two steps as the student (against Qwen2.5) and as the teacher (against TinyLlama)."""

import functools
import json
import math
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, TOKENIZERS, make_checkpoint, tiny_config
from hypothesis import example, given, settings
from hypothesis import strategies as st
from litgpt.args import EvalArgs, TrainArgs
from litgpt.config import Config, name_to_config
from litgpt.tokenizer import Tokenizer as LitTokenizer
from test_recipe import metrics
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tokenizers.processors import TemplateProcessing

from litgpt_vocagnolm.alignment.inspection import inspect
from litgpt_vocagnolm.alignment.lexical import align_text, encode
from litgpt_vocagnolm.alignment.tokenizer_files import (
    find_tokenizer_file,
    load_tokenizer,
    tokenizer_info,
)
from litgpt_vocagnolm.data.documents import Segment, Stats
from litgpt_vocagnolm.data.packing import aligned_streams
from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.data.prepared import VocAgnoData, iter_blocks, load_manifest
from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.teacher import TeacherArgs

# Each fixture family under the name of a LitGPT checkpoint that uses its tokenizer.
FAMILIES = {
    "tinyllama-1.1b": "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
    "qwen2.5": "Qwen/Qwen2.5-Math-7B",
    "mistral-7b-v0.1": "mistralai/Mistral-7B-v0.1",
    "llemma-7b": "EleutherAI/llemma_7b",
    "phi-3-mini": "microsoft/Phi-3-mini-4k-instruct",
    "falcon-7b": "tiiuae/falcon-7b",
    "gpt-neox-20b-pii": "EleutherAI/pythia-1b",
    "olmo2-dolma2": "allenai/OLMo-2-1124-7B",
    "mistral-v3-codestral-22b": "mistralai/Mistral-7B-v0.3",
}
# Llama 3's tokenizer_config.json: no add_bos_token, a PreTrainedTokenizerFast; LitGPT adds BOS by the folder's name.
# On OLMo-2's cl100k-like files, whose vocabulary lacks "<|begin_of_text|>": another added token stands in for it.
LLAMA_3_CONFIG = {
    "bos_token": "<|im_start|>",
    "eos_token": "<|endoftext|>",
    "tokenizer_class": "PreTrainedTokenizerFast",
}
LLAMA_3 = {"meta-llama/Meta-Llama-3.1-8B": True, "someone/my-llama3": False}  # name -> LitGPT adds BOS
STUDENT, TEACHER = "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "Qwen/Qwen2.5-Math-7B"
SAMPLES = [
    "Natalia sold clips to 48 of her friends in April.\n\nHow many clips did she sell?",
    "  leading spaces, a tab\tand trailing spaces  ",
    "Ελληνικά ∀ε>0, 日本語の数学, emoji 🧮 and e\u0301",
]


@functools.cache
def tokenizer_of(family: str) -> Tokenizer:
    """The family's tokenizer as the package loads it, once for this module."""
    return load_tokenizer(TOKENIZERS / family)


def control_strings(tokenizer: Tokenizer) -> dict[int, str]:
    """The tokenizer's added tokens that are not whitespace alone, by id: what must stay text."""
    return {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items() if t.content.strip()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A tiny LitGPT checkpoint per family, and the Llama 3 ones, in folders named as `litgpt download` names them."""
    root = tmp_path_factory.mktemp("checkpoints")
    found = {}
    for family, name in FAMILIES.items():
        vocab_size = tokenizer_of(family).get_vocab_size(with_added_tokens=True)
        found[name] = make_checkpoint(root / name, tiny_config(name, vocab_size, n_embd=16), TOKENIZERS / family)
    for name in LLAMA_3:
        found[name] = make_checkpoint(root / name, tiny_config(name, 100278, n_embd=16), TOKENIZERS / "olmo2-dolma2")
        (found[name] / "tokenizer_config.json").write_text(json.dumps(LLAMA_3_CONFIG))
    return found


@pytest.fixture(scope="module")
def litgpt_tokenizer(checkpoints):
    """LitGPT's own `Tokenizer` of a checkpoint, loaded once: `litgpt_tokenizer(name)`."""
    return functools.cache(lambda name: LitTokenizer(checkpoints[name]))


def test_every_fixture_family_is_here():
    assert sorted(FAMILIES) == sorted(p.name for p in TOKENIZERS.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", [*FAMILIES.values(), *LLAMA_3])
def test_documents_get_the_special_tokens_litgpt_gives(checkpoints, litgpt_tokenizer, name):
    """`encode(text, eos=True)` of LitGPT's Tokenizer, for texts without control strings, is BOS (where LitGPT adds
    one), the text's tokens, EOS."""
    directory = checkpoints[name]
    litgpt, info = litgpt_tokenizer(name), tokenizer_info(find_tokenizer_file(directory))
    tokenizer = load_tokenizer(info.path)
    if name in LLAMA_3:
        assert (info.bos_token is not None) == LLAMA_3[name]
    for text in SAMPLES:
        ids = encode(tokenizer, text)[0].tolist()
        assert [info.bos_id] * (info.bos_id is not None) + ids + [info.eos_id] == litgpt.encode(text, eos=True).tolist()
    assert info.bos_token == (None if info.bos_id is None else tokenizer.id_to_token(info.bos_id))
    assert info.eos_token == tokenizer.id_to_token(info.eos_id)


@pytest.mark.parametrize(
    "config, refusal",
    [
        (None, "names no eos_token: put this tokenizer's tokenizer_config.json next to it ("),
        (
            {"add_bos_token": True, "eos_token": "</s>"},
            "LitGPT starts each document with BOS for it (its use_bos), and its tokenizer_config.json names no"
            " bos_token: name it in",
        ),
        ({"eos_token": "<|endoftext|>"}, "eos_token '<|endoftext|>' is not in the vocabulary of"),
    ],
)
def test_a_tokenizer_without_the_specials_litgpt_adds_is_refused(tmp_path, config, refusal):
    """One line naming what is missing and where, before any work: here TinyLlama's files."""
    (tmp_path / "tokenizer.json").write_bytes((TOKENIZERS / "tinyllama-1.1b" / "tokenizer.json").read_bytes())
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidArgument) as refused:
        tokenizer_info(tmp_path / "tokenizer.json")
    assert refusal in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_control_strings_stay_text(family):
    """A text holding every added token of the family, written out, encodes as text: no added id, and decoding gives
    back the text; each control string's characters lie inside tokens that spell it."""
    tokenizer = tokenizer_of(family)
    controls = control_strings(tokenizer)
    strings = list(controls.values())
    assert strings  # every family names some
    text = "Before " + " x ".join(strings) + " after."
    ids, offsets = encode(tokenizer, text)
    assert not controls.keys() & set(ids.tolist())
    assert tokenizer.decode(ids.tolist(), skip_special_tokens=False) == text
    assert (np.diff(offsets[:, 0]) >= 0).all() and offsets[:, 1].max() <= len(text)
    at = 0
    for string in strings:
        start = text.index(string, at)
        at = start + len(string)
        inside = (offsets[:, 1] > start) & (offsets[:, 0] < at)
        assert string in tokenizer.decode(ids[inside].tolist(), skip_special_tokens=False)


def drawn_texts(strings: list[str]) -> st.SearchStrategy[str]:
    """Texts of whitespace runs, control `strings` and Unicode: NFC, as two families normalize, and
    characters every family's vocabulary spells (Falcon's lacks some control bytes and unassigned planes)."""
    characters = st.characters(blacklist_categories=("Cc", "Cs", "Co", "Cn"))
    pieces = st.one_of(
        st.sampled_from([" ", "\t", "\n", "\r\n", "\u00a0", "\u3000"]).flatmap(lambda s: st.just(s * 3) | st.just(s)),
        st.sampled_from(strings),
        st.text(characters, max_size=8),
    )
    return st.lists(pieces, max_size=8).map(lambda p: unicodedata.normalize("NFC", "".join(p)))


@pytest.mark.parametrize("family", FAMILIES)
def test_any_text_stays_text_and_aligns(family):
    """No crash aligning the family as the student against Qwen2.5 and as the teacher of TinyLlama and of Qwen2.5
    (a byte-level student, whose tokens may hold a whole run of whitespace), and text stays text: no added id, and
    decoding gives the text back."""
    tokenizer, qwen, tinyllama = tokenizer_of(family), tokenizer_of("qwen2.5"), tokenizer_of("tinyllama-1.1b")
    controls = control_strings(tokenizer)

    @settings(max_examples=25, deadline=None)
    @example(text="x = 1\n\t\t  \ny")  # Qwen2.5 makes one token of "\t\t  \n"
    @given(text=drawn_texts(list(controls.values())))
    def check(text):
        assert not controls.keys() & set(align_text(tokenizer, qwen, text).student_ids.tolist())
        for student in (tinyllama, qwen):
            assert not controls.keys() & set(align_text(student, tokenizer, text).teacher_ids.tolist())
        # After a letter: SentencePiece's decoders drop a leading space, which the text may hold.
        ids = encode(tokenizer, "x" + text)[0].tolist()
        assert tokenizer.decode(ids, skip_special_tokens=False) == "x" + text

    check()


def internlm2_like(folder: Path) -> Path:
    """TinyLlama's tokenizer as InternLM2's files are: the tokenizer.json lists no added tokens (its
    tokenizer_config.json names "<s>" and "</s>"), and its merges spell "<s>" from text, as a converter that derives
    merges from the whole vocabulary writes them (one two-character piece, "s>", added for that)."""
    spec = json.loads((TOKENIZERS / "tinyllama-1.1b" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["added_tokens"] = []
    spec["model"]["vocab"]["s>"] = len(spec["model"]["vocab"])
    spec["model"]["merges"] = ["s >", "< s>", *spec["model"]["merges"]]
    config = {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>"}
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "InternLM2Tokenizer"}))
    return folder


def test_special_tokens_the_config_names_stay_text(tmp_path):
    """Where the tokenizer.json holds the config's special tokens in its model only (InternLM2's), a literal "<s>" or
    "</s>" in a document stays its characters, while the document's own BOS and EOS are the real ids, as LitGPT's
    Tokenizer frames a text without them."""
    folder = internlm2_like(tmp_path / "internlm2-like")
    text = "Write <s> to start and </s> to end."
    litgpt = LitTokenizer(folder)
    assert 1 in litgpt.encode(text).tolist()[1:]  # the file spells "<s>": LitGPT's BOS mid-text
    tokenizer = load_tokenizer(folder)
    ids = encode(tokenizer, text)[0].tolist()
    assert not {1, 2} & set(ids) and tokenizer.decode(ids, skip_special_tokens=False) == text
    assert {1: "<s>", 2: "</s>"}.items() <= control_strings(tokenizer).items()
    info = tokenizer_info(folder / "tokenizer.json")
    assert (info.bos_id, info.eos_id) == (1, 2) == (litgpt.bos_id, litgpt.eos_id)
    plain = "Natalia sold clips."
    assert [1, *encode(tokenizer, plain)[0].tolist(), 2] == litgpt.encode(plain, eos=True).tolist()
    stream = next(aligned_streams([Segment(text, "", True, True)], info, info, Stats()))
    assert stream.student_ids.tolist() == [1, *ids, 2] and stream.bos.tolist() == [True] + [False] * (len(ids) + 1)


def test_a_special_token_a_model_still_spells_is_refused(tmp_path):
    """A model whose vocabulary, not its merges, spells a special token the config names: one line, at load."""
    tokenizer = Tokenizer(WordLevel({"<s>": 0, "</s>": 1, "a": 2, "<unk>": 3}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    with pytest.raises(InvalidArgument) as refused:
        load_tokenizer(tmp_path)
    assert "WordLevel model spells '</s>'" in str(refused.value) and "\n" not in str(refused.value)


def test_a_template_that_adds_more_than_bos_is_refused_saying_why(tmp_path, capsys):
    """GLM-4's post-processor starts every text with "[gMASK]" "<sop>", which LitGPT's Tokenizer keeps in each
    document: `prepare` refuses it in one line, and `inspect` shows that line as the document's frame."""
    tokenizer = Tokenizer.from_file(str(TOKENIZERS / "tinyllama-1.1b" / "tokenizer.json"))
    tokenizer.add_special_tokens(["[gMASK]", "<sop>"])
    gmask, sop = tokenizer.token_to_id("[gMASK]"), tokenizer.token_to_id("<sop>")
    tokenizer.post_processor = TemplateProcessing(
        single="[gMASK] <sop> $A", special_tokens=[("[gMASK]", gmask), ("<sop>", sop)]
    )
    folder = tmp_path / "glm-like"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "tokenizer_class": "GLMTokenizer"}))
    assert LitTokenizer(folder).encode("x", eos=True).tolist()[:2] == [gmask, sop]
    with pytest.raises(InvalidArgument) as refused:
        tokenizer_info(folder / "tokenizer.json")
    message = str(refused.value)
    assert "frames every text as '[gMASK] <sop> …'" in message and "\n" not in message
    inspect(student=folder, teacher=TOKENIZERS / "qwen2.5", text="x", rows=0)
    assert f"student none: {message}; teacher" in capsys.readouterr().out


def test_a_chatglm3_checkpoint_says_why_it_cannot_be_aligned(tmp_path, capsys):
    """ChatGLM3 ships a SentencePiece tokenizer.model read by its own code, with no fast version: no tokenizer.json
    can be written, which `inspect` says in one line instead of the usual advice to write one. LitGPT has no GLM model
    (docs/pairs.md says so)."""
    assert not [name for name in name_to_config if "glm" in name.lower()]
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x05spm")
    remote = {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": remote, "tokenizer_class": "ChatGLMTokenizer"})
    )
    with pytest.raises(FileNotFoundError) as refused:
        inspect(student=tmp_path, teacher=TOKENIZERS / "qwen2.5")
    message = str(refused.value)
    assert "(tokenization_chatglm.ChatGLMTokenizer" in message and "no tokenizer.json can be written" in message
    assert "save_pretrained" not in message and "\n" not in message


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """A few dozen GSM8K records and Stack Exchange questions (shipped in data/) as `text` records, four more GSM8K
    records for validation, and the training text as one file for `inspect`."""
    folder = tmp_path_factory.mktemp("corpus")

    def records(path: Path, start: int, stop: int, keys: list[str]) -> list[str]:
        lines = path.read_text(encoding="utf-8").splitlines()[start:stop]
        return ["\n\n".join(json.loads(line)[k] for k in keys) for line in lines]

    gsm8k, stackexchange = ROOT / "data/gsm8k/train.jsonl", ROOT / "data/stackexchange/math_stackexchange_33votes.jsonl"
    texts = {
        "gsm8k": records(gsm8k, 0, 24, ["question", "answer"]),
        "stackexchange": records(stackexchange, 0, 12, ["input"]),
        "val": records(gsm8k, 24, 28, ["question", "answer"]),
    }
    files = {}
    for name, documents in texts.items():
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps({"text": t}) + "\n" for t in documents), encoding="utf-8")
    files["text"] = folder / "text.txt"
    files["text"].write_text("\n\n".join(texts["gsm8k"][:4] + texts["stackexchange"][:4]), encoding="utf-8")
    return files


PAIRS = [(name, TEACHER, "student") for name in FAMILIES.values()]
PAIRS += [(STUDENT, name, "teacher") for name in FAMILIES.values() if name != TEACHER]  # TinyLlama-Qwen: above
# The pair whose short documents fell below 99% mapped for their BOS and EOS alone.
PAIRS += [("meta-llama/Meta-Llama-3.1-8B", "EleutherAI/pythia-1b", "pair")]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, checkpoints, corpus):
    """A pair's prepared data, made once when a test first asks for it: `prepared(student, teacher)` -> its folder."""
    root = tmp_path_factory.mktemp("prepared")

    @functools.cache
    def folder(student: str, teacher: str) -> Path:
        output = root / f"{len(list(root.iterdir()))}"
        prepare(
            student=checkpoints[student],
            teacher=checkpoints[teacher],
            input=[corpus["gsm8k"], corpus["stackexchange"]],
            output=output,
            max_seq_length=64,
            num_workers=1,
            val_input=corpus["val"],
        )
        return output

    return folder


def pair_id(pair: tuple[str, str, str]) -> str:
    student, teacher, role = pair
    if role == "pair":
        return f"{student.split('/')[-1]}-{teacher.split('/')[-1]}"
    return f"{(student if role == 'student' else teacher).split('/')[-1]}-as-{role}"


@pytest.mark.slow
@pytest.mark.parametrize("student, teacher, role", PAIRS, ids=map(pair_id, PAIRS))
def test_prepare_frames_documents_as_litgpt(prepared, litgpt_tokenizer, corpus, student, teacher, role):
    """Both sides' BOS/EOS in the manifest are LitGPT's; the student stream is LitGPT's `encode(document, eos=True)`
    of each training document in turn, and the first teacher window begins the teacher's. Every student EOS maps to
    the teacher's EOS, the BOS to nothing, and every prediction target maps, but where a small window lacks room."""
    output = prepared(student, teacher)
    manifest = load_manifest(output)
    documents = [json.loads(line)["text"] for name in ("gsm8k", "stackexchange") for line in open(corpus[name])]
    streams = {}
    for side, name in (("student", student), ("teacher", teacher)):
        litgpt = litgpt_tokenizer(name)
        bos = litgpt.bos_id if litgpt.use_bos else None
        recorded = manifest[side]
        assert (recorded["bos_id"], recorded["eos_id"]) == (bos, litgpt.eos_id)
        assert recorded["bos_token"] == (None if bos is None else litgpt.processor.id_to_token(bos))
        assert recorded["eos_token"] == litgpt.processor.id_to_token(litgpt.eos_id)
        streams[side] = np.concatenate([litgpt.encode(document, eos=True).numpy() for document in documents])
    blocks = list(iter_blocks(output, "train"))
    stored = np.concatenate([block["student_ids"][: block["num_tokens"]] for block in blocks])
    assert stored.tolist() == streams["student"].tolist()
    window = blocks[0]["teacher_ids"]
    assert window.tolist() == streams["teacher"][: len(window)].tolist()
    eos_maps = []  # the teacher tokens each student EOS that is a prediction target maps to
    for block in blocks:
        ids, (starts, ends) = block["student_ids"][: block["num_tokens"]], block["ranges"][: block["num_tokens"]].T
        eos, bos = ids == manifest["student"]["eos_id"], ids == manifest["student"]["bos_id"]
        eos[0] = False  # a block's first token is an input only
        eos_maps += [block["teacher_ids"][a:e].tolist() for a, e in zip(starts[eos], ends[eos])]
        assert (starts[bos] == ends[bos]).all()
    train = manifest["splits"]["train"]
    assert all(teacher_ids == [manifest["teacher"]["eos_id"]] for teacher_ids in eos_maps if teacher_ids)
    assert sum(not teacher_ids for teacher_ids in eos_maps) <= train["overflow_unmapped"]
    # Every prediction target maps but for lack of room in these small windows (blocks of 65 tokens).
    assert all(s["mapped"] + s["overflow_unmapped"] == s["targets"] for s in manifest["splits"].values())
    assert manifest["mapped_share"] >= 0.99


@pytest.mark.slow
@pytest.mark.parametrize("student, teacher, role", PAIRS, ids=map(pair_id, PAIRS))
def test_inspect_shows_the_pair(checkpoints, litgpt_tokenizer, corpus, capsys, student, teacher, role):
    """`inspect` on GSM8K and Stack Exchange text: every prediction target mapped (the text's tokens and the EOS), and
    each side's document frame as LitGPT's Tokenizer gives it."""
    inspect(student=checkpoints[student], teacher=checkpoints[teacher], file=corpus["text"], chunks=[4], rows=0)
    out = capsys.readouterr().out
    frames = []
    for name in (student, teacher):
        litgpt = litgpt_tokenizer(name)
        bos = f"{litgpt.processor.id_to_token(litgpt.bos_id)} ({litgpt.bos_id}) " if litgpt.use_bos else ""
        frames.append(f"{bos}… {litgpt.processor.id_to_token(litgpt.eos_id)} ({litgpt.eos_id})")
    assert f"frames it: student {frames[0]}; teacher {frames[1]}\n" in out
    assert re.search(r"mapped share +100\.00% +100\.00%\n", out), out
    assert "targets: the text's tokens and its EOS, mapped to the teacher's EOS; the BOS is none)" in out


def train_two_steps(out_dir: Path, student: Path, data: list[Path], teachers: list[Path]) -> list[float]:
    """The recipe in this process: two steps of a tiny student guided by tiny online teachers; their losses."""
    setup(
        model_config=Config.from_file(student / "model_config.yaml"),
        out_dir=out_dir,
        precision="32-true",
        data=VocAgnoData(path=data[0], other_teachers=data[1:], num_workers=0),
        tokenizer_dir=student,
        devices=1,
        train=TrainArgs(
            global_batch_size=2,
            micro_batch_size=2,
            max_tokens=2 * 2 * 64,
            max_seq_length=64,
            lr_warmup_steps=1,
            max_norm=1.0,
            save_interval=None,
            log_interval=1,
        ),
        eval=EvalArgs(interval=100, max_iters=1, final_validation=False),
        logger_name="csv",
        teacher=TeacherArgs(checkpoint_dir=teachers),
        guidance=GuidanceArgs(method="vocagnolm", top_k=0.4),
        optimizer={"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-2}},
    )
    return [row["loss"] for row in metrics(out_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("student", [n for n in FAMILIES.values() if n != STUDENT], ids=lambda n: n.split("/")[-1])
def test_recipe_trains_each_family_as_student(prepared, checkpoints, tmp_path, student):
    """Each family's student against Qwen2.5; TinyLlama is the student of the run below."""
    losses = train_two_steps(
        tmp_path / "out", checkpoints[student], [prepared(student, TEACHER)], [checkpoints[TEACHER]]
    )
    assert len(losses) == 2 and all(map(math.isfinite, losses))


@pytest.mark.slow
def test_recipe_trains_with_every_family_as_teacher_at_once(prepared, checkpoints, tmp_path):
    """One run, every family a teacher of TinyLlama (the recipe's several teachers, each on its prepared data)."""
    teachers = list(FAMILIES.values())
    data = [prepared(STUDENT, teacher) for teacher in teachers]
    losses = train_two_steps(tmp_path / "out", checkpoints[STUDENT], data, [checkpoints[t] for t in teachers])
    assert len(losses) == 2 and all(map(math.isfinite, losses))
