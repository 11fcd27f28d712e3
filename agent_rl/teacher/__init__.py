"""The teacher of on-policy distillation: an engine role that scores the student's own tokens.

engines.py  start (or reach) the teacher's engines; check its tokenizer equals the student's
scorer.py   TeacherScorer: the teacher's log-prob of every sampled token of a trajectory, requests in flight
            while the rollouts go on (tool observations and template glue are context, never targets)
buffer.py   TeacherBuffer: the rollout buffer that sends each finished trajectory to the scorer at once and
            hands the learner groups whose every trajectory is scored

The loss terms are vcpo's (vcpo/distill.py); the learner batch carries the scores (agent_rl/batch.py).
"""

from __future__ import annotations

from agent_rl.teacher.buffer import TeacherBuffer
from agent_rl.teacher.engines import TeacherEngines, start_teacher
from agent_rl.teacher.scorer import TeacherScorer

__all__ = ["TeacherBuffer", "TeacherEngines", "TeacherScorer", "start_teacher"]
