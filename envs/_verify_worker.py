"""math-verify worker process: reads JSON [pred, truth] lines on stdin, writes "1"/"0" lines on stdout.

Run as a plain script by envs.verify_pool (no package imports, so it never re-imports the
parent's __main__ the way multiprocessing's spawn does).
"""

import json
import sys


def equal(pred: str, truth: str) -> bool:
    from math_verify import parse, verify

    gold = parse(f"${truth}$", parsing_timeout=None)
    guess = parse(f"${pred}$", parsing_timeout=None)
    return bool(gold and guess and verify(gold, guess, timeout_seconds=None))


def main() -> None:
    import math_verify  # noqa: F401  (pay the sympy import before the first request)

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            pred, truth = json.loads(line)
            ok = equal(pred, truth)
        except Exception:  # a parse failure of model text is a wrong answer, not a crash
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
