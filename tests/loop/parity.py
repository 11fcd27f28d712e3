"""Two ways of producing a training step compared on what is defined up to float rounding: the batch (token
ids, segments, versions, rewards, masks exactly; behaviour log-probs to float32 rounding) and what the learner
computed from it (current log-probs, sequence log-weights, baselines, advantages: the coefficients of the
policy gradient, which with equal token ids and equal start weights fix the update).

Not the weights after the step: Adam's first update is lr·g/(|g| + eps) per element, so an element whose
gradient is near zero moves by up to ±lr under any rounding difference in g (other kernels, another CPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from float_bounds import EPS32, TINY_LOGPROB_ATOL

from agent_rl.learners.api import TrainedRow
from agent_rl.types import Trajectory
from agent_rl.viewer.log import RecordedTrajectory, read_step


@dataclass(frozen=True)
class Seen:
    """One trained trajectory as the comparison sees it."""

    uid: str
    tokens: tuple[tuple[int, ...], ...]  # prompt, then each segment's ids
    sampled: tuple[bool, ...]
    versions: tuple[tuple[int, ...], ...]
    reward: float | None
    finish: str | None
    masked: bool
    behaviour: tuple[float, ...]  # log μ of every sampled token, in order
    current: tuple[float, ...] | None = None  # the learner's log π of the same tokens
    seq_log_weight: float | None = None
    baseline: float | None = None
    advantage: float | None = None

    @property
    def trained_tokens(self) -> int:
        return 0 if self.masked else len(self.behaviour)

    @staticmethod
    def recorded(t: RecordedTrajectory) -> Seen:
        segs = t.segments
        return Seen(
            t.uid,
            (tuple(t.prompt_ids), *(tuple(s.token_ids) for s in segs)),
            tuple(s.sampled for s in segs),
            tuple(tuple(s.versions) for s in segs),
            t.reward,
            t.finish_reason,
            t.masked,
            tuple(x for s in segs for x in s.behavior_logprobs),
            tuple(x for s in segs for x in s.current_logprobs)
            if all(s.current_logprobs for s in segs if s.sampled)
            else None,
            t.seq_log_weight,
            t.baseline,
            t.advantage,
        )

    @staticmethod
    def trajectory(t: Trajectory, row: TrainedRow | None = None) -> Seen:
        segs = t.segments
        current = None
        if row is not None:
            lp, pos, current = row.logprobs.float().tolist(), len(t.prompt_ids), []
            for s in segs:
                if s.sampled:
                    current += lp[pos : pos + len(s.token_ids)]
                pos += len(s.token_ids)
        return Seen(
            t.uid,
            (tuple(t.prompt_ids), *(s.token_ids for s in segs)),
            tuple(s.sampled for s in segs),
            tuple(s.versions or () for s in segs),
            t.reward,
            None if t.finish_reason is None else str(t.finish_reason),
            t.masked,
            tuple(float(x) for s in segs for x in s.logprobs or ()),
            None if current is None else tuple(current),
            None if row is None else row.seq_log_weight,
            None if row is None else row.baseline,
            None if row is None else row.advantage,
        )


def recorded_step(run_dir: Path, step: int = 0) -> dict[str, Seen]:
    """What a run trained on at `step`, from its trajectory log (needs `logging.trajectories=all`)."""
    return {t.uid: Seen.recorded(t) for t in read_step(run_dir, step).trajectories}


def seen(trajectories: Iterable[Trajectory], rows: Mapping[str, TrainedRow] | None = None) -> dict[str, Seen]:
    return {t.uid: Seen.trajectory(t, None if rows is None else rows[t.uid]) for t in trajectories}


def assert_same_step(a: Mapping[str, Seen], b: Mapping[str, Seen], *, learner: bool = True) -> None:
    """The same batch, and (learner=True) the same learner results, up to float rounding."""
    assert sorted(a) == sorted(b), "the same trajectories (uids)"
    for uid in a:
        x, y = a[uid], b[uid]
        assert (x.tokens, x.sampled, x.versions) == (y.tokens, y.sampled, y.versions), f"{uid}: tokens differ"
        assert (x.reward, x.finish, x.masked) == (y.reward, y.finish, y.masked), f"{uid}: outcome differs"
        # Behaviour log-probs: the engine's float32 forward of the same tokens under the same weights, in
        # other batches (float_bounds.TINY_LOGPROB_ATOL).
        mu = _max_diff(x.behaviour, y.behaviour)
        assert mu <= TINY_LOGPROB_ATOL, f"{uid}: behaviour log-probs differ by {mu:.3g}"
        if not learner:
            continue
        assert x.current is not None and y.current is not None, f"{uid}: no learner log-probs recorded"
        pi = _max_diff(x.current, y.current)
        assert pi <= TINY_LOGPROB_ATOL, f"{uid}: the learner's log-probs differ by {pi:.3g}"
        # s = Σ_t (log π_t − log μ_t) over the n trained tokens: each term moves by at most pi + mu, and the
        # float32 sum itself by n·u per unit of Σ|terms| (Higham's worst case: n is small here).
        n = x.trained_tokens
        terms = sum(abs(p - m) for p, m in zip(x.current, x.behaviour, strict=True)) if n else 0.0
        ds = n * (pi + mu) + n * EPS32 * terms
        assert abs(x.seq_log_weight - y.seq_log_weight) <= ds + 1e-12, (
            f"{uid}: sequence log-weights {x.seq_log_weight} vs {y.seq_log_weight} (bound {ds:.3g})"
        )
        # OPOB: the baseline is a weighted mean of the group's rewards (weights ∝ w²·‖g‖², w = exp(s)), and the
        # advantage is reward − baseline. A relative change r of every weight moves a weighted mean by at most
        # 2r·(max reward − min reward); r = 2·ds (w² = exp(2s)) plus the float32 rounding of the squared
        # gradient norms (each sums ~1e5 squares: √n·u ≈ 2e-5 relative; 1e-4 covers it).
        group = [u for u in a if a[u].uid.rsplit("/", 1)[0] == uid.rsplit("/", 1)[0]]
        rewards = [a[u].reward or 0.0 for u in group]
        r = 2 * max(abs(a[u].seq_log_weight - b[u].seq_log_weight) for u in group) + 1e-4
        db = 2 * r * (max(rewards) - min(rewards)) + 4 * EPS32 * max(map(abs, rewards))
        assert abs(x.baseline - y.baseline) <= db, (
            f"{uid}: baselines {x.baseline} vs {y.baseline} (bound {db:.3g})"
        )
        assert abs(x.advantage - y.advantage) <= db, (
            f"{uid}: advantages {x.advantage} vs {y.advantage} (bound {db:.3g})"
        )


def _max_diff(x: tuple[float, ...], y: tuple[float, ...]) -> float:
    assert len(x) == len(y)
    return max((abs(p - q) for p, q in zip(x, y, strict=True)), default=0.0)
