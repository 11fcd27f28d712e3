"""Why sync RL on tiny_multistep levels off: every trained trajectory of the k-sweep's k=0 runs, sorted by how it failed.

    .venv/bin/python -m benchmarks.stress.multistep_failures [--runs runs] [--glob 'ksweep_*_k0_s*']
        # -> benchmarks/results/stress/multistep_failures.{json,md}

The first k-sweep's calibration (issue 38) found synchronous RL climbing from its warm start's 0.08 to about 0.42
in 10 steps and then level for 70 (from the kept warm start of the second sweep: 0.12 to about 0.6, then level). This reads the trajectories those runs trained on (the run dir's trajectory
log, `agent-rl view`'s source) in two windows, the first and the last ten steps, and follows each one through
its problem ("Start at X and apply x * A + B, N times."): every call should print `V * A + B` where V is the
value of the output just above (X for the first), there should be N calls, and the box should hold the N-th
output. A trajectory ends in the first of:

- solved: the reward was 1;
- stopped early: it boxed an answer after fewer than N calls (the warm start's habit, what RL should unlearn);
- copy slip: a call wrote V with a wrong digit (the value it carried from the output above);
- wrong step: a call used other constants than A and B;
- too many calls, no call, box slip (all N calls right, and the box is not the N-th output: a copy slip into
  the box), other.

Each copy (a value carried into the next call or into the box) is also counted by the value's number of
digits: the copy accuracy by length says whether RL sharpened the copies or only the decisions.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from agent_rl.viewer.log import read_index, read_step
from agent_rl.viewer.report import step_json, tokenizer_decoder
from benchmarks.harness.provenance import portable
from benchmarks.harness.report import table, write
from benchmarks.stress.k_sweep import NAME  # a sweep run's name: method, lr, k, seed

PROBLEM = re.compile(r"Start at (\d+) and apply x \* (\d+) \+ (\d+), (\d+) times\.")  # envs.tiny_multistep
CALL = re.compile(r"print\((\d+) \* (\d+) \+ (\d+)\)")
BOX = re.compile(r"\\boxed\{(-?\d+)\}")
OUTCOMES = (
    "solved",
    "stopped early",
    "copy slip",
    "wrong step",
    "box slip",
    "too many calls",
    "no call",
    "other",
)
WINDOW = 10  # steps at each end of a run


@dataclass
class Tally:
    """Outcomes by N, and copies (right, all) by the copied value's digits."""

    outcomes: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    copies: dict[int, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def row(self) -> dict:
        return {
            "outcomes": {str(n): dict(c) for n, c in sorted(self.outcomes.items())},
            "copies": {str(d): {"right": r, "all": a} for d, (r, a) in sorted(self.copies.items())},
        }


def classify(prompt: str, turns: list[str], reward: float, tally: Tally | None = None) -> str:
    """The outcome of one trajectory: its prompt and the text of each model turn (calls and the box).
    Copies into calls and into the box are added to `tally` (the value's digits, right or not)."""
    m = PROBLEM.search(prompt)
    if m is None:
        raise ValueError(f"multistep_failures: not a tiny_multistep problem: {prompt!r}")
    x, a, b, n = map(int, m.groups())
    tally = tally if tally is not None else Tally()
    value, calls, outcome = x, 0, None
    for text in turns:
        call = CALL.search(text)
        if call is None:
            continue
        calls += 1
        if calls > n:
            outcome = outcome or "too many calls"
            break
        carried, ca, cb = map(int, call.groups())
        if calls > 1:  # the first call copies X from the prompt, the others a value from an output
            tally.copies[len(str(value))][0] += carried == value
            tally.copies[len(str(value))][1] += 1
        if carried != value:
            outcome = outcome or "copy slip"
            break
        if (ca, cb) != (a, b):
            outcome = outcome or "wrong step"
            break
        value = value * a + b
    box = BOX.search(turns[-1]) if turns else None
    if outcome is None and calls == n and box is not None:
        tally.copies[len(str(value))][0] += int(box.group(1)) == value
        tally.copies[len(str(value))][1] += 1
    if reward >= 1.0:
        outcome = "solved"
    elif outcome is None:
        if calls == 0:
            outcome = "no call"
        elif calls < n and box is not None:
            outcome = "stopped early"
        elif calls == n and box is not None:
            outcome = "box slip"
        else:
            outcome = "other"
    tally.outcomes[n][outcome] += 1
    return outcome


def read_run(run: Path, windows: list[tuple[range, Tally]]) -> int:
    """Classify every trajectory the run trained on at each window's steps into its tally; returns how many.
    The run's tokenizer and trajectory index are read once."""
    model = json.loads((run / "resolved_config.json").read_text())["model"]
    decode = tokenizer_decoder(model.get("tokenizer") or model["path"])
    index = read_index(run)
    logged = {x.step for x in index}
    count = 0
    for steps, tally in windows:
        for s in (s for s in steps if s in logged):
            for group in step_json(read_step(run, s, index), decode)["groups"]:
                for t in group["trajectories"]:
                    turns = ["".join(b["text"]) for b in t["blocks"] if b["kind"] == "model"]
                    classify(t["prompt"], turns, t["reward"], tally)
                    count += 1
    return count


def collect(runs: Path, pattern: str) -> dict:
    """Per (method, lr): the runs, and a Tally for the first and the last WINDOW steps."""
    groups: dict[tuple[str, str], dict] = {}
    for run in sorted(runs.glob(pattern)):
        m = NAME.match(run.name)
        if m is None or not (run / "trajectories" / "index.jsonl").is_file():
            continue
        steps = json.loads((run / "resolved_config.json").read_text())["train"]["steps"]
        if not (run / "final_eval.json").is_file():
            continue  # unfinished (the sweep scores a run once its training is done): no last window yet
        g = groups.setdefault(
            (m[1], m[2]), {"runs": [], "first": Tally(), "last": Tally(), "trajectories": 0}
        )
        g["runs"].append(run.name)
        g["trajectories"] += read_run(
            run, [(range(WINDOW), g["first"]), (range(steps - WINDOW, steps), g["last"])]
        )
        print(f"multistep_failures: {run.name}", file=sys.stderr, flush=True)
    return {
        f"{method} lr {lr}": {"runs": g["runs"], "trajectories": g["trajectories"], "first": g["first"].row(),
                              "last": g["last"].row()}
        for (method, lr), g in sorted(groups.items())
    }  # fmt: skip


def _share(c: dict, key: str) -> str:
    total = sum(c.values())
    return f"{c.get(key, 0) / total:.2f}" if total else "-"


def markdown(result: dict) -> str:
    out = [
        "# Why sync RL on tiny_multistep levels off (`benchmarks.stress.multistep_failures`)",
        "",
        f"`{result['command']}`. Every trajectory trained on in the first and the last {WINDOW} steps of the "
        f"k-sweep's runs `{result['glob']}` (by default the synchronous ones, k=0, where each batch is the current "
        "policy; under a lag k a batch is the policy k versions back), by how it ended (shares of the trajectories with N calls due; the "
        "first failure counts), and every copy of a value (from an output into the next call, or the last "
        "output into the box) by the value's digits.",
        "",
    ]
    for name, g in result["groups"].items():
        out += [f"## {name} ({len(g['runs'])} runs: {', '.join(g['runs'])})", ""]
        rows = [[f"{w} {WINDOW}", n, *(_share(c, o) for o in OUTCOMES)] for w in ("first", "last")
                for n, c in g[w]["outcomes"].items()]  # fmt: skip
        out += table(["steps", "N", *OUTCOMES], rows)

        def copy(c: dict | None) -> str:
            return f"{c['right'] / c['all']:.2f} ({c['all']})" if c and c["all"] else "-"

        rows = [
            [f"{w} {WINDOW}", *(copy(g[w]["copies"].get(d)) for d in _digits(g))] for w in ("first", "last")
        ]
        out += ["", *table(["steps", *(f"copy of {d} digits" for d in _digits(g))], rows)]
        out.append("")
    return "\n".join(out)


def _digits(g: dict) -> list[str]:
    return sorted({d for w in ("first", "last") for d in g[w]["copies"]}, key=int)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs", type=Path)
    ap.add_argument(
        "--glob", default="ksweep_*_k0_s*", help="which run dirs (k=0: each batch is the current policy)"
    )
    ap.add_argument("--out", default="benchmarks/results/stress/multistep_failures", type=Path)
    args = ap.parse_args(argv)
    groups = collect(args.runs, args.glob)
    if not groups:
        raise SystemExit(
            f"multistep_failures: no finished run dir matches {args.runs / args.glob}; run the k-sweep first"
        )
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    result = {"command": portable(f"python -m benchmarks.stress.multistep_failures {argv_text}".strip()),
              "window": WINDOW, "glob": args.glob, "groups": groups}  # fmt: skip
    write(args.out.name, result, args.out.parent, lambda r: markdown(r) + "\n")


if __name__ == "__main__":
    main()
