"""The viewer's page model: blocks, turns, tool-call fences, flags, and a page safe to embed (no browser here)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from agent_rl.learners.api import TrainedRow
from agent_rl.types import FinishReason, Group, Trajectory, TurnInfo
from agent_rl.viewer.log import RecordedSegment, RecordedTrajectory, TrajectoryLog, read_step
from agent_rl.viewer.report import _inside_fences, build_report, token_texts, trajectory_json

VOCAB = {
    1: "Q",
    10: "I ",
    11: "run\n",
    12: "```",
    13: "python\n",
    14: "print(1)",
    15: "\n```\n",
    16: "</script>",
    40: "1",
}


def decode(ids) -> str:
    return "".join(VOCAB.get(i, f"<{i}>") for i in ids)


def _rec(segments: list[RecordedSegment], **kw) -> RecordedTrajectory:
    base = dict(
        uid="g0/0", group_id="g0", task_id="t", prompt_ids=[1], segments=segments, reward=1.0,
        finish_reason="answer", masked=False, turns=[], baseline=0.5, advantage=0.5, seq_log_weight=0.0,
    )  # fmt: skip
    return RecordedTrajectory(**(base | kw))


def _sampled(ids: list[int], v: int) -> RecordedSegment:
    return RecordedSegment(ids, True, [v] * len(ids), [-0.5] * len(ids), [-0.25] * len(ids))


def test_a_turn_continued_after_an_abort_is_one_model_block_with_two_versions() -> None:
    t = _rec([_sampled([10, 11], 3), _sampled([12, 13, 14, 15], 4), RecordedSegment([40], False, [], [], [])])
    page = trajectory_json(t, decode)
    kinds = [b["kind"] for b in page["blocks"]]
    assert kinds == ["model", "env"]
    model = page["blocks"][0]
    assert model["v"] == [3, 3, 4, 4, 4, 4] and model["versions"] == [3, 4] and model["trained"]
    assert model["c"] == [-0.25] * 6 and model["b"] == [-0.5] * 6
    assert page["blocks"][1]["trained"] is False and page["blocks"][1]["text"] == ["1"]


def test_a_character_split_over_byte_tokens_goes_to_the_token_that_completes_it() -> None:
    raw = "é€".encode()  # 2 + 3 bytes, one token per byte as a byte-level BPE may give them
    ids = list(range(100, 100 + len(raw)))

    def byte_decode(seq) -> str:
        return bytes(raw[i - 100] for i in seq).decode("utf-8", errors="replace")

    assert token_texts(ids, byte_decode) == ["", "é", "", "", "€"]


def test_tool_call_fences_mark_their_tokens_only() -> None:
    texts = [
        "I ",
        "run\n",
        "```",
        "python\n",
        "print(1)",
        "\n```\n",
        "so ",
        "<tool_call>",
        "{}",
        "</tool_call>",
        "x",
    ]
    assert _inside_fences(texts) == [0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0]


def test_flags_name_errors_void_turns_and_truncation() -> None:
    err = _rec([_sampled([10], 0)], turns=[TurnInfo(1, 1, code_ran=True, exit_code=1)])
    void = _rec([_sampled([10], 0)], masked=True, finish_reason="void")
    cut = _rec([_sampled([10], 0)], finish_reason="length")
    assert trajectory_json(err, decode)["flags"] == {"error": True, "void": False, "truncated": False}
    assert trajectory_json(void, decode)["flags"] == {"error": False, "void": True, "truncated": False}
    assert trajectory_json(void, decode)["blocks"][0]["trained"] is False  # masked: greyed, no loss
    assert trajectory_json(void, decode)["weight"] is None  # no loss token, so no weight to show
    assert trajectory_json(err, decode)["weight"] == 1.0
    assert trajectory_json(cut, decode)["flags"]["truncated"]
    # an infrastructure failure, as saved now and as saved before the rename ("error")
    for saved in (str(FinishReason.INFRA_FAILED), "error"):
        infra = _rec([_sampled([10], 0)], finish_reason=saved)
        assert trajectory_json(infra, decode)["flags"]["error"], saved


@dataclass
class Rows:
    """Stands in for the learner's `trained_rows` (the protocol the log reads)."""

    version: int
    rows: dict[str, TrainedRow]

    def trained_rows(self) -> dict[str, TrainedRow]:
        return self.rows


def test_report_embeds_every_step_and_escapes_script_endings(tmp_path: Path) -> None:
    import torch

    log = TrajectoryLog(tmp_path, "all", tokenizer="unused", is_truncation=8.0)
    for step in range(3):
        t = Trajectory(uid=f"s{step}", group_id="g", prompt_ids=[1])
        t.append_sampled([16, 12], [-0.5, -0.5], step)
        t.reward, t.finish_reason = 1.0, FinishReason.ANSWER

        rows = Rows(step + 1, {t.uid: TrainedRow(0.1, 0.2, 0.3, torch.full((3,), -0.4))})
        log.append(step, [Group("g", [t])], rows, {"vcpo/ess_ratio": 0.9})
    out = build_report(tmp_path, decode=decode, steps=range(1, 3))
    html = out.read_text()
    assert out == tmp_path / "view.html"
    assert re.findall(r'<script type="application/json" id="step-(\d+)">', html) == ["1", "2"]
    assert html.count("</script>") == html.count("<script")  # the token "</script>" is escaped in the JSON
    page = json.loads(re.search(r'<script type="application/json" id="page">(.*?)</script>', html).group(1))
    assert [s["step"] for s in page["steps"]] == [1, 2] and page["is_truncation"] == 8.0
    assert "http://" not in html and "https://" not in html  # nothing to fetch: works offline
    assert read_step(tmp_path, 2).trajectories[0].versions == [2]


def test_view_of_a_run_without_a_log_says_how_to_get_one(tmp_path: Path, capsys) -> None:
    import pytest

    from agent_rl.viewer import main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert e.value.code == 2
    assert "has no trajectory log (train with logging.trajectories > 0)" in capsys.readouterr().err
