"""The demo's settings: its corpus, its sizes (`DemoSizes`, `QUICK`) and the students it compares."""

from dataclasses import dataclass, fields
from pathlib import Path

from litgpt_vocagnolm.errors import InvalidArgument, at_least
from litgpt_vocagnolm.files import shipped
from litgpt_vocagnolm.loss.methods import METHODS, GuidanceMethod

REPOSITORY = Path(__file__).resolve().parents[3]  # in a clone
DATA = shipped("demo/data", "data")  # the shipped corpora: the repository's data/, which a wheel carries
# The paper's hardest pair, TinyLlama's and Qwen2.5's tokenizers, to set the demo's pair beside (tests/fixtures).
PAPER_PAIR = tuple(REPOSITORY / "tests" / "fixtures" / "tokenizers" / name for name in ("tinyllama-1.1b", "qwen2.5"))
# The smallest vocabularies the demo's tokenizers can be trained to (`tokenizer_training`): the student's family holds
# 3 special and 256 byte-fallback tokens and an alphabet of up to STUDENT_ALPHABET characters; the teacher's, 256 bytes,
# 1 special.
STUDENT_ALPHABET = 100
STUDENT_VOCAB_MIN, TEACHER_VOCAB_MIN = 3 + 256 + STUDENT_ALPHABET, 256 + 1
CORPUS = (  # (file, the fields that make one document)
    ("gsm8k/train.jsonl", ("question", "answer")),
    ("stackexchange/math_stackexchange_33votes.jsonl", ("input", "output")),
)


@dataclass
class DemoSizes:
    """How big the miniature is. The defaults take about 5 minutes on 2 idle CPU cores (the demo prints its time).
    Every count is at least 1; heldout_share lies between 0 and 1."""

    documents: int | None = None
    """Documents read from the corpus (None: all 8,461); the budgets take what they need of them."""
    heldout_share: float = 0.01
    """Share of the documents held out (clean) for evaluation, chosen by a hash of their text."""
    student_vocab_size: int = 3000
    """Student vocabulary, 259 special and byte-fallback tokens included: at least 359."""
    teacher_vocab_size: int = 6000
    """Teacher vocabulary, its 256 bytes and 1 special token included: at least 257."""
    second_teacher_vocab_size: int = 4000
    """The second teacher's vocabulary (`vocagnolm-2teachers`), at least 359, of the student's family: its merges
    learnt from half the teacher's text, so that its ids differ from the student's, as Mistral's from TinyLlama's."""
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

    def __post_init__(self) -> None:
        if not 0 < self.heldout_share < 1:
            raise InvalidArgument(f"--sizes.heldout_share must lie between 0 and 1, got {self.heldout_share}.")
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name != "heldout_share" and value is not None:
                at_least(f"--sizes.{field.name}", value, 1)
        for name in ("student_vocab_size", "second_teacher_vocab_size"):
            at_least(f"--sizes.{name}", getattr(self, name), STUDENT_VOCAB_MIN)
        at_least("--sizes.teacher_vocab_size", self.teacher_vocab_size, TEACHER_VOCAB_MIN)


QUICK = DemoSizes(
    documents=400,
    heldout_share=0.1,
    student_vocab_size=600,
    teacher_vocab_size=1000,
    second_teacher_vocab_size=800,
    max_seq_length=32,
    micro_batch_size=4,
    student_layers=1,
    student_width=32,
    teacher_layers=1,
    teacher_width=64,
    teacher_tokens=4096,
    student_tokens=2048,
    evaluations=2,
    eval_batches=4,
    noise_batches=2,
)
"""A few steps of everything: what `--quick` and the tests run."""


# The compared students: name -> `GuidanceArgs` fields (`top_k` comes from `demo(top_k=...)` for the selecting ones).
STUDENTS: dict[str, dict[str, str]] = {
    "ce": {"method": "ce"},
    "random": {"method": "random"},
    "chunk": {"method": "chunk"},
    "uld": {"method": "uld"},
    "vocagnolm": {"method": "vocagnolm"},
    "vocagnolm-mean": {"method": "vocagnolm", "aggregation": "mean"},
    "vocagnolm-exclude": {"method": "vocagnolm", "unmapped": "exclude"},
    "vocagnolm-2teachers": {"method": "vocagnolm", "combine": "min"},
    "vocagnolm-2teachers-byte": {"method": "vocagnolm", "combine": "min", "compare": "byte"},
}
# Guided by both teachers' loss caches, the lower loss of the two per token: compared per teacher token, or per byte.
TWO_TEACHERS = ("vocagnolm-2teachers", "vocagnolm-2teachers-byte")


def method_of(student: str) -> GuidanceMethod:
    """The guidance method a student trains with: its entry in `methods.METHODS`."""
    return METHODS[STUDENTS[student]["method"]]
