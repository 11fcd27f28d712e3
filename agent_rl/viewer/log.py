"""Trajectory log: what each step trained on, token by token, for `agent-rl view`.

RUN_DIR/trajectories/ holds
- `data.bin`: one zlib-compressed record per step, appended;
- `index.jsonl`: one line per step (offset and length of its record in data.bin, plus the
  step's reward, ESS and staleness), so a step is read with one seek, never the whole file;
- `meta.json`: what the viewer needs to render (tokenizer, IS truncation c).

A record holds the step's recorded trajectories (`logging.trajectories`: all, N per step
in whole groups, or 0): token ids, per-token policy version, behaviour and current
log-probs (and the teacher's, when the run distils), loss mask (masked flag + segment kinds), turn boundaries, reward, baseline,
advantage and sequence log-weight. Appends are crash-safe (data first, then its index
line; a torn tail is cut on open) and resumable (opening at `start` drops later steps,
which the resumed run records again).

Imports neither torch nor Ray (the learner hands tensors through `trained_rows`).
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
import time
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agent_rl.learners.api import TrainedRow
from agent_rl.types import Group, Trajectory, TurnInfo

if TYPE_CHECKING:
    from agent_rl.learners.api import Learner

FORMAT_VERSION = 1
DIR = "trajectories"


# -- what a reader gets back ----------------------------------------------------------------


@dataclass(frozen=True)
class RecordedSegment:
    """A run of sampled (model) or environment tokens; per-token arrays are empty for env segments."""

    token_ids: list[int]
    sampled: bool
    versions: list[int]
    behavior_logprobs: list[float]
    current_logprobs: list[float]  # empty when the learner did not record them
    teacher_logprobs: list[float] = field(
        default_factory=list
    )  # empty unless the run distils (algorithm.teacher)


@dataclass(frozen=True)
class RecordedTrajectory:
    uid: str
    group_id: str
    task_id: str
    prompt_ids: list[int]
    segments: list[RecordedSegment]
    reward: float | None
    finish_reason: str | None
    masked: bool  # loss mask 0 everywhere (void turn); its reward still counts in the group
    turns: list[TurnInfo]
    baseline: float | None  # None: the learner did not record it (e.g. the Megatron backend)
    advantage: float | None
    seq_log_weight: float | None

    @property
    def versions(self) -> list[int]:
        """Distinct policy versions that sampled this trajectory's tokens, in order."""
        return sorted({v for s in self.segments for v in s.versions})


@dataclass(frozen=True)
class StepSummary:
    """One index line: where the step's record lies and what the step list shows."""

    step: int
    offset: int
    length: int
    trajectories: int  # recorded
    groups: int  # recorded
    batch_trajectories: int  # trained on
    learner_version: int  # version of the weights the batch was trained on (staleness is measured to it)
    reward_mean: float  # over the whole batch
    ess_ratio: float | None
    staleness_mean: float | None
    staleness_max: float | None
    bytes_raw: int  # uncompressed size of the record


@dataclass(frozen=True)
class StepRecord:
    summary: StepSummary
    trajectories: list[RecordedTrajectory]


@dataclass(frozen=True)
class LogMeta:
    """meta.json: written when the log is opened."""

    format: int
    tokenizer: str  # path of the tokenizer that decodes the token ids
    is_truncation: float  # c in min(w, c)
    keep: int | Literal["all"]


# -- writing ------------------------------------------------------------------------------------


class TrajectoryLog:
    """Appends one record per step; `keep`: 'all', N trajectories per step (whole groups), or 0 (off)."""

    def __init__(
        self,
        run_dir: Path,
        keep: int | Literal["all"],
        *,
        tokenizer: str,
        is_truncation: float,
        seed: int = 0,
        start: int = 0,
    ) -> None:
        """Open (or create) RUN_DIR/trajectories; records of steps >= `start` are dropped (resume)."""
        self.keep, self.seed = keep, seed
        self.dir = Path(run_dir) / DIR
        if keep == 0:
            if (self.dir / "index.jsonl").exists():  # resumed with recording off: no records past `start`
                _truncate(self.dir, start)
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tok = str(Path(tokenizer).resolve()) if Path(tokenizer).exists() else tokenizer  # a dir, or a hub id
        meta = LogMeta(FORMAT_VERSION, tok, is_truncation, keep)
        (self.dir / "meta.json").write_text(json.dumps(asdict(meta)))
        _truncate(self.dir, start)

    def append(
        self, step: int, batch: Sequence[Group], learner: Learner, metrics: Mapping[str, float]
    ) -> float:
        """Record `step` (call it after the learner step, whose rows it reads); returns the seconds it took."""
        if self.keep == 0:
            return 0.0
        t0 = time.perf_counter()
        rows = learner.trained_rows() or {}
        groups = self._select(step, batch, rows)
        blob, raw = encode_step(groups, rows)
        rewards = [r for g in batch for r in g.rewards]
        data = self.dir / "data.bin"
        with open(data, "ab") as f:
            offset = f.tell()
            f.write(blob)
            f.flush()
        summary = StepSummary(
            step=step,
            offset=offset,
            length=len(blob),
            trajectories=sum(len(g.trajectories) for g in groups),
            groups=len(groups),
            batch_trajectories=len(rewards),
            learner_version=learner.version - (0 if metrics.get("learner/skipped", 0.0) else 1),
            reward_mean=sum(rewards) / max(len(rewards), 1),
            ess_ratio=_opt(metrics.get("vcpo/ess_ratio")),
            staleness_mean=_opt(metrics.get("learner/staleness_mean")),
            staleness_max=_opt(metrics.get("learner/staleness_max")),
            bytes_raw=raw,
        )
        with open(self.dir / "index.jsonl", "a") as f:
            f.write(json.dumps(asdict(summary)) + "\n")
        return time.perf_counter() - t0

    def _select(self, step: int, batch: Sequence[Group], rows: Mapping[str, TrainedRow]) -> list[Group]:
        """Whole groups: the one holding the step's largest weight first, then random ones up to `keep`."""
        if self.keep == "all":
            return list(batch)
        order = list(range(len(batch)))
        random.Random(self.seed * 1_000_003 + step).shuffle(order)
        if rows:
            top = max(range(len(batch)), key=lambda i: _max_weight(batch[i], rows))
            order.remove(top)
            order.insert(0, top)
        chosen: list[int] = []
        n = 0
        for i in order:
            size = len(batch[i].trajectories)
            if chosen and n + size > self.keep:
                break
            chosen.append(i)
            n += size
        return [batch[i] for i in sorted(chosen)]


def _max_weight(g: Group, rows: Mapping[str, TrainedRow]) -> float:
    return max((rows[t.uid].seq_log_weight for t in g.trajectories if t.uid in rows), default=-math.inf)


def _opt(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _truncate(d: Path, start: int) -> None:
    """Keep whole records of steps < start: drop later index lines, a torn last line and data past them."""
    index, data = d / "index.jsonl", d / "data.bin"
    kept, end = [], 0
    if index.exists():
        for line in index.read_text().splitlines():
            try:
                s = json.loads(line)
            except json.JSONDecodeError:
                break  # a torn last line: the run was killed mid-append
            if s["step"] >= start:
                break
            kept.append(line)
            end = s["offset"] + s["length"]
    size = data.stat().st_size if data.exists() else 0
    if size < end:
        raise ValueError(
            f"{data}: {size} bytes but {index} points to byte {end}; the log is damaged, delete {d}"
        )
    if data.exists():
        os.truncate(data, end)
    index.write_text("".join(line + "\n" for line in kept))


# -- the record encoding --------------------------------------------------------------------------
# zlib( u32 header_len | u32 n_ints | u32 n_floats | header JSON | int32[n_ints] | float32[n_floats] )
# ints per trajectory: prompt ids, then per segment its ids (+ its versions when sampled);
# floats per sampled segment: behaviour log-probs (+ current log-probs when the learner recorded them)
# (+ the teacher's log-probs when the trajectory carries them: "teacher" in its header).


def encode_step(groups: Sequence[Group], rows: Mapping[str, TrainedRow]) -> tuple[bytes, int]:
    """(compressed record, uncompressed size)."""
    trajs: list[dict[str, Any]] = []
    ints, floats = array("i"), array("f")
    for g in groups:
        for t in g.trajectories:
            row = rows.get(t.uid)
            trajs.append(_header(t, row))
            ints.extend(t.prompt_ids)
            pos = len(t.prompt_ids)  # flattened position of the segment's first token
            current = _current(row, len(t)) if row is not None else None
            teacher = iter(t.teacher_logprobs or ())
            for s in t.segments:
                n = len(s.token_ids)
                ints.extend(s.token_ids)
                if s.sampled:
                    assert s.versions is not None and s.logprobs is not None
                    ints.extend(s.versions)
                    floats.extend(s.logprobs)
                    if current is not None:
                        floats.extend(current[pos : pos + n])
                    if t.teacher_logprobs is not None:
                        floats.extend(next(teacher) for _ in range(n))
                pos += n
    header = json.dumps({"format": FORMAT_VERSION, "trajectories": trajs}, separators=(",", ":")).encode()
    body = (
        struct.pack("<III", len(header), len(ints), len(floats)) + header + ints.tobytes() + floats.tobytes()
    )
    return zlib.compress(body, 6), len(body)


def _current(row: TrainedRow, n: int) -> array:
    return array("f", row.logprobs[:n].float().contiguous().numpy().tobytes())


def _header(t: Trajectory, row: TrainedRow | None) -> dict[str, Any]:
    return {
        "uid": t.uid,
        "group_id": t.group_id,
        "task_id": t.task_id,
        "reward": t.reward,
        "finish_reason": None if t.finish_reason is None else str(t.finish_reason),
        "masked": t.masked,
        "turns": [asdict(x) for x in t.turns],
        "n_prompt": len(t.prompt_ids),
        "segments": [[len(s.token_ids), s.sampled] for s in t.segments],
        "trained": row is not None,
        "teacher": t.teacher_logprobs is not None,
        "baseline": None if row is None else _opt(row.baseline),
        "advantage": None if row is None else _opt(row.advantage),
        "seq_log_weight": None if row is None else _finite_or_clip(row.seq_log_weight),
    }


def _finite_or_clip(x: float) -> float:
    """JSON has no infinities: an extreme log-weight is clipped to ±1e4 (exp() of it is 0 or inf anyway)."""
    return max(min(x, 1e4), -1e4) if not math.isnan(x) else 0.0


def decode_step(summary: StepSummary, blob: bytes) -> StepRecord:
    body = zlib.decompress(blob)
    nh, ni, nf = struct.unpack("<III", body[:12])
    header = json.loads(body[12 : 12 + nh])
    if header["format"] != FORMAT_VERSION:
        raise ValueError(f"trajectory record format {header['format']}; this agent-rl reads {FORMAT_VERSION}")
    ints, floats = array("i"), array("f")
    ints.frombytes(body[12 + nh : 12 + nh + 4 * ni])
    floats.frombytes(body[12 + nh + 4 * ni : 12 + nh + 4 * ni + 4 * nf])
    ip = fp = 0
    out = []
    for h in header["trajectories"]:
        prompt = ints[ip : ip + h["n_prompt"]].tolist()
        ip += h["n_prompt"]
        segs = []
        for n, sampled in h["segments"]:
            ids = ints[ip : ip + n].tolist()
            ip += n
            if not sampled:
                segs.append(RecordedSegment(ids, False, [], [], []))
                continue
            vers = ints[ip : ip + n].tolist()
            ip += n
            blp = floats[fp : fp + n].tolist()
            fp += n
            clp: list[float] = []
            if h["trained"]:
                clp = floats[fp : fp + n].tolist()
                fp += n
            tlp: list[float] = []
            if h.get("teacher"):
                tlp = floats[fp : fp + n].tolist()
                fp += n
            segs.append(RecordedSegment(ids, True, vers, blp, clp, tlp))
        out.append(
            RecordedTrajectory(
                uid=h["uid"],
                group_id=h["group_id"],
                task_id=h["task_id"],
                prompt_ids=prompt,
                segments=segs,
                reward=h["reward"],
                finish_reason=h["finish_reason"],
                masked=h["masked"],
                turns=[TurnInfo(**x) for x in h["turns"]],
                baseline=h["baseline"],
                advantage=h["advantage"],
                seq_log_weight=h["seq_log_weight"],
            )
        )
    return StepRecord(summary, out)


# -- reading ---------------------------------------------------------------------------------------


def read_meta(run_dir: Path) -> LogMeta:
    path = Path(run_dir) / DIR / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {run_dir} has no trajectory log (train with logging.trajectories > 0)"
        )
    return LogMeta(**json.loads(path.read_text()))


def read_index(run_dir: Path) -> list[StepSummary]:
    """Every recorded step, in order (a torn last line from a killed run is skipped)."""
    path = Path(run_dir) / DIR / "index.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {run_dir} has no trajectory log (train with logging.trajectories > 0)"
        )
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(StepSummary(**json.loads(line)))
        except json.JSONDecodeError:
            break
    return out


def read_step(run_dir: Path, step: int, index: Sequence[StepSummary] | None = None) -> StepRecord:
    """The record of one step: one seek and one read in data.bin."""
    index = read_index(run_dir) if index is None else index
    found = [s for s in index if s.step == step]
    if not found:
        have = f"{index[0].step}..{index[-1].step}" if index else "none"
        raise KeyError(f"{Path(run_dir) / DIR}: no record of step {step} (recorded steps: {have})")
    s = found[-1]
    with open(Path(run_dir) / DIR / "data.bin", "rb") as f:
        f.seek(s.offset)
        blob = f.read(s.length)
    return decode_step(s, blob)
