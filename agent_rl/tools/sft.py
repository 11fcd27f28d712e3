"""`agent-rl sft`: supervised fine-tuning of a Hugging Face causal LM on a jsonl data set.

Rows are either plain text, {"prompt": str, "response": str | [{"text": str, "train": bool}, ...]},
trained on the response tokens only (each response piece tokenized on its own and appended
after the prompt, EOS at the end; pieces with "train": false, such as tool output, are
context only), or chat, {"messages": [{"role": ..., "content": ...}, ...]}, rendered with
the tokenizer's chat template and trained on the assistant turns. The first use is the
warm start of the CPU recipe on SimpleTIR teacher traces; nothing here is specific to it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_rl.metrics import RunWriter

ROLES = ("system", "user", "assistant", "tool")


class SftDataError(ValueError):
    """A data row is malformed; the message names file:line and the field."""


class SftConfig(BaseModel):
    """Everything a run used (written to OUT/config.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: str
    data_path: str
    out_dir: str
    epochs: float = Field(1.0, gt=0)
    lr: float = Field(1e-4, gt=0)
    batch_size: int = Field(8, ge=1)
    micro_batch_size: int | None = Field(None, ge=1)
    max_len: int = Field(1024, ge=2)
    seed: int = 0
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    grad_clip: float = Field(1.0, gt=0)
    dtype: Literal["float32", "bfloat16"] = "float32"
    gradient_checkpointing: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: a GPU when torch sees one, else the CPU. A recipe whose results are quoted for the CPU pins cpu:
    the same data and seed on a GPU round differently, and a small model's SFT carries that far."""
    tensorboard: bool = False
    progress: bool = True


@dataclass(frozen=True)
class Example:
    """One tokenized row: ids and a 0/1 loss mask over them (mask[t] = 1: token t is a target)."""

    input_ids: list[int]
    loss_mask: list[int]


def _fail(where: str, msg: str) -> SftDataError:
    return SftDataError(f"{where}: {msg}")


def _str_field(row: dict[str, Any], key: str, where: str) -> str:
    v = row.get(key)
    if not isinstance(v, str):
        raise _fail(where, f"field {key!r} must be a string, got {type(v).__name__}")
    return v


def _encode_plain(row: dict[str, Any], tok: Any, where: str) -> Example:
    prompt = _str_field(row, "prompt", where)
    response = row.get("response")
    if isinstance(response, str):
        pieces = [(response, True)]
    elif isinstance(response, list) and response:
        pieces = []
        for j, p in enumerate(response):
            if not isinstance(p, dict) or not isinstance(p.get("text"), str):
                raise _fail(where, f"field 'response[{j}]' must be an object with a string 'text'")
            train = p.get("train", True)
            if not isinstance(train, bool):
                raise _fail(where, f"field 'response[{j}].train' must be true or false, got {train!r}")
            pieces.append((p["text"], train))
    else:
        raise _fail(where, "field 'response' must be a string or a non-empty list of {text, train} pieces")
    if tok.eos_token_id is None:
        raise _fail(
            where, "the tokenizer has no eos_token; plain prompt/response rows need one to end the response"
        )
    ids = list(tok(prompt, add_special_tokens=True)["input_ids"])
    mask = [0] * len(ids)
    for text, train in pieces:
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [int(train)] * len(piece)
    ids.append(tok.eos_token_id)
    mask.append(1)
    return Example(ids, mask)


def _encode_chat(row: dict[str, Any], tok: Any, where: str) -> Example:
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise _fail(where, "field 'messages' must be a non-empty list")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise _fail(
                where, f"field 'messages[{j}]' must be {{role: one of {list(ROLES)}, content: string}}"
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise _fail(where, "field 'messages' has no assistant turn to train on")
    if tok.chat_template is None:
        raise _fail(where, "chat rows need a tokenizer with a chat_template")

    def render(msgs: list[dict[str, Any]], gen: bool) -> list[int]:
        return list(
            tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=False)
        )

    # Render growing prefixes and train on what each assistant turn adds after its header.
    ids: list[int] = []
    mask: list[int] = []
    for k, m in enumerate(messages):
        full = render(messages[: k + 1], False)
        if full[: len(ids)] != ids:
            raise _fail(
                where, f"chat template is not prefix-stable at 'messages[{k}]'; use prompt/response rows"
            )
        new = full[len(ids) :]
        if m["role"] == "assistant":
            header = render(messages[:k], True)
            if header[: len(ids)] != ids or full[: len(header)] != header:
                raise _fail(where, f"chat template's generation prompt does not prefix 'messages[{k}]'")
            head = len(header) - len(ids)
            mask += [0] * head + [1] * (len(new) - head)
        else:
            mask += [0] * len(new)
        ids = full
    return Example(ids, mask)


def load_examples(path: str | Path, tok: Any, max_len: int) -> tuple[list[Example], int]:
    """Tokenize every row; returns the examples and how many were truncated to `max_len`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data {path} not found (expected a .jsonl file)")
    examples, truncated = [], 0
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{i}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _fail(where, f"not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise _fail(where, f"row must be a JSON object, got {type(row).__name__}")
            if "messages" in row and "prompt" not in row:
                ex = _encode_chat(row, tok, where)
            elif "prompt" in row and "messages" not in row:
                ex = _encode_plain(row, tok, where)
            else:
                raise _fail(where, "row needs either 'prompt' + 'response' or 'messages' (exactly one form)")
            if len(ex.input_ids) > max_len:
                truncated += 1
                ex = Example(ex.input_ids[:max_len], ex.loss_mask[:max_len])
            if sum(ex.loss_mask[1:]) == 0:
                raise _fail(where, f"no trainable tokens within max_len={max_len} (prompt too long?)")
            examples.append(ex)
    if not examples:
        raise SftDataError(f"{path}: no rows")
    return examples, truncated


def _pad(rows: Sequence[Example], pad_id: int):
    import torch

    T = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.tensor(r.input_ids)
        mask[i, :n] = torch.tensor(r.loss_mask, dtype=torch.float32)
    return ids, mask


def token_loss_sum(model: Any, ids, mask, autocast_dtype) -> Any:
    """Sum over target tokens of -log p(token | prefix); the caller divides by the token count.

    No attention mask: rows are right-padded, so in a causal LM no real token attends to padding and
    padded positions carry no loss; without a mask the attention takes its fast causal path (several
    times faster on CPU)."""
    import torch

    with torch.autocast(ids.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(input_ids=ids).logits[:, :-1]
    ce = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    )
    return (ce * mask[:, 1:].reshape(-1)).sum()


def run_sft(model_dir: str | Path, data_path: str | Path, out_dir: str | Path, **options: Any) -> Path:
    """Fine-tune `model_dir` on `data_path`; save the model + tokenizer and metrics.jsonl to `out_dir`.

    Options are the fields of `SftConfig` (epochs, lr, batch_size, max_len, seed, ...).
    Loss: mean over all target tokens of a batch (micro-batches accumulate into it).
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_rl.learners._schedule import build_scheduler

    cfg = SftConfig(model_dir=str(model_dir), data_path=str(data_path), out_dir=str(out_dir), **options)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tok = AutoTokenizer.from_pretrained(cfg.model_dir)
    examples, truncated = load_examples(cfg.data_path, tok, cfg.max_len)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        from agent_rl.errors import UserError

        raise UserError("agent-rl sft --device cuda: torch sees no GPU; use --device auto or cpu")
    device = torch.device("cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32).to(device)
    if cfg.gradient_checkpointing:
        # transformers 5 renamed it; older releases only have gradient_checkpointing_enable
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    model.config.use_cache = False
    model.train()
    autocast_dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else None

    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = build_scheduler(opt, schedule=cfg.lr_schedule, warmup_steps=cfg.warmup_steps, total_steps=total)
    mbs = cfg.micro_batch_size or cfg.batch_size
    rng = random.Random(cfg.seed)
    out = Path(cfg.out_dir)
    writer = RunWriter(out, cfg, backends=("jsonl", "tensorboard") if cfg.tensorboard else ("jsonl",))
    bar = tqdm(total=total, desc="sft", unit="step", disable=not cfg.progress)
    order: list[int] = []
    try:
        for step in range(total):
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            batch = [examples[i] for i in order[: cfg.batch_size]]
            order = order[cfg.batch_size :]
            t0 = time.perf_counter()
            n_tokens = sum(sum(e.loss_mask[1:]) for e in batch)
            loss_sum = 0.0
            for j in range(0, len(batch), mbs):
                ids, mask = (x.to(device) for x in _pad(batch[j : j + mbs], pad_id))
                part = token_loss_sum(model, ids, mask, autocast_dtype)
                (part / n_tokens).backward()
                loss_sum += float(part.detach())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            seconds = time.perf_counter() - t0
            loss = loss_sum / n_tokens
            if not math.isfinite(loss) or not math.isfinite(grad_norm):
                raise FloatingPointError(f"sft step {step}: loss {loss}, grad norm {grad_norm}; lower --lr?")
            writer.log(
                step,
                {
                    "sft/loss": loss,
                    "sft/grad_norm": grad_norm,
                    "sft/lr": lr,
                    "sft/epoch": (step + 1) / steps_per_epoch,
                    "sft/tokens": n_tokens,
                    "perf/sft_tokens_per_s": sum(len(e.input_ids) for e in batch) / seconds,
                    "sft/truncated_rows": truncated,
                },
            )
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
            bar.update()
    finally:
        bar.close()
        writer.close()
    model.config.use_cache = True
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agent-rl sft", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory to start from")
    p.add_argument("--data", required=True, help="jsonl: {prompt, response} or {messages} rows")
    p.add_argument("--out", required=True, help="output directory (model, tokenizer, metrics.jsonl)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=None, help="rows per forward pass (memory)")
    p.add_argument("--max-len", type=int, default=1024, help="tokens per row; longer rows are truncated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-schedule", choices=["constant", "cosine", "linear"], default="cosine")
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="autocast dtype")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: a GPU if torch sees one"
    )
    p.add_argument("--tensorboard", action="store_true")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    a = p.parse_args(argv)
    try:
        out = run_sft(
            a.model,
            a.data,
            a.out,
            epochs=a.epochs,
            lr=a.lr,
            batch_size=a.batch_size,
            micro_batch_size=a.micro_batch_size,
            max_len=a.max_len,
            seed=a.seed,
            weight_decay=a.weight_decay,
            warmup_steps=a.warmup_steps,
            lr_schedule=a.lr_schedule,
            grad_clip=a.grad_clip,
            dtype=a.dtype,
            gradient_checkpointing=a.gradient_checkpointing,
            device=a.device,
            tensorboard=a.tensorboard,
            progress=a.progress,
        )
    except (SftDataError, FileNotFoundError) as e:
        p.exit(2, f"agent-rl sft: error: {e}\n")
    print(f"saved fine-tuned model to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
