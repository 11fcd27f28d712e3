"""The token-level trajectory: the one data model shared by rollout, buffer and learner.

A trajectory is prompt ids followed by segments. A *sampled* segment holds tokens the
policy produced, with the behaviour log-prob and the policy version of every token; an
*env* segment holds tool output or template glue (loss mask 0). Text is never
re-tokenized: what the engine sampled is what the learner trains on.

Imports neither torch nor Ray (see agent_rl/batch.py for tensors).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from array import array
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Literal, get_args


class FinishReason(StrEnum):
    """Why an episode (or the last turn of a partial one) stopped."""

    ANSWER = "answer"  # a final answer (\\boxed{}) was given
    VOID = "void"  # a turn with neither code nor answer; the trajectory is masked
    MAX_TURNS = "max_turns"
    LENGTH = "length"  # response token budget or context exhausted
    ABORT = "abort"  # interrupted by a weight update; a continuation is expected
    # the infrastructure failed after retries (`Trajectory.infra_cause` says how): left out of its group, never 0
    INFRA_FAILED = "infra_failed"
    ERROR = "infra_failed"  # the former name of INFRA_FAILED (an alias)

    @classmethod
    def _missing_(cls, value: object) -> FinishReason | None:
        return cls.INFRA_FAILED if value == "error" else None  # read by trajectories saved before the rename


InfraCause = Literal[
    "container_start",  # a container or sandbox that failed to start
    "sandbox_killed",  # a sandbox or container killed (or lost) mid-episode
    "verifier_timeout",  # the reward's verifier ran past its time limit
    "no_reward",  # the episode ended but its verifier wrote no reward
    "bad_reward",  # the reward it wrote is not a finite number
    "harness_crash",  # the agent or harness raised or exited without finishing
    "harness_timeout",  # the agent or harness did not finish in its time limit
    "engine",  # the inference engine failed after its retries
    "other",  # any other error of env.step / the env's verifier
]
"""Why an episode failed in the infrastructure (the same strings as envs.types.INFRA_CAUSES)."""
INFRA_CAUSES: tuple[str, ...] = get_args(InfraCause)


class TrajectoryError(ValueError):
    """A trajectory violates an invariant (lengths, NaN log-probs, bad versions)."""


@dataclass(frozen=True)
class Segment:
    """A run of tokens that are either all model-sampled or all environment tokens."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None  # behaviour log μ per token; sampled only
    versions: tuple[int, ...] | None = None  # policy version per token; sampled only

    @property
    def sampled(self) -> bool:
        return self.logprobs is not None

    def check(self, where: str) -> None:
        n = len(self.token_ids)
        if self.logprobs is None:
            if self.versions is not None:
                raise TrajectoryError(
                    f"{where}: env segment carries versions; only sampled tokens have versions"
                )
            return
        if self.versions is None:
            raise TrajectoryError(f"{where}: sampled segment has logprobs but no versions")
        if len(self.logprobs) != n or len(self.versions) != n:
            raise TrajectoryError(
                f"{where}: {n} token ids but {len(self.logprobs)} logprobs and {len(self.versions)} versions"
            )
        for i, lp in enumerate(self.logprobs):
            if math.isnan(lp) or lp > 1e-4:
                raise TrajectoryError(
                    f"{where}: token {i} (id {self.token_ids[i]}) has log-prob {lp}; must be <= 0"
                )
        if any(v < 0 for v in self.versions):
            raise TrajectoryError(f"{where}: negative policy version in {sorted(set(self.versions))}")


@dataclass(frozen=True)
class RoutedExperts:
    """Mixture-of-Experts routing of a token sequence, as an engine recorded it: row i holds, for the token at
    position i (fed as input), the ids of the experts the router chose in every decoder layer: `width` =
    layers x top_k ids, layer-major, -1 on layers without experts (SGLang's `return_routed_experts`
    layout). Rows cover positions 0..positions-1: the last sampled token is never fed, so one call reports
    prompt + output - 1 rows. The learner splits a row by its model's layers and top_k."""

    width: int
    ids: array  # typecode "h" (int16): positions x width, row-major

    def __post_init__(self) -> None:
        if self.ids.typecode != "h":
            raise TrajectoryError(
                f"routed experts must be an int16 array ('h'), got typecode {self.ids.typecode!r}"
            )
        if self.width < 1 or len(self.ids) % self.width:
            raise TrajectoryError(f"routed experts: {len(self.ids)} ids are not whole rows of {self.width}")

    @classmethod
    def from_ints(cls, values, width: int) -> RoutedExperts:
        """From any flat sequence of ints (e.g. a decoded SGLang payload); ids must fit int16."""
        try:
            return cls(width, array("h", values))
        except OverflowError:
            raise TrajectoryError(
                "routed experts: an expert id does not fit int16 (>= 32768 experts?)"
            ) from None

    @property
    def positions(self) -> int:
        return len(self.ids) // self.width

    def then(self, newer: RoutedExperts) -> RoutedExperts:
        """This record followed by a later call's of the same sequence: every position keeps the routing of the
        first call that fed it (the turn that sampled it, or, for a turn's last token and the tool output after
        it, the next turn's prefill); `newer` adds only the positions past this record. A later call re-routes
        earlier positions (a prefill after a weight update, a near-tie), but the tokens of a turn were sampled
        under that turn's routing, which is what replay must give them (issue 61: routes on the right turn)."""
        if newer.width != self.width:
            raise TrajectoryError(
                f"routed experts of {newer.width} ids per position after {self.width}: "
                "the calls of one episode came from different models"
            )
        if newer.positions <= self.positions:
            return self
        return RoutedExperts(self.width, self.ids + newer.ids[self.positions * self.width :])


@dataclass(frozen=True)
class TurnInfo:
    """What happened in one turn: for metrics, never read by the learner."""

    sampled_tokens: int
    env_tokens: int = 0
    code_ran: bool = False
    exit_code: int | None = None
    timed_out: bool = False
    gen_seconds: float = 0.0
    tool_seconds: float = 0.0
    aborts: int = 0  # how many times a weight update interrupted this turn


@dataclass(frozen=True)
class FlatTrajectory:
    """Per-token learner view: four equal-length lists."""

    input_ids: list[int]
    loss_mask: list[int]
    behavior_logprobs: list[float]  # 0.0 where loss_mask == 0
    versions: list[int]  # -1 where loss_mask == 0
    teacher_logprobs: list[float] | None = None  # log π_T of sampled tokens, 0.0 elsewhere; None: not scored


@dataclass
class Trajectory:
    """One episode (possibly unfinished). Extend it only through append_sampled/append_env."""

    uid: str
    group_id: str  # the prompt this sample belongs to; n samples share it
    prompt_ids: list[int]
    task_id: str = ""  # data-set row the prompt came from (checkpoint cursor, eval)
    segments: list[Segment] = field(default_factory=list)
    reward: float | None = None
    finish_reason: FinishReason | None = None
    masked: bool = False  # void turn etc.: loss mask 0 everywhere, reward still counts in the group
    infra_cause: InfraCause | None = None  # set with finish_reason INFRA_FAILED: what failed
    turns: list[TurnInfo] = field(default_factory=list)
    extras: dict[str, float] = field(default_factory=dict)  # logging only
    routed_experts: RoutedExperts | None = None  # MoE: the engine's routing of positions 0..n-1 (n <= len)
    teacher_logprobs: list[float] | None = (
        None  # on-policy distillation: log π_T of each sampled token, in order
    )

    def set_teacher_logprobs(self, values: list[float]) -> None:
        """The teacher's log-prob of every sampled token (agent_rl/teacher), in order; checked like behaviour's."""
        if len(values) != self.num_sampled:
            raise TrajectoryError(
                f"trajectory {self.uid}: {len(values)} teacher log-probs for {self.num_sampled} sampled tokens"
            )
        for i, lp in enumerate(values):
            if not (math.isfinite(lp) and lp <= 1e-4):
                raise TrajectoryError(
                    f"trajectory {self.uid}: sampled token {i} has teacher log-prob {lp}; must be finite and <= 0"
                )
        self.teacher_logprobs = [float(x) for x in values]

    # -- building ---------------------------------------------------------------------
    def append_sampled(self, token_ids: list[int], logprobs: list[float], versions: list[int] | int) -> None:
        """Append model tokens; a scalar version applies to every token."""
        if isinstance(versions, int):
            versions = [versions] * len(token_ids)
        seg = Segment(tuple(token_ids), tuple(float(x) for x in logprobs), tuple(versions))
        seg.check(f"trajectory {self.uid} segment {len(self.segments)}")
        if seg.token_ids:
            self.segments.append(seg)

    def set_routed_experts(self, routes: RoutedExperts | None) -> None:
        """Add an engine call's routing record (its prompt extends the previous call's): positions already
        recorded keep the routing of the call that first fed them, the new ones come from this call
        (`RoutedExperts.then`), so each turn's tokens are replayed with that turn's routing. A missing record
        leaves the kept one."""
        if routes is None:
            return
        if routes.positions > len(self):
            raise TrajectoryError(
                f"trajectory {self.uid}: routed experts for {routes.positions} positions, but it has {len(self)} tokens"
            )
        try:
            self.routed_experts = routes if self.routed_experts is None else self.routed_experts.then(routes)
        except TrajectoryError as e:
            raise TrajectoryError(f"trajectory {self.uid}: {e}") from None

    def append_env(self, token_ids: list[int]) -> None:
        """Append environment tokens (tool output, template glue): loss mask 0."""
        if token_ids:
            self.segments.append(Segment(tuple(token_ids)))

    # -- views --------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.finish_reason is not None and self.finish_reason != FinishReason.ABORT

    @property
    def infra_failed(self) -> bool:
        """Failed in the infrastructure after retries: left out of its group's statistics and the loss."""
        return self.finish_reason == FinishReason.INFRA_FAILED

    @property
    def response_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def num_sampled(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.sampled)

    def __len__(self) -> int:
        return len(self.prompt_ids) + sum(len(s.token_ids) for s in self.segments)

    @property
    def min_version(self) -> int | None:
        """Oldest policy version among sampled tokens (None if nothing was sampled)."""
        vs = [min(s.versions) for s in self.segments if s.versions]
        return min(vs) if vs else None

    @property
    def max_version(self) -> int | None:
        vs = [max(s.versions) for s in self.segments if s.versions]
        return max(vs) if vs else None

    def staleness(self, learner_version: int) -> int:
        """learner version - oldest sampled version (0 for a trajectory with no sampled tokens)."""
        mv = self.min_version
        return 0 if mv is None else learner_version - mv

    def flatten(self) -> FlatTrajectory:
        teacher = None if self.teacher_logprobs is None else iter(self.teacher_logprobs)
        tlps: list[float] = []
        ids, mask, lps, vers = (
            list(self.prompt_ids),
            [0] * len(self.prompt_ids),
            [0.0] * len(self.prompt_ids),
            [-1] * len(self.prompt_ids),
        )
        train = 0 if self.masked else 1
        for s in self.segments:
            n = len(s.token_ids)
            ids.extend(s.token_ids)
            if s.sampled:
                assert s.logprobs is not None and s.versions is not None
                mask.extend([train] * n)
                lps.extend(s.logprobs)
                vers.extend(s.versions)
                if teacher is not None:
                    tlps.extend(next(teacher) for _ in range(n))
            else:
                mask.extend([0] * n)
                lps.extend([0.0] * n)
                vers.extend([-1] * n)
                tlps.extend([0.0] * n)
        if teacher is None:
            return FlatTrajectory(ids, mask, lps, vers)
        return FlatTrajectory(ids, mask, lps, vers, [0.0] * len(self.prompt_ids) + tlps)

    def validate(self) -> None:
        """Raise TrajectoryError naming the first broken invariant."""
        for i, s in enumerate(self.segments):
            s.check(f"trajectory {self.uid} segment {i}")
        if self.reward is not None and not math.isfinite(self.reward):
            raise TrajectoryError(f"trajectory {self.uid}: reward is {self.reward}; rewards must be finite")
        if self.teacher_logprobs is not None:
            self.set_teacher_logprobs(self.teacher_logprobs)

    # -- serialisation ------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Compact, versioned encoding: JSON header + packed int32 ids/versions + float64 logprobs, zlib'd."""
        header = {
            "uid": self.uid,
            "group_id": self.group_id,
            "task_id": self.task_id,
            "reward": self.reward,
            "finish_reason": None if self.finish_reason is None else str(self.finish_reason),
            "masked": self.masked,
            **({"infra_cause": self.infra_cause} if self.infra_cause is not None else {}),
            "turns": [asdict(t) for t in self.turns],
            "extras": self.extras,
            "n_prompt": len(self.prompt_ids),
            "segments": [[len(s.token_ids), s.sampled] for s in self.segments],
        }
        routes = self.routed_experts
        if routes is not None:  # int16 rows after the float array
            header["routes"] = [routes.positions, routes.width]
        if self.teacher_logprobs is not None:  # after the behaviour log-probs in the float array
            header["n_teacher"] = len(self.teacher_logprobs)
        ints = array("i", self.prompt_ids)
        floats = array("d")
        for s in self.segments:
            ints.extend(s.token_ids)
            if s.sampled:
                assert s.logprobs is not None and s.versions is not None
                ints.extend(s.versions)
                floats.extend(s.logprobs)
        floats.extend(self.teacher_logprobs or ())
        hb = json.dumps(header, separators=(",", ":")).encode()
        body = struct.pack("<III", len(hb), len(ints), len(floats)) + hb + ints.tobytes() + floats.tobytes()
        if routes is not None:
            body += routes.ids.tobytes()
        return _MAGIC + struct.pack("<H", _FORMAT_VERSION) + zlib.compress(body, 1)

    @classmethod
    def from_bytes(cls, data: bytes) -> Trajectory:
        if data[:4] != _MAGIC:
            raise TrajectoryError(
                f"not a serialised trajectory (first bytes {data[:4]!r}, expected {_MAGIC!r})"
            )
        (fmt,) = struct.unpack("<H", data[4:6])
        if fmt != _FORMAT_VERSION:
            raise TrajectoryError(
                f"trajectory format version {fmt}; this agent-rl reads version {_FORMAT_VERSION}"
            )
        body = zlib.decompress(data[6:])
        nh, ni, nf = struct.unpack("<III", body[:12])
        header = json.loads(body[12 : 12 + nh])
        ints = array("i")
        ints.frombytes(body[12 + nh : 12 + nh + 4 * ni])
        floats = array("d")
        end = 12 + nh + 4 * ni + 8 * nf
        floats.frombytes(body[12 + nh + 4 * ni : end])
        ip, fp = header["n_prompt"], 0
        traj = cls(
            uid=header["uid"],
            group_id=header["group_id"],
            prompt_ids=ints[:ip].tolist(),
            task_id=header["task_id"],
            reward=header["reward"],
            finish_reason=None if header["finish_reason"] is None else FinishReason(header["finish_reason"]),
            masked=header["masked"],
            infra_cause=header.get("infra_cause"),
            turns=[TurnInfo(**t) for t in header["turns"]],
            extras=header["extras"],
        )
        for n, sampled in header["segments"]:
            ids = tuple(ints[ip : ip + n])
            ip += n
            if sampled:
                versions = tuple(ints[ip : ip + n])
                ip += n
                traj.segments.append(Segment(ids, tuple(floats[fp : fp + n]), versions))
                fp += n
            else:
                traj.segments.append(Segment(ids))
        if (shape := header.get("routes")) is not None:
            rows, width = shape
            ids = array("h")
            ids.frombytes(body[end : end + 2 * rows * width])
            traj.set_routed_experts(RoutedExperts(width, ids))
        if (nt := header.get("n_teacher")) is not None:
            traj.teacher_logprobs = floats[fp : fp + nt].tolist()
        traj.validate()
        return traj


_MAGIC = b"ARLT"
_FORMAT_VERSION = 1


@dataclass
class Group:
    """The n trajectories sampled for one prompt; delivered to the learner whole.

    `trajectories` are the members the learner sees: their rewards make the group's baseline and advantages,
    and their importance weights the batch's ESS. Members that failed in the infrastructure are `left_out`
    (kept for counting, never collated): see `Group.of`."""

    group_id: str
    trajectories: list[Trajectory]
    left_out: list[Trajectory] = field(default_factory=list)  # infra-failed members (Trajectory.infra_failed)

    @classmethod
    def of(cls, group_id: str, members: list[Trajectory]) -> Group | None:
        """The group of a prompt's finished members, infra-failed ones left out: the survivors' baseline,
        advantages, OPOB and ESS are those of a group sampled without the failed ones (a failed member is not
        scored 0). None when every member failed: nothing to train on, the prompt must be sampled again."""
        kept = [t for t in members if not t.infra_failed]
        return cls(group_id, kept, [t for t in members if t.infra_failed]) if kept else None

    @property
    def size(self) -> int:
        """Members sampled, the left-out ones included."""
        return len(self.trajectories) + len(self.left_out)

    @property
    def rewards(self) -> list[float]:
        return [0.0 if t.reward is None else t.reward for t in self.trajectories]

    @property
    def min_version(self) -> int | None:
        vs = [v for t in self.trajectories if (v := t.min_version) is not None]
        return min(vs) if vs else None
