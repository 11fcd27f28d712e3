"""`agent-rl sft`: loss goes down, the saved model reloads and is better, masks and bad rows are right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent_rl.metrics import read_metrics
from agent_rl.tools.sft import SftDataError, load_examples, main, run_sft, token_loss_sum


def _write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _rows(n: int = 24) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = i % 7, (3 * i) % 5
        rows.append({"prompt": f"Compute {a} + {b}.", "response": f" The answer is \\boxed{{{a + b}}}."})
    for i in range(n // 3):
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"Compute {i} * 2."},
                    {"role": "assistant", "content": f"```python\nprint({i} * 2)\n```"},
                    {"role": "user", "content": f"Code execution result: {i * 2}"},
                    {"role": "assistant", "content": f"\\boxed{{{i * 2}}}"},
                ]
            }
        )
    return rows


def _mean_loss(model_dir: Path, data: Path) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.tools.sft import _pad

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    examples, _ = load_examples(data, tok, 256)
    ids, mask = _pad(examples, tok.pad_token_id)
    with torch.no_grad():
        return float(token_loss_sum(model, ids, mask, None) / mask[:, 1:].sum())


def test_sft_lowers_loss_and_saved_model_reloads(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = _write(tmp_path / "train.jsonl", _rows(12))  # 12 plain + 4 chat rows
    out = run_sft(
        tiny_model_dir,
        data,
        tmp_path / "out",
        epochs=6,
        lr=5e-3,
        batch_size=8,
        micro_batch_size=4,
        max_len=256,
        progress=False,
    )
    records = read_metrics(out)
    assert len(records) == 6 * 2
    assert records[-1]["sft/loss"] < 0.6 * records[0]["sft/loss"]
    assert all(r["sft/tokens"] > 0 for r in records)
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert _mean_loss(out, data) < 0.6 * _mean_loss(tiny_model_dir, data)


def test_plain_rows_train_response_and_eos_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = _write(
        tmp_path / "d.jsonl",
        [
            {
                "prompt": "Compute 1 + 2.",
                "response": [{"text": " run"}, {"text": " out 3", "train": False}, {"text": " 3"}],
            }
        ],
    )
    (ex,), _ = load_examples(data, tok, 256)
    n_prompt = len(tok("Compute 1 + 2.")["input_ids"])
    pieces = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in (" run", " out 3", " 3")]
    assert ex.loss_mask == [0] * n_prompt + [1] * pieces[0] + [0] * pieces[1] + [1] * pieces[2] + [1]
    assert ex.input_ids[-1] == tok.eos_token_id


def test_chat_rows_train_assistant_turns_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    msgs = _rows(3)[-1]["messages"]
    (ex,), _ = load_examples(_write(tmp_path / "c.jsonl", [{"messages": msgs}]), tok, 512)
    assert ex.input_ids == list(tok.apply_chat_template(msgs, tokenize=True, return_dict=False))
    trained = tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
    assert trained == "```python\nprint(0 * 2)\n```<|im_end|>\n\\boxed{0}<|im_end|>\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", ":2: not valid JSON"),
        ([1, 2], ":2: row must be a JSON object"),
        ({"prompt": 3, "response": "x"}, ":2: field 'prompt' must be a string"),
        ({"prompt": "p"}, ":2: field 'response' must be"),
        ({"prompt": "p", "response": [{"text": "a", "train": "yes"}]}, ":2: field 'response[0].train'"),
        ({"messages": [{"role": "robot", "content": "x"}]}, ":2: field 'messages[0]'"),
        ({"messages": [{"role": "user", "content": "x"}]}, ":2: field 'messages' has no assistant turn"),
        ({"text": "x"}, ":2: row needs either 'prompt' + 'response' or 'messages'"),
    ],
)
def test_bad_rows_name_file_line_and_field(tiny_model_dir: Path, tmp_path: Path, row, message: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = _write(tmp_path / "bad.jsonl", [{"prompt": "a", "response": "b"}, row])
    with pytest.raises(SftDataError) as e:
        load_examples(data, tok, 64)
    assert f"{data}{message}" in str(e.value)


def test_cli_reports_bad_data_without_traceback(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    data = _write(tmp_path / "bad.jsonl", [{"prompt": "a"}])
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--model",
                str(tiny_model_dir),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "o"),
                "--no-progress",
            ]
        )
    assert e.value.code == 2
    assert f"{data}:1: field 'response'" in capsys.readouterr().err
