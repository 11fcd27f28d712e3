"""A run's trajectory log -> one self-contained HTML file (no server, no network).

The page embeds the step list and, per step, its recorded groups as JSON (one script tag per
step, parsed only when the step is opened); `viewer.js` renders them. Tokens are decoded one id
at a time with the run's tokenizer (a character split over several byte-level tokens goes to the last), so what is shown is exactly what was trained on, token by
token. Works for any env: a trajectory is prompt + alternating model (sampled) and environment
blocks; a model block and the environment block after it make one turn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path

from agent_rl.types import FinishReason
from agent_rl.viewer.log import (
    RecordedSegment,
    RecordedTrajectory,
    StepRecord,
    StepSummary,
    read_index,
    read_meta,
    read_step,
)

Decode = Callable[[Sequence[int]], str]  # token ids -> text
FENCES = (("```", "```"), ("<tool_call>", "</tool_call>"), ("<code>", "</code>"))  # SimpleTIR, Hermes, others


def build_report(
    run_dir: Path, out: Path | None = None, *, steps: range | None = None, decode: Decode | None = None
) -> Path:
    """Write the viewer for `run_dir` (default RUN_DIR/view.html); `steps` limits which steps are embedded."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    index = [s for s in read_index(run_dir) if steps is None or s.step in steps]
    if not index:
        raise ValueError(
            f"{run_dir}: no recorded step{'' if steps is None else f' in {steps.start}:{steps.stop}'}"
        )
    decode = decode or tokenizer_decoder(meta.tokenizer)
    records = [read_step(run_dir, s.step, index) for s in index]
    page = {
        "run": str(run_dir),
        "is_truncation": meta.is_truncation,
        "keep": meta.keep,
        "steps": [_summary(s) for s in index],
    }
    out = Path(out) if out else run_dir / "view.html"
    out.write_text(render_html(page, [step_json(r, decode) for r in records]))
    return out


def tokenizer_decoder(path: str) -> Decode:
    """id -> text with the run's tokenizer (cached per id)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise FileNotFoundError(
            f"trajectories/meta.json names tokenizer {path!r}, which does not load ({e}); "
            "pass --tokenizer DIR to agent-rl view"
        ) from None
    cache: dict[int, str] = {}

    def decode(ids: Sequence[int]) -> str:
        if len(ids) != 1:
            return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if ids[0] not in cache:
            cache[ids[0]] = tok.decode(
                list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        return cache[ids[0]]

    return decode


def token_texts(ids: Sequence[int], decode: Decode) -> list[str]:
    """One string per token. A token that ends inside a multi-byte character (byte-level BPE) gets "" and
    the token that completes it gets the character, so the text reads right and stays token-aligned."""
    out: list[str] = []
    pending: list[int] = []
    for i in ids:
        pending.append(i)
        text = decode(pending)
        if text.endswith("\ufffd") and len(pending) < 4:  # a UTF-8 character is at most 4 bytes
            out.append("")
            continue
        out.append(text)
        pending = []
    return out


def _summary(s: StepSummary) -> dict[str, object]:
    d = asdict(s)
    for k in ("offset", "length"):
        d.pop(k)
    return d


def step_json(rec: StepRecord, decode: Decode) -> dict[str, object]:
    """One step as the page reads it: groups in recorded order, each with its trajectories."""
    groups: dict[str, list[dict[str, object]]] = {}
    for t in rec.trajectories:
        groups.setdefault(t.group_id, []).append(trajectory_json(t, decode))
    return {
        "step": rec.summary.step,
        "learner_version": rec.summary.learner_version,
        "groups": [
            {"group_id": g, "task_id": rec.trajectories[0].task_id if ts else "", "trajectories": ts}
            for g, ts in groups.items()
        ],
    }


def trajectory_json(t: RecordedTrajectory, decode: Decode) -> dict[str, object]:
    blocks = _blocks(t.segments, masked=t.masked, decode=decode)
    turns = [asdict(x) for x in t.turns]
    # infra_failed (saved as "error" before the rename): an infrastructure failure, left out of its group
    error = t.finish_reason in (FinishReason.INFRA_FAILED, "error") or any(
        x.timed_out or (x.exit_code or 0) != 0 for x in t.turns
    )
    trained = (
        t.seq_log_weight is not None and not t.masked
    )  # a masked trajectory has no weight (no loss token)
    w = math.exp(min(t.seq_log_weight, 700.0)) if trained else None  # type: ignore[arg-type]
    return {
        "uid": t.uid,
        "task_id": t.task_id,
        "reward": t.reward,
        "baseline": t.baseline,
        "advantage": t.advantage,
        "seq_log_weight": t.seq_log_weight,
        "weight": w,
        "finish_reason": t.finish_reason,
        "masked": t.masked,
        "versions": t.versions,
        "turns": turns,
        "flags": {
            "error": error,
            "void": t.finish_reason == "void" or t.masked,
            "truncated": t.finish_reason in ("length", "max_turns"),
        },
        "prompt": decode(t.prompt_ids),
        "blocks": blocks,
    }


def _blocks(segments: Sequence[RecordedSegment], *, masked: bool, decode: Decode) -> list[dict[str, object]]:
    """Consecutive segments of one kind merged (a turn continued after an abort is one model block)."""
    out: list[dict[str, object]] = []
    for s in segments:
        kind = "model" if s.sampled else "env"
        if not out or out[-1]["kind"] != kind:
            out.append({"kind": kind, "text": [], "v": [], "b": [], "c": [], "t": [], "code": []})
        blk = out[-1]
        blk["text"].extend(token_texts(s.token_ids, decode))  # type: ignore[union-attr]
        if s.sampled:
            blk["v"].extend(s.versions)  # type: ignore[union-attr]
            blk["b"].extend(_r(x) for x in s.behavior_logprobs)  # type: ignore[union-attr]
            blk["c"].extend(_r(x) for x in s.current_logprobs)  # type: ignore[union-attr]
            blk["t"].extend(_r(x) for x in s.teacher_logprobs)  # type: ignore[union-attr]
    for blk in out:
        blk["code"] = _inside_fences(blk["text"])  # type: ignore[arg-type]
        blk["trained"] = blk["kind"] == "model" and not masked
        blk["versions"] = sorted(set(blk["v"]))  # type: ignore[arg-type]
        for k in ("c", "t"):  # current (learner) and teacher log-probs: None when not recorded
            if not blk[k]:
                blk[k] = None
    return out


def _r(x: float) -> float:
    return round(x, 4)


def _inside_fences(texts: Sequence[str]) -> list[int]:
    """1 for tokens inside a tool-call fence (```...```, <tool_call>...</tool_call>), fence tokens included."""
    flags, text, inside, close = [], "", False, ""
    for piece in texts:
        before = len(text)
        text += piece
        started = inside
        if not inside:
            for open_, end in FENCES:
                k = text.find(open_, max(0, before - len(open_)))
                if k >= 0:
                    inside, close, text = True, end, text[k + len(open_) :]
                    break
        elif close in text:
            inside, text = False, text[text.index(close) + len(close) :]
        flags.append(int(inside or started))
    return flags


def _script_json(x: object) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(x, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def render_html(page: dict[str, object], steps: Sequence[dict[str, object]]) -> str:
    files = resources.files("agent_rl.viewer")
    template = (files / "page.html").read_text()
    data = "\n".join(
        f'<script type="application/json" id="step-{s["step"]}">{_script_json(s)}</script>' for s in steps
    )
    return (
        template.replace("/*CSS*/", (files / "viewer.css").read_text())
        .replace("/*JS*/", (files / "viewer.js").read_text())
        .replace("<!--PAGE-->", f'<script type="application/json" id="page">{_script_json(page)}</script>')
        .replace("<!--STEPS-->", data)
    )
