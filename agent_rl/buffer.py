"""The partial-rollout buffer: where asynchrony lives.

Rollout workers open a group per prompt, grow its n trajectories in place (they stay
visible here while half-finished, so a checkpoint holds them), and report each one
finished. The learner takes whole groups. Three rules keep the learner's data sound:

- staleness bound k: a group whose oldest sampled token is more than k versions behind
  the learner is never delivered; it is dropped and its prompt recycled (sampled again). This
  is checked wherever a group is: in flight (doomed, its workers stop), finished and waiting to
  be taken (every new version or bound; counted apart as `dropped_stale_waiting`), and on load;
- no starving long episodes (`wait_for_due`): a group whose oldest token is k versions
  behind is due: the next step is its last chance, so the learner waits for it and trains
  it first rather than stepping past it (which would drop it, and always the longest ones);
- admission control: a prompt is started only while fewer than (lag + 1) * B groups are
  open, ready or in the learner's current step, i.e. only if it will be trained within
  lag + 1 steps and so within the bound, so drops stay rare. This is AReaL's rule
  (started <= (version + lag + 1) * B) counted in learner steps rather than versions, so a
  step the learner skips (version unchanged) cannot use up the budget and starve it;
- every group ends exactly once: delivered, or dropped with a counted reason;
- infrastructure failures are not rewards: members that failed in the infrastructure (INFRA_FAILED, after the
  rollout side's retries) are left out of their group when it forms (`Group.of`), so the learner's baseline,
  advantages, OPOB and ESS are those of the survivors; a group whose members all failed is dropped and its
  prompt sampled again; a batch with more than `max_infra_failed_fraction` of failures stops the run.

It lives on the rollout event loop; all methods are called from that loop's thread.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agent_rl.config import BufferConfig
from agent_rl.failures import InfraFailureRate, batch_failure_share
from agent_rl.types import FinishReason, Group, Trajectory

DROP_REASONS = ("stale", "uniform", "error")


@dataclass
class _OpenGroup:
    group_id: str
    task_id: str
    seq: int
    members: list[Trajectory | None]  # None: not started yet
    reported: set[int] = field(default_factory=set)  # member indices finished or abandoned
    doomed: bool = False  # already over the bound: workers should stop sampling it
    forks: list[Trajectory] = field(default_factory=list)  # agent episodes split into more trajectories

    def min_version(self) -> int | None:
        vs = [v for t in (*self.members, *self.forks) if t is not None and (v := t.min_version) is not None]
        return min(vs) if vs else None


@dataclass
class BufferCounters:
    admitted: int = 0
    delivered_groups: int = 0
    delivered_trajectories: int = 0
    dropped_stale: int = 0
    dropped_uniform: int = 0
    dropped_error: int = 0  # groups whose members all failed in the infrastructure
    infra_left_out: int = 0  # infra-failed members left out of delivered groups (the others trained)
    recycled: int = 0
    masked_void: int = 0
    partial_trajectories: int = 0  # delivered trajectories sampled by more than one version
    # tokens sampled for groups that were dropped (thrown away; their prompts are sampled again)
    dropped_sampled_tokens: int = 0
    # of dropped_stale: whole groups that finished within the bound and went over it while they waited to be
    # taken (the learner busy, or the version moving by more than one: a rollback publishes a new version)
    dropped_stale_waiting: int = 0


class BufferClosed(RuntimeError):
    """The rollout side failed; the learner must not wait for a batch that will never come."""


class BufferStalled(RuntimeError):
    """The learner waited `buffer.stall_timeout_s` and no trajectory finished."""


class RolloutBuffer:
    """Groups in flight and ready, under a staleness bound; see the module docstring."""

    def __init__(
        self,
        cfg: BufferConfig,
        *,
        batch_prompts: int,
        group_size: int,
        version: int = 0,
        admit_lag: int | None = None,
    ):
        self.cfg = cfg
        self.k = cfg.max_staleness
        self.batch_prompts = batch_prompts
        self.group_size = group_size
        self.admit_lag = self.k if admit_lag is None else admit_lag
        self.version = version
        self.counters = BufferCounters()
        self.recycled: deque[str] = deque()  # task ids whose group was dropped and must be sampled again
        self._open: dict[str, _OpenGroup] = {}
        self._ready: dict[str, Group] = {}  # insertion order = admission order
        self._ready_seq: dict[str, int] = {}
        self._seq = 0
        self._in_step = 0  # groups taken since the last set_version: the learner is training on them
        self._failure: BaseException | None = None
        self._failed_since_take: list[Trajectory] = []  # members of all-failed groups dropped since a take
        self.last_infra_share = 0.0  # share of the last batch's episodes that failed in the infrastructure
        self._wake = asyncio.Event()
        self.last_staleness: list[int] = []

    # -- admission ----------------------------------------------------------------------
    def can_admit(self) -> bool:
        pending = len(self._open) + len(self._ready) + self._in_step
        if pending >= (self.admit_lag + 1) * self.batch_prompts:
            return False
        cap = self.cfg.max_inflight_prompts
        return cap is None or len(self._open) < cap

    def try_admit(self, task_id: str) -> str | None:
        """Open a group for `task_id` if admission allows; return its id."""
        if not self.can_admit():
            return None
        group_id = f"g{self._seq}"
        self._open[group_id] = _OpenGroup(group_id, task_id, self._seq, [None] * self.group_size)
        self._seq += 1
        self.counters.admitted += 1
        return group_id

    async def admit(self, next_task: Callable[[], str]) -> str:
        """Wait for an admission slot, then open a group for `next_task()`.

        The task is drawn only once the slot is there (no await in between), so a checkpoint
        never sees a prompt that left the data-set cursor without entering the buffer."""
        while not self.can_admit():
            await self.changed()
        gid = self.try_admit(next_task())
        assert gid is not None
        return gid

    # -- members ------------------------------------------------------------------------
    def start(self, group_id: str, index: int, prompt_ids: list[int]) -> Trajectory:
        """Create member `index` of an open group; the worker grows it in place."""
        g = self._open[group_id]
        if g.members[index] is not None:
            raise ValueError(f"{group_id} member {index} already started")
        traj = Trajectory(
            uid=f"{group_id}/{index}", group_id=group_id, prompt_ids=list(prompt_ids), task_id=g.task_id
        )
        g.members[index] = traj
        return traj

    def fork(self, member: Trajectory, n: int) -> Trajectory:
        """One more trajectory of `member`'s episode (an agent episode that split, gateway/assemble.py); it is
        delivered with the group and shares the member's reward."""
        g = self._open[member.group_id]
        traj = Trajectory(uid=f"{member.uid}.{n}", group_id=g.group_id, prompt_ids=[], task_id=g.task_id)
        g.forks.append(traj)
        return traj

    def drop_forks(self, member: Trajectory) -> None:
        """Forget `member`'s forks (its episode restarts)."""
        g = self._open[member.group_id]
        g.forks = [f for f in g.forks if not f.uid.startswith(member.uid + ".")]

    def update(self, traj: Trajectory) -> None:
        """A worker changed `traj` (nothing to do here: the buffer holds the object itself; a rollout process
        reports its copy's changes to the driver at this point, rollout/shard.py)."""

    def open_task(self, group_id: str) -> str:
        return self._open[group_id].task_id

    def doomed(self, group_id: str) -> bool:
        """True once the group can no longer be delivered (over the bound): stop sampling it."""
        g = self._open.get(group_id)
        return g is None or g.doomed or self._over_bound(g.min_version())

    def finish(self, traj: Trajectory) -> None:
        """Report a member done (any finish reason, ERROR included)."""
        if not traj.done:
            raise ValueError(f"{traj.uid}: finish() needs a final finish_reason, got {traj.finish_reason}")
        self._report(traj)

    def abandon(self, traj: Trajectory) -> None:
        """Report a member of a doomed group that stopped early; the group will be dropped as stale."""
        self._open[traj.group_id].doomed = True
        self._report(traj)

    def _report(self, traj: Trajectory) -> None:
        g = self._open[traj.group_id]
        index = int(traj.uid.rsplit("/", 1)[1])
        if g.members[index] is not traj or index in g.reported:
            raise ValueError(f"{traj.uid} is not an unreported member of open group {g.group_id}")
        g.reported.add(index)
        if len(g.reported) == self.group_size:
            self._resolve(g)
        self._notify()

    def _resolve(self, g: _OpenGroup) -> None:
        del self._open[g.group_id]
        members = [t for t in g.members if t is not None] + g.forks
        sampled = sum(t.num_sampled for t in members)
        group = Group.of(g.group_id, members)  # infra-failed members left out: vcpo never sees them
        if group is None:  # all failed: nothing to train on
            self.counters.dropped_sampled_tokens += sampled
            self._drop(g.group_id, g.task_id, "error")
            self._failed_since_take += members
            # stop now if even a next batch without failures could not bring the share under the bound
            full = self.batch_prompts * self.group_size
            try:
                batch_failure_share(full, self._failed_since_take, self._max_infra)
            except InfraFailureRate as e:
                self.fail(e)
        elif g.doomed or self._over_bound(g.min_version()):
            self.counters.dropped_sampled_tokens += sampled
            self._drop(g.group_id, g.task_id, "stale")
        elif self.cfg.drop_uniform_groups and len(set(group.rewards)) == 1:
            self._drop(g.group_id, g.task_id, "uniform")
        else:
            self._ready[g.group_id] = group
            self._ready_seq[g.group_id] = g.seq

    def _drop(self, group_id: str, task_id: str, reason: str) -> None:
        setattr(self.counters, f"dropped_{reason}", getattr(self.counters, f"dropped_{reason}") + 1)
        if reason != "uniform":  # a filtered group used its prompt; stale/error ones must be sampled again
            self.recycled.append(task_id)
            self.counters.recycled += 1

    @property
    def _max_infra(self) -> float:
        return self.cfg.max_infra_failed_fraction

    def _over_bound(self, min_version: int | None) -> bool:
        return min_version is not None and self.version - min_version > self.k

    # -- versions and batches -----------------------------------------------------------
    def set_version(self, version: int) -> None:
        """The learner finished a step (skipped or not) and it and the engines are at `version`:
        drop what can no longer be used, and open admission for the next batch."""
        self.version = version
        self._in_step = 0
        self._enforce_bound()

    def set_bound(self, k: int) -> None:
        """Change the staleness bound in force (monitor.on_warning: adapt_staleness); admission follows it.
        Ready groups now over it are dropped and open ones doomed at once, so none is ever delivered."""
        if k < 0:
            raise ValueError(f"staleness bound must be >= 0, got {k}")
        self.k = self.admit_lag = k
        self._enforce_bound()

    def _enforce_bound(self) -> None:
        for gid in [gid for gid, grp in self._ready.items() if self._over_bound(grp.min_version)]:
            grp = self._ready.pop(gid)
            del self._ready_seq[gid]
            self.counters.dropped_sampled_tokens += sum(t.num_sampled for t in grp.trajectories)
            self.counters.dropped_stale_waiting += 1
            self._drop(gid, grp.trajectories[0].task_id, "stale")
        for g in self._open.values():
            g.doomed = g.doomed or self._over_bound(g.min_version())
        self._notify()

    def _due(self, min_version: int | None) -> bool:
        """Trained by the learner's next step or never (that step takes it over the bound)."""
        return min_version is not None and self.version - min_version >= self.k

    def _must_wait(self, batch: list[str], rest: list[str], n: int) -> bool:
        """Earliest-deadline-first: a group sampled first at version m must be trained by version m + k. Wait
        for an in-flight group if it is due now, or if it is older than a group in `batch` and the groups left
        over (ready and in flight, oldest first, n per later step) could not all be trained in time: stepping
        now would leave more due groups for a later step than it can take (they would be dropped)."""
        flying = [mv for g in self._open.values() if not g.doomed and (mv := g.min_version()) is not None]
        if any(self._due(mv) for mv in flying):
            return True
        newest = max(_oldest(self._ready[gid].min_version) for gid in batch)
        if not any(mv < newest for mv in flying):
            return False
        left = sorted([mv for gid in rest if (mv := self._ready[gid].min_version) is not None] + flying)
        return any(mv + self.k < self.version + 1 + i // n for i, mv in enumerate(left))

    def try_take(self, n_groups: int) -> list[Group] | None:
        """The n ready groups with the oldest first tokens (earliest deadline); None if fewer are ready, or
        (wait_for_due) while an in-flight group must be in this batch to be trained in time."""
        if isinstance(self._failure, InfraFailureRate):
            raise self._failure  # one line for the user, not a traceback
        if self._failure is not None:
            raise BufferClosed(f"rollouts failed: {self._failure!r}") from self._failure
        if len(self._ready) < n_groups:
            return None
        ids = sorted(
            self._ready, key=lambda gid: (_oldest(self._ready[gid].min_version), self._ready_seq[gid])
        )
        if self.cfg.wait_for_due and self._must_wait(ids[:n_groups], ids[n_groups:], n_groups):
            return None
        ids = ids[:n_groups]
        chosen = [self._ready[gid] for gid in ids]
        failed = [t for grp in chosen for t in grp.left_out] + self._failed_since_take
        self.last_infra_share = batch_failure_share(  # raises: the batch is mostly infrastructure failures
            sum(len(grp.trajectories) for grp in chosen), failed, self._max_infra
        )
        self._failed_since_take = []
        batch = [self._ready.pop(gid) for gid in ids]
        for gid in ids:
            del self._ready_seq[gid]
        self._in_step += len(batch)
        self.last_staleness = []
        for grp in batch:
            self.counters.delivered_groups += 1
            self.counters.infra_left_out += len(grp.left_out)
            for t in grp.trajectories:
                self.counters.delivered_trajectories += 1
                self.last_staleness.append(t.staleness(self.version))
                if t.finish_reason == FinishReason.VOID:
                    t.masked = self.cfg.mask_void
                    self.counters.masked_void += int(t.masked)
                if t.min_version is not None and t.min_version != t.max_version:
                    self.counters.partial_trajectories += 1
        self._notify()
        return batch

    async def take(self, n_groups: int) -> list[Group]:
        """Wait for n whole groups within the bound (k=0: all sampled by the current version).

        Raises BufferStalled after `stall_timeout_s` without a finished trajectory."""
        while (batch := self.try_take(n_groups)) is None:
            wake = (
                self._wake
            )  # taken now: wait_for runs its awaitable as a task, a notify could slip in between
            try:
                await asyncio.wait_for(wake.wait(), self.cfg.stall_timeout_s)
            except TimeoutError:
                raise BufferStalled(
                    f"no trajectory finished in buffer.stall_timeout_s={self.cfg.stall_timeout_s:g} s while the "
                    f"learner waits for {n_groups} groups: {len(self._ready)} ready, {len(self._open)} in flight, "
                    f"admission {'open' if self.can_admit() else 'closed'}, version {self.version}. Check the "
                    "engine and sandbox logs; raise the timeout if single episodes really take this long."
                ) from None
        return batch

    def fail(self, error: BaseException) -> None:
        """Rollouts cannot go on: make take() raise instead of waiting forever."""
        self._failure = error
        self._notify()

    # -- views --------------------------------------------------------------------------
    def open_groups(self) -> list[_OpenGroup]:
        return list(self._open.values())

    def stats(self) -> dict[str, float]:
        s = self.last_staleness
        out: dict[str, float] = {f"buffer/{k}": float(v) for k, v in vars(self.counters).items()}
        out["buffer/ready_groups"] = len(self._ready)
        out["buffer/inflight_groups"] = len(self._open)
        out["buffer/staleness_bound"] = self.k
        out["buffer/infra_failed_share"] = self.last_infra_share
        if s:
            out["buffer/staleness_mean"] = sum(s) / len(s)
            out["buffer/staleness_max"] = max(s)
        return out

    # -- checkpoint ---------------------------------------------------------------------
    def state(self) -> dict:
        """Everything needed to continue, half-finished trajectories included (serialised bytes)."""

        def enc(t: Trajectory | None) -> bytes | None:
            return None if t is None else t.to_bytes()

        return {
            "version": self.version,
            "seq": self._seq,
            "recycled": list(self.recycled),
            "counters": vars(self.counters).copy(),
            "open": [
                {
                    "group_id": g.group_id,
                    "task_id": g.task_id,
                    "seq": g.seq,
                    "doomed": g.doomed,
                    "reported": sorted(g.reported),
                    "members": [enc(t) for t in g.members],
                    "forks": [t.to_bytes() for t in g.forks],
                }
                for g in self._open.values()
            ],
            "ready": [
                {
                    "seq": self._ready_seq[gid],
                    "members": [t.to_bytes() for t in (*grp.trajectories, *grp.left_out)],
                }
                for gid, grp in self._ready.items()
            ],
        }

    def load_state(self, state: dict) -> None:
        self.version = state["version"]
        self._seq = state["seq"]
        self.recycled = deque(state["recycled"])
        self.counters = BufferCounters(**state["counters"])
        self._open = {}
        for g in state["open"]:
            members = [None if b is None else Trajectory.from_bytes(b) for b in g["members"]]
            forks = [Trajectory.from_bytes(b) for b in g.get("forks", [])]
            self._open[g["group_id"]] = _OpenGroup(
                g["group_id"], g["task_id"], g["seq"], members, set(g["reported"]), g["doomed"], forks
            )
        self._ready, self._ready_seq = {}, {}
        for r in state["ready"]:
            members = [Trajectory.from_bytes(b) for b in r["members"]]
            gid = members[0].group_id
            group = Group.of(gid, members)
            assert group is not None, f"{gid}: a ready group has a member that did not fail"
            self._ready[gid] = group
            self._ready_seq[gid] = r["seq"]
        self._enforce_bound()  # a resumed run with a smaller bound: what waited past it is not trained

    # -- waking -------------------------------------------------------------------------
    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def changed(self) -> None:
        """Return at the buffer's next change (a report, a batch taken, a new version or bound)."""
        await self._wake.wait()


def _oldest(min_version: int | None) -> float:
    """Sort key: a group with no sampled token (nothing to go stale) comes after every sampled one."""
    return float("inf") if min_version is None else min_version
