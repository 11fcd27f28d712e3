"""Answer extraction and scoring: \\boxed{} extraction, math equivalence, integer match, Countdown.

Model text is never passed to Python `eval`: Countdown expressions are parsed with `ast`
and evaluated over exact fractions by a whitelist walker. math-verify (sympy) can hang on
pathological input, so it runs in worker processes with a hard wall-clock limit
(envs.verify_pool), and obvious cases are settled here without it.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

_BOX_CMDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...} (nested braces allowed), or of `\\boxed 5`; None if none."""
    best: str | None = None
    start = 0
    while True:
        hits = [(i, c) for c in _BOX_CMDS if (i := text.find(c, start)) >= 0]
        if not hits:
            return best
        i, cmd = min(hits)
        j = i + len(cmd)
        start = j
        if text.startswith("{", j):
            depth = 0
            for k in range(j, len(text)):
                ch = text[k]
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        best = text[j + 1 : k].strip()
                        start = k + 1
                        break
        elif text.startswith(" ", j):
            m = re.match(r" +([^\s$\\]+)", text[j:])
            if m:
                best = m.group(1)


_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_MAX_NUMBER_CHARS = 1000  # int() refuses > 4300 digits; no ground truth is that long
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


def normalize_number(s: str) -> Fraction | None:
    """A plain number written any common way ("1,234", "$18.00", "023", "336^\\circ", "5\\%"), else None."""
    t = _TEXT_RE.sub(r"\1", s)
    for junk in (
        "\\$",
        "$",
        "\\,",
        "\\!",
        ",",
        " ",
        "^\\circ",
        "^{\\circ}",
        "\\%",
        "%",
        "°",
        "\\left",
        "\\right",
    ):
        t = t.replace(junk, "")
    t = re.sub(r"[a-zA-Z]+$", "", t)  # trailing unit words: "18dollars"
    if len(t) > _MAX_NUMBER_CHARS or not _NUMBER_RE.fullmatch(t):
        return None
    return Fraction(t)


def integer_match(pred: str | None, truth: str) -> bool:
    """GSM8K-style: the predicted number equals the ground truth number (commas, $, units ignored)."""
    if pred is None:
        return False
    p, g = normalize_number(pred), normalize_number(truth)
    return p is not None and g is not None and p == g


def gsm8k_answer(solution: str) -> str:
    """Ground truth of a GSM8K solution: the number after '####', commas removed."""
    return solution.split("####")[-1].strip().replace(",", "")


# -- Countdown -----------------------------------------------------------------------------------

_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_MAX_EXPR_CHARS = 200


def countdown_expression(text: str) -> str | None:
    """The last \\boxed{} or <answer></answer> expression, LaTeX operators made plain, '= target' dropped."""
    expr = last_boxed(text)
    if expr is None:
        tags = _ANSWER_TAG_RE.findall(text)
        expr = tags[-1] if tags else None
    if expr is None:
        return None
    for a, b in (
        ("\\times", "*"),
        ("\\cdot", "*"),
        ("\\div", "/"),
        ("×", "*"),
        ("÷", "/"),
        ("\\left", ""),
        ("\\right", ""),
    ):
        expr = expr.replace(a, b)
    expr = expr.replace("{", "(").replace("}", ")").replace("$", "")
    return expr.split("=")[0].strip()


class _Unsafe(ValueError):
    pass


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of +, -, *, / over integer literals; anything else is rejected."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _evaluate(node.operand, used)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        a, b = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if b == 0:
            raise _Unsafe("division by zero")
        return a / b
    raise _Unsafe(f"not allowed in a Countdown expression: {type(node).__name__}")


def countdown_score(expr: str | None, numbers: tuple[int, ...] | list[int], target: int | str) -> float:
    """1.0 if `expr` uses each of `numbers` exactly once with + - * / and equals `target`, else 0.0."""
    if expr is None or len(expr) > _MAX_EXPR_CHARS:
        return 0.0
    try:
        tree = ast.parse(expr, mode="eval")
        used: list[int] = []
        value = _evaluate(tree, used)
    except (SyntaxError, _Unsafe, ValueError, RecursionError):
        return 0.0
    if Counter(used) != Counter(int(n) for n in numbers):
        return 0.0
    return 1.0 if value == Fraction(int(target)) else 0.0


# -- math equivalence ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    correct: bool
    timed_out: bool = False


def quick_verdict(pred: str, truth: str) -> bool | None:
    """Settle the comparison without sympy when both sides are plain numbers or identical; None = undecided."""
    p, g = normalize_number(pred), normalize_number(truth)
    if p is not None and g is not None:
        return p == g
    if "".join(pred.split()) == "".join(truth.split()):
        return True
    return None
