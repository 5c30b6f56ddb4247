"""Grading as the math evaluation harness grades: `math_equal` and `symbolic_equal` of its `grader.py` (commit
dcfa46a of github.com/ZubinGou/math-evaluation-harness, MIT License), re-implemented path for path, and its 3 s limit
per comparison (`evaluate.py`: a pebble process pool with `timeout=3`; a comparison that runs out of time is wrong).

`symbolic_equal` parses each side with the first of three parsers that accepts it, as the harness does: sympy's
`parse_latex`, sympy's `parse_expr` (Python syntax: `(pi**2)/(6)`, `[5,5*sqrt(2)]`, `{3,1,2}`, `"21"`) and
latex2sympy (matrices: `\\begin{pmatrix}-1/3\\\\2/3\\end{pmatrix}` becomes a `Matrix`). latex2sympy is the harness's
own pin, github.com/ZubinGou/latex2sympy (antlr4 4.11.1, like sympy's parser), installed from PyPI as
`latex2sympy2-llmmath==1.9.1`, whose `latex2sympy2.py` and ANTLR parser are that repository's files byte for byte.

Where a verdict can still differ from the harness's (tests/test_grading.py holds the cases):
- sympy: the harness pins 1.12, we run what is installed (>= 1.12); a comparison that only one version's simplifier
  or parser settles can differ. The table in the tests gives the same verdict under 1.12 and 1.14.
- `parse_expr` runs Python's `eval` on the model's answer. We hand it only answers that cannot reach code beyond
  sympy's mathematics (`_safe_for_eval`): no `__`, no attribute access, no Python builtins but a few numeric ones, no
  sympy function that parses or prints strings, and quotes only around the whole answer. Anything else goes straight
  to latex2sympy; the harness would have eval'ed it, which for such text is an error in all but contrived cases.
- The time limit is SIGALRM's, in the main thread only (elsewhere comparisons run unbounded), and 3 s of this
  machine's time: a comparison near the limit can end on either side of it. A signal waits for the Python code it
  interrupts, so one long computation in C (a power tower of integers) overruns the limit before it scores wrong,
  where the harness ends its process at 3 s.
"""

import builtins
import math
import re
import signal
import threading
from types import ModuleType

from sympy import N, simplify
from sympy.parsing.sympy_parser import parse_expr


def math_equal(prediction: str | None, reference: str, include_percentage: bool = True) -> bool:
    """Whether a normalized answer equals the normalized reference (harness grader.py `math_equal`): as strings, as
    numbers (within 1e-4 relative, also the reference as a percentage), element-wise for tuples, intervals and
    matrices, as equations, or symbolically. `None`, an empty generation's answer, equals nothing."""
    if str(prediction) == str(reference):
        return True
    prediction_number, reference_number = _parse_digits(prediction), _parse_digits(reference)
    if prediction_number is not None and reference_number is not None:
        candidates = [reference_number]
        if include_percentage:
            candidates = [reference_number / 100, reference_number, reference_number * 100]
        return any(_numeric_equal(prediction_number, candidate) for candidate in candidates)
    if not prediction:
        return False

    prediction, reference = prediction.strip(), str(reference).strip()
    if "pmatrix" in prediction and "pmatrix" not in reference:
        reference = _str_to_pmatrix(reference)

    # Brackets: "[1,2]" vs "1,2", "(a)" vs "a".
    prediction_text, reference_text = prediction, reference
    if (prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")) or (
        prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    ):
        prediction_text, reference_text = prediction_text.strip("[]()"), reference_text.strip("[]()")
    for bracket in "{}()":
        prediction_text, reference_text = prediction_text.replace(bracket, ""), reference_text.replace(bracket, "")
    if prediction_text.lower() == reference_text.lower():
        return True

    # (a, b) vs (c, d): element by element.
    bracketed = r"(\(|\[).+(\)|\])"
    if re.match(bracketed, prediction) and re.match(bracketed, reference):
        prediction_parts, reference_parts = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(prediction_parts) == len(reference_parts) and all(
            math_equal(p, r, include_percentage) for p, r in zip(prediction_parts, reference_parts)
        ):
            return True

    if _is_matrix(prediction) and _is_matrix(reference):
        prediction_rows, reference_rows = _matrix_rows(prediction), _matrix_rows(reference)
        if len(prediction_rows) == len(reference_rows) and all(
            len(p) == len(r) and all(math_equal(a, b, include_percentage) for a, b in zip(p, r))
            for p, r in zip(prediction_rows, reference_rows)
        ):
            return True

    # Equations: "x + y = 1" vs "y = 1 - x"; "x = 3" vs "3".
    if prediction.count("=") == 1 and reference.count("=") == 1:
        prediction_zero = "{} - ({})".format(*(side.strip() for side in prediction.split("=")))
        reference_zero = "{} - ({})".format(*(side.strip() for side in reference.split("=")))
        if symbolic_equal(prediction_zero, reference_zero) or symbolic_equal(f"-({prediction_zero})", reference_zero):
            return True
    elif prediction.count("=") == 1 and len(prediction.split("=")[0].strip()) <= 2 and "=" not in reference:
        if math_equal(prediction.split("=")[1], reference, include_percentage):
            return True
    elif reference.count("=") == 1 and len(reference.split("=")[0].strip()) <= 2 and "=" not in prediction:
        if math_equal(prediction, reference.split("=")[1], include_percentage):
            return True

    return symbolic_equal(prediction, reference)


def _parse_digits(text) -> float | None:
    text = str(text).replace(",", "")
    try:
        return float(text)
    except ValueError:
        pass
    if text.endswith("%"):
        text = text[:-1].removesuffix("\\")
        try:
            return float(text) / 100
        except ValueError:
            pass
    return None


def _numeric_equal(prediction: float, reference: float) -> bool:
    return math.isclose(reference, prediction, rel_tol=1e-4)


def _str_to_pmatrix(text: str) -> str:
    """`{1,2}` -> `\\begin{pmatrix}1\\2\\end{pmatrix}`, for references written as sets."""
    matrices = re.findall(r"\{.*,.*\}", text.strip())
    return ", ".join(r"\begin{pmatrix}" + m.strip("{}").replace(",", "\\") + r"\end{pmatrix}" for m in matrices)


def _is_matrix(text: str) -> bool:
    begins, ends = ("\\begin{pmatrix}", "\\begin{bmatrix}"), ("\\end{pmatrix}", "\\end{bmatrix}")
    return text.startswith(begins) and text.endswith(ends)


def _matrix_rows(text: str) -> list[list[str]]:
    body = text[len("\\begin{pmatrix}") : -len("\\end{pmatrix}")]
    return [line.strip().split("&") for line in body.split("\\\\") if line.strip()]


def symbolic_equal(a: str, b: str) -> bool:
    """Equality of two answers under sympy (harness grader.py `symbolic_equal`): identical, simplifying to a zero
    difference, equal equations, numerically equal, or equal matrices to 3 decimals. Each side is what `_parse`
    makes of it: a sympy object, a Python list, set or string from `parse_expr`, or the text when nothing parses."""
    a, b = _parse(a), _parse(b)
    try:
        if str(a) == str(b) or a == b:
            return True
    except Exception:
        pass
    try:
        if a.equals(b) or simplify(a - b) == 0:
            return True
    except Exception:
        pass
    try:
        if (abs(a.lhs - a.rhs)).equals(abs(b.lhs - b.rhs)):
            return True
    except Exception:
        pass
    try:
        if _numeric_equal(_float(a), _float(b)):
            return True
    except Exception:
        pass
    try:
        if a.shape == b.shape and a.applyfunc(lambda x: round(x, 3)).equals(b.applyfunc(lambda x: round(x, 3))):
            return True
    except Exception:
        pass
    return False


def _float(value) -> float:
    """`float(N(value))`, where `N` parses a string with `eval` (as `parse_expr` does): only strings that are safe."""
    if isinstance(value, str) and not _safe_for_eval(value):
        raise ValueError(f"not evaluated: {value!r}")
    return float(N(value))


def _parse(text: str):
    """What the harness's `symbolic_equal._parse` makes of an answer: the first of sympy's `parse_latex`, sympy's
    `parse_expr` and latex2sympy that accepts it, each given the text with doubled backslashes (the Minerva
    prompt's) halved first, then as it is; the text itself when none does."""
    from latex2sympy2 import latex2sympy
    from sympy.parsing.latex import parse_latex

    for parser in (parse_latex, _parse_python, latex2sympy):
        for candidate in (text.replace("\\\\", "\\"), text):
            try:
                return parser(candidate)
            except ImportError:  # no ANTLR 4.11: never grade without symbolic equality (see `check_latex_parser`)
                raise
            except Exception:
                pass
    return text


# Python builtins an answer may name (abs(-3), max(2,5)); the others (eval, open, getattr, chr, ...) reach code.
_NUMERIC_BUILTINS = {"abs", "max", "min", "pow", "round", "sum", "int", "float", "complex", "divmod"}
# sympy names that parse strings (sympify, S; and through them any sympy function given a string) or make them
# (the printers: srepr, latex, ...): with either, an answer could spell and run code without quotes or attributes.
_SYMPY_NAMESPACE: dict = {}
exec("from sympy import *", _SYMPY_NAMESPACE)  # what `parse_expr` sees besides the builtins
_STRING_MODULES = ("sympy.printing", "sympy.parsing", "sympy.interactive", "sympy.plotting", "sympy.utilities")
_UNSAFE_NAMES = (
    {name for name in vars(builtins) if name not in _NUMERIC_BUILTINS}
    | {
        name
        for name, value in _SYMPY_NAMESPACE.items()
        if isinstance(value, ModuleType) or str(getattr(value, "__module__", "")).startswith(_STRING_MODULES)
    }
    | {"sympify", "S", "var"}
)
_SINGLE_STRING = re.compile(r"""\s*(["'])[^"']*\1\s*""")


def _safe_for_eval(text: str) -> bool:
    """Whether `eval` of this answer (sympy's `parse_expr`, `N`) runs sympy's mathematics only: no dunder, no
    attribute access, no name from `_UNSAFE_NAMES`, and quotes only around the whole answer."""
    if "__" in text or re.search(r"\.\s*[A-Za-z_]", text):
        return False
    if ('"' in text or "'" in text) and not _SINGLE_STRING.fullmatch(text):
        return False
    return not any(name in _UNSAFE_NAMES for name in re.findall(r"[A-Za-z_]\w*", text))


def _parse_python(text: str):
    """sympy's `parse_expr`, as the harness calls it, on answers `_safe_for_eval` lets through."""
    if not _safe_for_eval(text):
        raise ValueError(f"not evaluated: {text!r}")
    return parse_expr(text)


def check_latex_parser() -> None:
    """Fails, naming the fix, where a LaTeX parser cannot run: sympy's needs antlr4-python3-runtime 4.11, and
    latex2sympy is the harness's fork."""
    from sympy.parsing.latex import parse_latex

    try:
        parse_latex("1")
    except ImportError as error:
        raise ImportError(f"{error}. Grading needs it: pip install 'antlr4-python3-runtime==4.11.*'") from error
    try:
        import latex2sympy2  # noqa: F401
    except ImportError as error:
        raise ImportError(f"{error}. Grading needs it: pip install 'latex2sympy2-llmmath==1.9.1'") from error


class _Timeout(BaseException):
    """A BaseException, so that the `except Exception` around sympy calls cannot swallow it."""


def is_correct(prediction: str | None, reference: str, timeout: float = 3.0) -> bool:
    """`math_equal` under the harness's time limit (sympy's simplify can run for minutes on a long generated
    expression); a comparison that runs out of time is wrong. The limit needs SIGALRM, so it applies in the main
    thread only."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return math_equal(prediction, reference)

    def _raise(signum, frame):
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return math_equal(prediction, reference)
    except _Timeout:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
