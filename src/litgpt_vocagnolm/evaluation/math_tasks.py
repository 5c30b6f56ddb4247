"""The nine math benchmarks of the paper's Table 1 (and the full MATH test set): test data, few-shot CoT prompts,
answer extraction and grading.

VocAgnoLM reports accuracy the way Rho-1 and ProX do, with the math evaluation harness of ToRA
(github.com/ZubinGou/math-evaluation-harness, MIT License, Copyright (c) 2024 Zhibin Gou; license text in
`eval_data/licenses/`). For its `cot` prompt type and these tasks, this module re-implements what the harness does at
commit dcfa46a, so that our numbers compare with the paper's: `data_loader.py` (reading the test files), `utils.py`
(`load_prompt`, `construct_prompt`), `parser.py` (`parse_question`, `parse_ground_truth`, `extract_answer`,
`strip_string`, `run_execute`) and `evaluate.py` (which references it scores). Its `grader.py` is grading.py.

MATH comes in the harness's two settings. `minerva_math`, Table 1's MATH column as in the harness's base-model table
(scripts/run_eval.sh, README footnote 1): MATH-500, the 500-problem OpenAI subset (`data_loader.py` reads
`math_oai` for it), with the 4-shot Minerva prompt. `math`: all 5,000 MATH test problems with the harness's own
5-shot prompt, not part of the default set.

Few-shot prompts: `eval_data/prompts/*.md` are the harness's `prompts/cot/*.md`, byte for byte.
  gsm8k.md         8 shots, the chain-of-thought exemplars of Wei et al. (2022): GSM8K, SVAMP, ASDiv, MAWPS, TabMWP
  minerva_math.md  4 shots, the Minerva prompt of Lewkowycz et al. (2022): MATH-500 (`minerva_math`)
  math.md          5 shots, "Let's think step by step ... \\boxed{}": the full MATH test set (`math`)
  mathqa.md        4 shots written for the harness: MathQA
  mmlu_stem.md     the 4 Minerva shots turned into multiple choice: MMLU-STEM and SAT
The two Minerva-derived files double every LaTeX backslash (`\\\\frac`); that is how the harness ships them, and
grading undoes it (`symbolic_equal`), so it is kept.

Deliberate differences from the harness, none of which changes a score (grading.py lists where a verdict can):
- MathQA options written as a Python list are read with `ast.literal_eval`, not `eval`.
- `strip_string` leaves out the harness's unwrapping of `{x}`, `(x)`, `[x]` when `isalnum()`: no bracketed string is
  alphanumeric, so it never runs there.
"""

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from word2number import w2n

from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.evaluation.grading import check_latex_parser, is_correct, math_equal  # noqa: F401 (evaluate's imports)

DATA_DIR = Path(__file__).parent / "eval_data"
PROMPT_DIR = DATA_DIR / "prompts"

# What the harness stops `cot` generation at ("</s>" as text; the EOS token id stops it too).
STOP_STRINGS = ("</s>", "\n\nQuestion:", "\n\nProblem:")


@dataclass(frozen=True)
class Task:
    name: str
    """Name on the command line (the harness's `data_name`)."""
    column: str
    """Column title in the paper's Table 1."""
    file: str
    """Test file, relative to the data directory."""
    prompt: str
    """Few-shot prompt file in `eval_data/prompts/`."""
    template: str
    """How a test question follows the shots."""
    multiple_choice: bool = False


QUESTION_ANSWER = "Question: {question}\nAnswer:"
PROBLEM_SOLUTION = "Problem:\n{question}\nSolution:"

# In the column order of the paper's Table 1; `math`, not in Table 1, beside `minerva_math`.
TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("gsm8k", "GSM8K", "gsm8k/test.jsonl", "gsm8k.md", QUESTION_ANSWER),
        Task("minerva_math", "MATH", "math_oai/test.jsonl", "minerva_math.md", PROBLEM_SOLUTION),
        Task("math", "MATH-5000", "math/test.jsonl", "math.md", PROBLEM_SOLUTION),
        Task("svamp", "SVAMP", "svamp/test.jsonl", "gsm8k.md", QUESTION_ANSWER),
        Task("asdiv", "ASDiv", "asdiv/test.jsonl", "gsm8k.md", QUESTION_ANSWER),
        Task("mawps", "MAWPS", "mawps/test.jsonl", "gsm8k.md", QUESTION_ANSWER),
        Task("tabmwp", "TabMWP", "tabmwp/problems_test1k.json", "gsm8k.md", QUESTION_ANSWER),
        Task("mathqa", "MathQA", "mathqa/test.jsonl", "mathqa.md", PROBLEM_SOLUTION, multiple_choice=True),
        Task("mmlu_stem", "MMLU-STEM", "mmlu_stem/test.jsonl", "mmlu_stem.md", PROBLEM_SOLUTION, multiple_choice=True),
        Task("sat_math", "SAT", "sat_math/test.jsonl", "mmlu_stem.md", PROBLEM_SOLUTION, multiple_choice=True),
    )
}
# What `vocagnolm evaluate` runs by default: the paper's Table 1, as the harness's scripts/run_eval.sh lists it.
TABLE_1 = ("gsm8k", "minerva_math", "svamp", "asdiv", "mawps", "tabmwp", "mathqa", "mmlu_stem", "sat_math")

CHOICE_INSTRUCTION = "What of the following is the right choice? Explain your answer."


def load_examples(task: Task, data_dir: Path = DATA_DIR) -> list[dict]:
    """The test examples in the harness's order: by `idx`, or by position where the file has none."""
    path = Path(data_dir) / task.file
    if path.suffix == ".json":
        # TabMWP's own format: {pid: problem}.
        problems = json.loads(path.read_text(encoding="utf-8"))
        return [{"idx": i, "pid": pid, **problem} for i, (pid, problem) in enumerate(problems.items())]
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                examples.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise InvalidArgument(
                    f"{path}, line {number}: not a JSON object ({error.msg}, column {error.colno}). Each line of a"
                    f" test file holds one example as JSON; fix or remove that line"
                ) from error
    if examples and "idx" not in examples[0]:
        examples = [{"idx": i, **example} for i, example in enumerate(examples)]
    return sorted(examples, key=lambda example: example["idx"])


def load_prompt(task: Task) -> str:
    """The few-shot exemplars, ending in the blank lines that separate them from the test question."""
    return (PROMPT_DIR / task.prompt).read_text(encoding="utf-8").strip() + "\n\n\n"


def build_prompt(question: str, task: Task, shots: str) -> str:
    return shots + task.template.format(question=question)


def parse_ground_truth(example: dict, task: Task) -> str:
    """The reference answer as the harness scores it.

    `strip_string` is not idempotent, so how often it runs matters ("6:01:00 p.m." -> "6:01:00p." -> "6:01:00p"). The
    harness normalizes a reference when it reads the example and again when its `evaluate.py` re-parses the saved
    sample; for `math` it extracts the reference afresh from the solution there instead, normalized once; for
    `minerva_math` the reference extracted from the solution was already normalized once before the two.
    """
    name = task.name
    if name == "math":
        return _extract_open_answer(example["solution"].strip())
    if name == "minerva_math":
        answer = _extract_open_answer(example["solution"])
    elif name == "gsm8k":
        answer = example["answer"].split("####")[1]
    elif name == "svamp":
        answer = example["Answer"]
    elif name == "asdiv":
        answer = re.sub(r"\(.*?\)", "", example["answer"])  # "9 (apples)" -> "9 "
    elif name == "mawps":
        answer = example["target"]
    elif name == "tabmwp":
        answer = example["answer"]
        if example["ans_type"] in ("integer_number", "decimal_number"):
            if "/" in answer:
                answer = int(answer.split("/")[0]) / int(answer.split("/")[1])
            elif "," in answer:
                answer = float(answer.replace(",", ""))
            elif "%" in answer:
                answer = float(answer.split("%")[0]) / 100
            else:
                answer = float(answer)
    elif name == "mathqa":
        answer = example["correct"].upper()
    elif name == "mmlu_stem":
        answer = "ABCD"[example["answer"]]
    elif name == "sat_math":
        answer = example["Answer"]
    else:
        raise ValueError(f"no ground truth rule for task {name!r}")
    return strip_string(strip_string(answer))


def parse_question(example: dict, task: Task) -> str:
    """The test question as the harness shows it to the model (tables and options written out)."""
    name = task.name
    if name == "asdiv":
        question = f"{example['body'].strip()} {example['question'].strip()}"
    elif name == "svamp":
        body = example["Body"].strip()
        if not body.endswith("."):
            body += "."
        question = f"{body} {example['Question'].strip()}"
    elif name == "tabmwp":
        title = f'regarding "{example["table_title"]}" ' if example["table_title"] else ""
        question = f"Read the following table {title}and answer a question:\n{example['table']}\n{example['question']}"
        if example["choices"]:
            question += f" Please select from the following options: {example['choices']}"
    elif name == "mmlu_stem":
        options = ", ".join(f"({label}) {str(option).strip()}" for label, option in zip("ABCD", example["choices"]))
        question = f"{example['question'].strip()}\n{CHOICE_INSTRUCTION}\n{options}"
    elif name == "sat_math":
        options = "(" + example["options"].strip()  # "A) 1 B) 2 ..." -> "(A) 1 (B) 2 ..."
        for label in "BCD":
            options = options.replace(f" {label}) ", f" ({label}) ")
        question = f"{example['question'].strip()}\n{CHOICE_INSTRUCTION}\n{options.strip()}"
    elif name == "mathqa":
        problem = example["problem"][0].upper() + example["problem"][1:]
        options = example["options"].strip()
        if options.startswith("["):
            options = ", ".join(ast.literal_eval(options))
        for label in "abcde":  # "a ) 12 , b ) 16" -> "(A) 12, (B) 16"
            if f"{label} ) " in options:
                options = options.replace(f"{label} ) {label} ) ", f"{label} ) ")
                options = options.replace(f"{label} ) ", f"({label.upper()}) ")
        options = options.replace(" , ", ", ")
        question = f"{problem.strip()}\n{CHOICE_INSTRUCTION}\n{options.strip()}"
    else:
        question = next(example[key] for key in ("question", "problem", "Question", "input") if key in example)
    answer = parse_ground_truth(example, task).lower()
    if answer in ("true", "false"):
        question += " (True or False)"
    if answer in ("yes", "no"):
        question += " (Yes or No)"
    return question.strip()


# Answer extraction (harness parser.py)


def extract_answer(generation: str, task: Task) -> str | None:
    """The normalized final answer in a generation: a choice letter, or what `\\boxed{}`, "The answer is" or the
    last number says. Normalized twice for open answers, as the harness does (in `extract_answer`, again in
    `run_execute`). `None` for an empty generation (or one reading "error"), as `run_execute` gives: it equals no
    reference, not even one that normalizes to "" (`\\text{east}`)."""
    if generation.strip() in ("", "error"):
        return None
    if task.multiple_choice:
        return strip_string(_extract_choice(generation))
    return strip_string(_extract_open_answer(generation))


def _extract_open_answer(generation: str) -> str:
    """The harness's `extract_answer` for open (not multiple-choice) answers: normalized once."""
    if "final answer is $" in generation and "$. I hope" in generation:  # the Minerva prompt's closing line
        answer = generation.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in generation:
        answer = _boxed_content(generation.split("boxed")[-1])
        if not answer:
            return ""
    elif "he answer is" in generation:
        answer = generation.split("he answer is")[-1].strip()
    elif "final answer is" in generation:
        answer = generation.split("final answer is")[-1].strip()
    else:
        numbers = re.findall(r"-?\d*\.?\d+", generation.replace(",", ""))
        answer = numbers[-1] if numbers else ""
    answer = re.sub(r"\n\s*", "", answer)
    if answer.startswith(":"):
        answer = answer[1:]
    if answer.endswith("."):
        answer = answer[:-1]
    if answer.endswith("/"):
        answer = answer[:-1]
    return strip_string(answer)


def _extract_choice(generation: str) -> str:
    generation = generation.split("Problem:", 1)[0].replace("choice is", "answer is")
    match = re.search(r"answer is \(?(?P<answer>[abcde])\)?", generation.lower())
    return match.group("answer").upper() if match else "placeholder"  # the harness's word for no answer: wrong


def _boxed_content(after_boxed: str) -> str:
    """`{\\frac{1}{2}} rest` -> `\\frac{1}{2}` (braces matched); `5$ rest` -> `5`."""
    if not after_boxed.startswith("{"):
        return after_boxed.split("$")[0].strip()
    depth, content = 1, ""
    for char in after_boxed[1:]:
        depth += (char == "{") - (char == "}")
        if depth == 0:
            break
        content += char
    return content


# Units, mostly from MathQA, that `strip_string` removes when they stand as words. They are regular expressions, not
# escaped (so "q ." matches "q x" too), exactly as in the harness.
UNIT_TEXTS = [
    "east",
    "degree",
    "mph",
    "kmph",
    "ft",
    "m sqaure",
    " m east",
    "sq m",
    "deg",
    "mile",
    "q .",
    "monkey",
    "prime",
    "ratio",
    "profit of rs",
    "rd",
    "o",
    "gm",
    "p . m",
    "lb",
    "tile",
    "per",
    "dm",
    "lt",
    "gain",
    "ab",
    "way",
    "west",
    "a .",
    "b .",
    "c .",
    "d .",
    "e .",
    "f .",
    "g .",
    "h .",
    "t",
    "a",
    "h",
    "no change",
    "men",
    "soldier",
    "pie",
    "bc",
    "excess",
    "st",
    "inches",
    "noon",
    "percent",
    "by",
    "gal",
    "kmh",
    "c",
    "acre",
    "rise",
    "a . m",
    "th",
    "π r 2",
    "sq",
    "mark",
    "l",
    "toy",
    "coin",
    "sq . m",
    "gallon",
    "° f",
    "profit",
    "minw",
    "yr",
    "women",
    "feet",
    "am",
    "pm",
    "hr",
    "cu cm",
    "square",
    "v â € ™",
    "are",
    "rupee",
    "rounds",
    "cubic",
    "cc",
    "mtr",
    "s",
    "ohm",
    "number",
    "kmph",
    "day",
    "hour",
    "minute",
    "min",
    "second",
    "man",
    "woman",
    "sec",
    "cube",
    "mt",
    "sq inch",
    "mp",
    "∏ cm ³",
    "hectare",
    "more",
    "sec",
    "unit",
    "cu . m",
    "cm 2",
    "rs .",
    "rs",
    "kg",
    "g",
    "month",
    "km",
    "m",
    "cm",
    "mm",
    "apple",
    "liter",
    "loss",
    "yard",
    "pure",
    "year",
    "increase",
    "decrease",
    "d",
    "less",
    "Surface",
    "litre",
    "pi sq m",
    "s .",
    "metre",
    "meter",
    "inch",
]
UNIT_TEXTS += [unit + "s" for unit in UNIT_TEXTS]
_UNIT_PATTERNS = [re.compile(r"(^|\W)" + unit + r"($|\W)") for unit in UNIT_TEXTS]
# Matches where any of them would. Most answers hold no unit; checking first skips 2 x 250 substitutions (~1 ms).
_ANY_UNIT = re.compile(r"(^|\W)(?:" + "|".join(f"(?:{unit})" for unit in UNIT_TEXTS) + r")($|\W)")


def strip_string(answer) -> str:
    """The harness's answer normalization: drops units, `$`, `%`, `\\left`, `\\text{}`, trailing `.0`, spaces;
    rewrites number words, `a/b` and `\\frac12` as `\\frac{a}{b}`, `\\dfrac` as `\\frac`."""
    string = str(answer).strip().replace("\n", "").rstrip(".")
    string = string.replace("\\!", "")
    string = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", string)
    string = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", string)
    string = string.replace("bmatrix", "pmatrix")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    # A trailing \text{...} is a unit, unless it is all there is.
    without_unit = re.sub(r"\\text{.*?}$", "", string).strip()
    if without_unit != "" and without_unit != string:
        string = without_unit
    for _ in range(2 if _ANY_UNIT.search(string) else 0):
        for pattern in _UNIT_PATTERNS:
            without_unit = pattern.sub(r"\1\2", string)
            if without_unit != "":
                string = without_unit
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "").replace("$", "")
    string = _convert_word_number(string)
    string = re.sub(r"\\text\{(.*?)\}", r"\1", string)
    for key in ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to"):
        string = string.replace(key, "")
    string = string.replace("\\emptyset", "{}").replace("(-\\infty,\\infty)", "\\mathbb{R}")
    string = string.replace("\\%", "").replace("%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    string = string.replace("infinity", "\\infty")
    if "\\infty" not in string:
        string = string.replace("inf", "\\infty")
    string = string.replace("+\\inity", "\\infty")
    string = string.replace("and", "").replace("\\mathbf", "")
    string = re.sub(r"\\mbox{.*?}", "", string)
    if "j" in string and "i" not in string:
        string = string.replace("j", "i")
    string = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", string)  # 2.000x -> 2x
    string = re.sub(r"(\d+)\.0*$", r"\1", string)  # 2.0 -> 2
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:  # "k = 5" -> "5"
        string = string.split("=")[1]
    string = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    return _fix_a_slash_b(string)


def _convert_word_number(text: str) -> str:
    try:
        return str(w2n.word_to_num(text))
    except Exception:  # it raises ValueError, and IndexError on some inputs, when there is no number
        return text


def _fix_fracs(string: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`."""
    head, *parts = string.split("\\frac")
    fixed = head
    for part in parts:
        fixed += "\\frac"
        if part.startswith("{"):
            fixed += part
            continue
        if len(part) < 2:
            return string
        numerator, denominator, rest = part[0], part[1], part[2:]
        if denominator != "{":
            fixed += "{" + numerator + "}{" + denominator + "}" + rest
        else:
            fixed += "{" + numerator + "}" + denominator + rest
    return fixed


def _fix_a_slash_b(string: str) -> str:
    """`3/4` -> `\\frac{3}{4}` when both sides are plain integers (or hold a sqrt)."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    numerator, denominator = parts
    try:
        numerator = numerator if "sqrt" in numerator else int(numerator)
        denominator = denominator if "sqrt" in denominator else int(denominator)
    except ValueError:
        return string
    if string != f"{numerator}/{denominator}":
        return string
    return "\\frac{" + str(numerator) + "}{" + str(denominator) + "}"
