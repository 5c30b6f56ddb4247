"""Extraction and grading against the math evaluation harness's own verdicts.

How the table was made: each (completion, reference) pair was graded by the harness's code at commit dcfa46a
(github.com/ZubinGou/math-evaluation-harness), imported as is in a virtual environment with its pins (sympy 1.12,
antlr4-python3-runtime 4.11.1, latex2sympy from github.com/ZubinGou/latex2sympy, word2number): the prediction is its
`parser.run_execute(executor, completion.strip(), "cot", data_name)` (what its `evaluate.py` does with a `cot`
generation) and the verdict its `grader.math_equal(prediction, reference)` under a 3 s limit, the reference being
already normalized as its `parse_ground_truth` leaves it. The completions are model-like: the shots' closing lines
("The answer is", the Minerva "Final Answer: ... I hope it is correct.", `\\boxed{}`, choice letters), and the
answers the harness grades through each path of `math_equal`: strings, numbers with tolerance and percentages,
element-wise tuples and intervals, equations, sympy's LaTeX parser, sympy's `parse_expr` (quoted and Python-syntax
answers), latex2sympy (matrices, also rounded to 3 places), sets, an empty generation (`None`).
"""

import json
import re

import pytest
from sympy import N
from sympy.parsing.sympy_parser import parse_expr

from litgpt_vocagnolm.evaluation import grading
from litgpt_vocagnolm.evaluation.grading import is_correct, math_equal
from litgpt_vocagnolm.evaluation.math_tasks import TASKS, extract_answer, load_examples


def minerva(answer: str) -> str:
    """The closing line of the Minerva prompt's shots."""
    return f"Final Answer: The final answer is ${answer}$. I hope it is correct."


V13 = r"\begin{pmatrix}-1/3\\2/3\\5/3\end{pmatrix}"  # MATH-500 problem 99's reference, normalized

# (data set, completion, normalized reference, the harness's verdict)
HARNESS_TABLE = [
    # GSM8K
    ("gsm8k", "Janet sells 16 - 3 - 4 = 9 eggs. She makes 9 * 2 = 18 dollars. The answer is 18.", "18", True),
    ("gsm8k", "She spent 1,000 + 234 = 1,234 dollars. The answer is $1,234.", "1234", True),
    ("gsm8k", 'He has 3 * 7 = 21 marbles. The answer is "21".', "21", True),  # parse_expr: a quoted answer
    ("gsm8k", "The answer is 'twenty one'.", "21", False),  # quotes keep the words from word2number
    ("gsm8k", "He buys 5 + 7 = 12 apples", "12", True),  # no "The answer is": the last number
    ("gsm8k", "The answer is 50%.", "50", True),
    ("gsm8k", "The answer is 18.0001.", "18", True),  # within 1e-4 relative
    ("gsm8k", "The answer is 17.", "18", False),
    ("gsm8k", "", "18", False),  # an empty generation: None
    ("gsm8k", "error", "18", False),
    ("gsm8k", "The answer is 3 * 6.", "18", True),  # sympy's LaTeX parser evaluates it
    ("gsm8k", "The answer is 2^5.", "32", True),
    ("gsm8k", "The answer is 2**5.", "32", False),  # sympy's LaTeX parser reads 2 and stops; parse_expr never runs
    ("gsm8k", "The answer is 0.3.", r"\frac{3}{10}", True),
    ("gsm8k", "The answer is abs(-7).", "7", False),  # strip_string drops "abs" (the unit "ab", plural): "(-7)"
    ("gsm8k", "The answer is (7).real.", "7", True),
    # MATH-500 with the Minerva prompt (minerva_math)
    ("minerva_math", minerva(r"\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}"), V13, True),  # latex2sympy
    ("minerva_math", minerva(r"\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}"), V13, True),  # latex2sympy
    ("minerva_math", minerva(r"\begin{pmatrix} -0.333 \\ 0.667 \\ 1.667 \end{pmatrix}"), V13, True),  # to 3 places
    ("minerva_math", minerva(r"\begin{pmatrix} -0.33 \\ 0.67 \\ 1.67 \end{pmatrix}"), V13, False),
    ("minerva_math", minerva(r"\begin{pmatrix} -1/3 \\ 2/3 \\ 4/3 \end{pmatrix}"), V13, False),
    (
        "minerva_math",
        minerva(r"\begin{pmatrix} 1/5 \\ -18/5 \end{pmatrix}"),
        r"\begin{pmatrix}1/5\\-18/5\end{pmatrix}",
        True,
    ),
    (
        "minerva_math",
        minerva(r"\begin{pmatrix} 0.2 \\ -3.6 \end{pmatrix}"),
        r"\begin{pmatrix}1/5\\-18/5\end{pmatrix}",
        True,
    ),
    (
        "minerva_math",
        minerva(r"\begin{pmatrix} -1 & 0 \\ 0 & -1 \end{pmatrix}"),
        r"\begin{pmatrix}-1&0\\0&-1\end{pmatrix}",
        True,
    ),
    (
        "minerva_math",
        minerva(r"\left[ \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]"),
        r"[\frac{\pi^2}{8},\frac{5\pi^2}{4}]",
        True,
    ),
    ("minerva_math", minerva("[(pi**2)/8, 5*pi**2/4]"), r"[\frac{\pi^2}{8},\frac{5\pi^2}{4}]", False),  # LaTeX: 5*i*p
    ("minerva_math", minerva("(pi**2)/(6)"), r"\frac{\pi^2}{6}", True),  # parse_expr: Python syntax
    ("minerva_math", minerva("[5,5*sqrt(2)]"), r"[5,5\sqrt{2}]", True),  # parse_expr: a Python list
    ("minerva_math", minerva(r"\{3,1,2\}"), "{1,2,3}", True),  # parse_expr: Python sets, in another order
    ("minerva_math", minerva(r"\{3,1,2\}"), "1,2,3", False),
    ("minerva_math", minerva("3, 1, 2"), "1,2,3", False),
    ("minerva_math", minerva(r"\{-2, 1+\sqrt{5}, 1-\sqrt{5}\}"), r"{1\\sqrt{5},-2}", False),  # 422: "\pm" dropped
    ("minerva_math", minerva(r"(-\sqrt{3}, \sqrt{3})"), r"(-\sqrt{3},\sqrt{3})", True),
    ("minerva_math", minerva("(-1.732, 1.732)"), r"(-\sqrt{3},\sqrt{3})", True),  # element-wise
    ("minerva_math", minerva("(0.6,2.6667]"), r"(\frac{3}{5},\frac{8}{3}]", True),  # an interval, element-wise
    ("minerva_math", minerva(r"(-\infty, 2) \cup (3, \infty)"), r"(-\infty,2)\cup(3,\infty)", True),
    ("minerva_math", minerva(r"\left( 3, \frac{\pi}{2} \right)"), r"(3,\frac{\pi}{2})", True),
    ("minerva_math", minerva(r"\text{east}"), "", True),  # 97: "\text{east}" normalizes to ""
    ("minerva_math", minerva(r"\text{west}"), "", True),  # ... and so does any unit word
    ("minerva_math", "", "", False),  # but an empty generation is None, never ""
    ("minerva_math", minerva("864"), "864^2", False),  # 257: "864 \mbox{ inches}^2" normalizes to "864^2"
    ("minerva_math", minerva(r"864 \mbox{ inches}^2"), "864^2", True),
    ("minerva_math", minerva("y = 2x + 1"), "2x-y=-1", False),  # strip_string drops "y="
    ("minerva_math", minerva("-34x-45y+20z-100=0"), "34x+45y-20z+100=0", True),  # equations up to sign
    ("minerva_math", minerva("x = 5"), "5", True),
    ("minerva_math", minerva(r"\frac{1}{3}"), r"\frac{1}{2}", False),
    ("minerva_math", minerva(r"\dfrac{\sqrt{3}}{2}"), r"\frac{\sqrt{3}}{2}", True),
    ("minerva_math", minerva(r"\frac{x+2}{7}"), r"\frac{x}{7}+\frac{2}{7}", True),  # simplify
    ("minerva_math", minerva(r"\sec^2 y"), r"\tan^2y+1", False),  # "sec" is a unit to strip_string
    ("minerva_math", minerva("33.3"), r"\frac{100}{3}", False),
    ("minerva_math", minerva("33.33333"), r"\frac{100}{3}", True),  # numerically, within 1e-4
    ("minerva_math", minerva(r"\frac{100}{3}"), "33.3", False),
    # The full MATH test set with its own prompt (math)
    ("math", r"So $x = \boxed{\dfrac{1}{2}}$.", r"\frac{1}{2}", True),
    ("math", r"So $x = \boxed{0.5}$.", r"\frac{1}{2}", True),
    ("math", r"The area is $\boxed{10\sqrt{2}}$ square units.", r"10\sqrt2", True),
    ("math", r"The answer is $\boxed{x \in [-2,7]}$.", r"x\in[-2,7]", False),  # normalized twice, "x\in" goes
    (
        "math",
        r"The answer is \boxed{\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}}.",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        True,
    ),
    ("math", r"The answer is \boxed{Matrix([[1, 2], [3, 4]])}.", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", False),
    (
        "math",
        r"\boxed{\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}}",
        r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{15+2\sqrt{33}}",
        True,
    ),
    ("math", r"The answer is \boxed{\frac{1+\sqrt{5}}{2}}.", "2", False),
    ("math", r"The answer is \boxed{}.", "2", False),
    ("math", "Let's think step by step. I could not finish", "2", False),
    # SVAMP
    ("svamp", "He had 5 + 4 = 9 marbles. The answer is 9.", "9", True),
    ("svamp", "The answer is 2.5.", "2.5", True),
    ("svamp", 'The answer is "2.5".', "2.5", True),  # parse_expr: a quoted number
    ("svamp", "The answer is 5/2.", "2.5", True),
    ("svamp", "The answer is 25.", "2.5", False),  # a percentage of the reference: 250 or 0.025 would do
    # ASDiv
    ("asdiv", "There are 7 + 2 = 9 apples. The answer is 9 apples.", "9", True),
    ("asdiv", "The answer is 6:01 p.m.", "6:01:00p", False),
    ("asdiv", "The answer is 6:01:00 p.m.", "6:01:00p", True),
    ("asdiv", "The answer is 3:30 p.m.", "3:30p", True),
    ("asdiv", "The answer is 1/3.", r"\frac{1}{3}", True),
    # MAWPS
    ("mawps", "The answer is 17.", "17", True),
    ("mawps", "The answer is 1/4.", "0.25", True),
    ("mawps", "The answer is 25%.", "0.25", True),
    ("mawps", "", "0", False),
    # TabMWP
    ("tabmwp", "The mean is (76 + 94) / 2 = 85. The answer is 85.", "85", True),
    ("tabmwp", "The answer is $4.50.", "4.5", True),
    ("tabmwp", "The answer is yes.", "yes", True),
    ("tabmwp", "The answer is tuesday.", "Tuesday", True),
    ("tabmwp", "The answer is 3/4.", "0.75", True),
    ("tabmwp", "The answer is 75%.", "0.75", True),
    # MathQA, MMLU-STEM, SAT: multiple choice
    ("mathqa", "x = 8 ^ ( 1 / 3 ) * 6 = 12. The answer is (A).", "A", True),
    ("mathqa", "The answer is d", "C", False),
    ("mathqa", "So the choice is c.", "C", True),
    ("mathqa", "I cannot decide.", "A", False),
    ("mathqa", "No idea.\n\nProblem:\nThe answer is (A)", "A", False),  # a new problem is not this one's answer
    ("mathqa", "", "A", False),
    ("mmlu_stem", "The answer is (B).", "B", True),
    ("mmlu_stem", minerva("(A)"), "A", False),  # "$(A)$": the "$" hides the letter from "answer is (a"
    ("mmlu_stem", "The answer is B, not C.", "C", False),
    ("sat_math", "The answer is (D).", "D", True),
    ("sat_math", "The answer is (C).", "D", False),
]


def test_table_covers_every_data_set():
    assert {task for task, *_ in HARNESS_TABLE} == set(TASKS)


@pytest.mark.parametrize("task, completion, reference, verdict", HARNESS_TABLE)
def test_verdicts_are_the_harness_verdicts(task, completion, reference, verdict):
    assert is_correct(extract_answer(completion.strip(), TASKS[task]), reference) is verdict


@pytest.mark.parametrize(
    "completion, task, prediction",
    [
        # The harness's run_execute output for these (see the module docstring).
        ("", "gsm8k", None),
        ("error", "math", None),
        ("I cannot decide.", "sat_math", "placeholder"),
        ('The answer is "21".', "gsm8k", '"21"'),
        (minerva(r"\\frac{1}{2}"), "minerva_math", r"\\frac{1}{2}"),
    ],
)
def test_extracted_answers_are_the_harness_predictions(completion, task, prediction):
    assert extract_answer(completion, TASKS[task]) == prediction


def test_python_answers_never_run_code(tmp_path, monkeypatch):
    # Each would write the file "ran" where the harness grades it (parse_expr, then N of a quoted answer's text).
    monkeypatch.chdir(tmp_path)
    payloads = ["open(sstr(ran),chr(119))", '"open(sstr(ran),chr(119))"', "(0).__class__ or open(sstr(ran),chr(119))"]
    for payload in payloads:
        assert math_equal(payload, "7") is False
        assert not (tmp_path / "ran").exists()
    parse_expr(payloads[0])  # the payloads are live
    assert (tmp_path / "ran").exists()
    (tmp_path / "ran").unlink()
    with pytest.raises(Exception):
        N(parse_expr(payloads[1]))
    assert (tmp_path / "ran").exists()


def test_python_answers_the_harness_grades_are_evaluated():
    # Verdicts of the harness's math_equal, as the table's.
    assert math_equal('"3/10"', "0.3") and math_equal("(pi**2)/(6)", r"\frac{\pi^2}{6}")
    assert math_equal('"max(2,7)"', "7")  # a numeric builtin, reached through N() of the quoted text
    assert not math_equal("max(2,7)", "7")  # sympy's LaTeX parser takes it first: m*a*x(2, 7)
    assert not math_equal("[5,5*sqrt(3)]", r"[5,5\sqrt{2}]")


def test_is_correct_gives_up_after_the_time_limit(monkeypatch):
    monkeypatch.setattr(grading, "math_equal", lambda prediction, reference: __import__("time").sleep(5) or True)
    assert is_correct("1", "2", timeout=0.05) is False
    monkeypatch.setattr(grading, "math_equal", lambda prediction, reference: True)
    assert is_correct("1", "2", timeout=0.05) is True


def test_malformed_test_file_line_is_named(tmp_path):
    task = TASKS["gsm8k"]
    path = tmp_path / task.file
    path.parent.mkdir(parents=True)
    good = json.dumps({"question": "1 + 1?", "answer": "2 #### 2"})
    path.write_text(f"{good}\n\n{good}\n{{'question': 'single quotes'}}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}, line 4: not a JSON object")):
        load_examples(task, tmp_path)
    path.write_text(f"{good}\n\n{good}\n", encoding="utf-8")
    assert [example["idx"] for example in load_examples(task, tmp_path)] == [0, 1]
