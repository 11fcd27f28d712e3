"""How a Ray learner rank's failure reaches the user (agent_rl/learners/_ray_ranks.py `_error`): a rank whose
node or process died is one line that says to --resume (RankLost); a rank's own exception keeps its text.
The Ray exceptions are built as Ray raises them (the multi-node tests kill real nodes, in make test-heavy)."""

from __future__ import annotations

import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from agent_rl.learners._pool import RankError, RankLost  # noqa: E402
from agent_rl.learners._ray_ranks import _error  # noqa: E402


@pytest.mark.parametrize(
    "exc",
    [
        ray_exceptions.ActorDiedError(),
        ray_exceptions.ActorUnavailableError("the actor's node is unreachable", bytes(16)),
        # the node holding rank 0's returned weights died before they were fetched (checkpoint during a kill)
        ray_exceptions.ObjectReconstructionFailedError("c005c5b2bac1a86d", None, ""),
        ray_exceptions.OwnerDiedError("c005c5b2bac1a86d", None, ""),
        ray_exceptions.NodeDiedError("node b died"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_rank_lost_with_its_node_is_one_line_that_says_resume(exc: Exception) -> None:
    err = _error(0, exc)
    assert isinstance(err, RankLost)
    assert str(err).startswith("learner rank 0 is gone (its node or process died: ")
    assert "--resume" in str(err) and "\n" not in str(err)


def test_a_ranks_own_exception_keeps_its_text() -> None:
    cause = ValueError("bad batch")
    err = _error(1, ray_exceptions.RayTaskError("call", "Traceback ...\nValueError: bad batch", cause))
    assert isinstance(err, RankError) and not isinstance(err, RankLost)
    assert str(err).startswith("learner rank 1: ") and "bad batch" in str(err)


def test_a_collective_that_loses_its_peer_is_one_line_that_says_resume() -> None:
    """The surviving rank's gloo error when the node of the other rank was killed (make test-heavy, 2026-11-27)."""
    cause = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:28331: "
        "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
    )
    err = _error(1, ray_exceptions.RayTaskError("call", f"Traceback ...\nRuntimeError: {cause}", cause))
    assert isinstance(err, RankLost)
    assert str(err).startswith(
        "a peer of learner rank 1 is gone (its gloo collective: Connection reset by peer; "
    )
    assert "--resume" in str(err) and "\n" not in str(err)
