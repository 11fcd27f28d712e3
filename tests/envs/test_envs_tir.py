"""SimpleTIR parsing and observation formatting, without a sandbox."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from envs.spec import ToolConfig
from envs.tir import ObservationFormatter, parse_turn, tool_output


def test_first_complete_python_block_is_the_code():
    text = "Let me compute.\n```python\nx = 2\nprint(x)\n```\nand\n```python\nprint(3)\n```\n"
    assert parse_turn(text).code == "x = 2\nprint(x)"
    assert parse_turn("```py\nprint(1)\n```\n").code == "print(1)"


def test_unterminated_fence_is_no_code():
    turn = parse_turn("```python\nprint(1)\n")
    assert turn.code is None and turn.answer is None


def test_other_languages_and_output_blocks_are_not_run():
    assert parse_turn("```bash\nls\n```\n").code is None
    assert parse_turn("```output\n5\n```\n").code is None


def test_answer_is_the_last_box_in_the_turn():
    assert parse_turn(r"so \boxed{4} no wait \boxed{5}").answer == "5"


def test_default_stop_string_closes_a_block_but_never_matches_its_opening():
    (stop,) = ToolConfig().stop
    block = "```python\nprint(1)\n```\n"
    assert block.find(stop) == block.rindex("```") - 1  # the only match is the closing fence
    assert stop not in "Sure.\n```python\n"


def test_error_shows_the_last_stderr_line_and_timeouts_say_so():
    tb = 'Traceback (most recent call last):\n  File "<x>", line 1\nZeroDivisionError: division by zero\n'
    assert tool_output("", tb, 1, False, False, 5, "last_line", "") == "ZeroDivisionError: division by zero"
    assert tool_output("partial\n", "", -9, True, False, 5, "last_line", "").endswith("timed out after 5 s")
    assert tool_output("", "", 0, False, False, 5, "last_line", "(no output)") == "(no output)"


def test_long_output_is_cut_in_the_middle_to_the_token_budget(tok):
    fmt = ObservationFormatter(tok, "```output\n{output}\n```\n", max_tokens=40)
    output = "HEAD " + " ".join(str(i) for i in range(2000)) + " TAIL"
    ids = fmt.encode(output)
    assert len(ids) <= 40 + fmt.overhead()
    text = tok.decode(ids)
    assert text.startswith("```output\nHEAD") and text.endswith("TAIL\n```\n") and "middle cut" in text


def test_observation_ids_are_template_and_output_tokenized_separately(tok):
    fmt = ObservationFormatter(tok, "```output\n{output}\n```\n", max_tokens=64)
    ids = fmt.encode("42")
    expect = (
        tok.encode("```output\n", add_special_tokens=False)
        + tok.encode("42", add_special_tokens=False)
        + tok.encode("\n```\n", add_special_tokens=False)
    )
    assert ids == expect


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("`pythonx=1()\n \\boxed{}\ufffd")), max_size=80))
def test_parsing_never_raises_and_code_comes_only_from_a_closed_python_fence(text):
    turn = parse_turn(text)
    if turn.code is not None:
        assert "```" in text[text.find("```") + 3 :]  # an opening and a closing fence
        assert re.search(r"```py(thon)?", text)
