"""agent_rl/rollout/workers.py Rates: per-step means over what ended in the step's interval, and none written for an
interval where nothing ended (a skipped step's instant): a 0 there read as "the policy stopped calling its tool" on
the main job's curves of 2026-12-06."""

from __future__ import annotations

from dataclasses import replace

from agent_rl.rollout.episodes import RolloutCounters
from agent_rl.rollout.workers import Rates

MEANS = ("rollout/turns_per_episode", "rollout/tool_calls_per_episode", "rollout/episode_seconds")


def test_means_cover_the_interval_and_an_empty_interval_writes_none() -> None:
    rates = Rates()
    c = RolloutCounters(episodes=4, turns=6, tool_calls=2, tool_errors=1, episode_seconds=2.0, gen_seconds=3.0,
                        tool_seconds=0.6, sampled_tokens=100)  # fmt: skip
    first = rates.stats(c, busy=1.0)
    assert first["rollout/tool_calls_per_episode"] == 0.5 and first["rollout/turns_per_episode"] == 1.5
    assert first["rollout/tool_error_rate"] == 0.5 and first["rollout/gen_seconds_per_turn"] == 0.5
    empty = rates.stats(c, busy=1.0)  # nothing ended since: counters unchanged
    assert not any(k in empty for k in MEANS), "a mean over no episodes was written"
    assert "rollout/tool_error_rate" not in empty and "rollout/gen_seconds_per_turn" not in empty
    assert empty["rollout/episodes"] == 4  # the cumulative counters are still there
    later = rates.stats(replace(c, episodes=6, turns=8, tool_calls=2, episode_seconds=3.0), busy=1.0)
    assert later["rollout/tool_calls_per_episode"] == 0.0 and later["rollout/episode_seconds"] == 0.5
    assert "rollout/tool_error_rate" not in later  # two episodes ended, neither called the tool
