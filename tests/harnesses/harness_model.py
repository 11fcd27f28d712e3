"""A tiny model over-fitted to one harness's own session, for the harness tests (tests/harnesses/).

A harness (Codex CLI, OpenCode, mini-swe-agent, Claude Code) sends its whole system prompt and tool list on every
call: 20-40k characters. To give a tiny model a context that holds that, the tokenizer is trained on the
harness's own rendered requests with merges that may cross words (only newlines split), so the prompt the
harness really sends is a few thousand tokens; max_position_embeddings is sized from the count measured.

The exchange is learnt in rounds, because each request depends on the harness's reaction to the answer before:
round 1 renders the first request the harness sent (captured by a plain HTTP server that answers 400, through
the gateway's own translation of its API), round k+1 runs the harness against the gateway with the model of
round k and reads the next request from the gateway's record. Each round over-fits every request seen so far
until every answer token beats the runner-up by MARGIN (tests/tool_model.py says why a margin, not a step count).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from tool_model import MARGIN, _margin

# ChatML with Hermes tool calls and the tools' whole JSON schemas in the system turn (what a harness's tools say
# is part of the prompt, as in Qwen2.5's template); every system/developer message kept in place.
TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n' }}"
    "{%- for t in tools %}{{ (t.function | tojson) + '\\n' }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or m.role == 'system' %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls or [] %}"
    "{%- if m.content or not loop.first %}{{ '\\n' }}{%- endif %}"
    '{{ \'<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \' }}'
    "{%- if c.function.arguments is string %}{{ c.function.arguments }}"
    "{%- else %}{{ c.function.arguments | tojson }}{%- endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
REDRAWS = 4  # other draws of a row's volatile text learnt beside the one seen (drive.Exchange.volatile)


def tool_call(name: str, arguments: dict) -> str:
    """An assistant tool call as TEMPLATE writes it (what the model is taught to sample)."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments) + "}\n</tool_call>"


class Capture:
    """An HTTP server that keeps every request body and answers 400, so the harness stops after its first call."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict]] = []
        self.url: str | None = None
        self._runner: Any = None

    async def start(self) -> str:
        from aiohttp import web

        async def keep(request: web.Request) -> web.Response:
            raw = await request.read()
            if request.method == "POST" and raw:
                self.bodies.append((request.path, json.loads(raw)))
            return web.json_response(
                {"error": {"message": "captured", "type": "invalid_request_error"}}, status=400
            )

        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", keep)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        await self._runner.cleanup()


def chat_of(path: str, body: dict) -> tuple[list[dict], list[dict] | None]:
    """A captured request -> the template's messages and tools, through the gateway's own translation."""
    from agent_rl.openai import chat, responses
    from agent_rl.openai.errors import validate
    from agent_rl.openai.protocol import ChatReq

    if path.endswith("/responses"):
        req, _ = responses.to_chat(validate(responses.ResponsesReq, body), [])
    elif path.endswith("/chat/completions"):
        req = validate(ChatReq, body)
    elif path.endswith("/messages"):
        from agent_rl.openai import anthropic

        req = anthropic.to_chat(anthropic.parse(anthropic.MessagesReq, body), max_seq_len=1 << 20)
    else:
        raise ValueError(f"no translation for a captured {path}")
    return chat.template_messages(req.messages), chat.template_tools(req.tools)


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """Byte-level BPE whose merges cross spaces (only newlines split), so a harness prompt it was trained on is short."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\n"), behavior="merged_with_previous"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = TEMPLATE
    return fast


def build(
    out: Path, first_texts: list[str], answers: list[str], *, vocab_size: int = 16000, context: int
) -> Any:
    """A fresh tiny Llama over a tokenizer trained on the harness's rendered first request(s) and the answers.

    Llama, not Qwen2: transformers reloads a Qwen2 directory's tokenizer as Qwen2Tokenizer, with Qwen2's word
    split rules instead of the trained ones (MACHINE-NOTES, 2026-11-25); for Llama it loads tokenizer.json as is."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_tokenizer(first_texts + answers, vocab_size)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        max_position_embeddings=context,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return load_tokenizer(out)


def load_tokenizer(model_dir: Path) -> Any:
    """The tokenizer as the gateway loads it (from the model directory)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def overfit(model_dir: Path, rows: list[tuple[list[int], str]], max_steps: int = 600) -> None:
    """Train the model in `model_dir` (in place) until every answer token of every (prompt ids, answer) row beats
    the runner-up by MARGIN nats."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    data = []
    for prompt, answer in rows:
        a = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = torch.tensor([prompt + a])
        labels = torch.full_like(ids, -100)
        labels[0, len(prompt) :] = torch.tensor(a)
        data.append((ids, labels))
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        margin = float("-inf")
        for _step in range(max_steps):
            opt.zero_grad()
            margins = []
            for ids, labels in data:  # one row at a time: rows are thousands of tokens, no padding
                out = model(input_ids=ids, labels=labels)
                (out.loss / len(data)).backward()
                margins.append(_margin(out.logits.detach(), labels))
            if (margin := min(margins)) >= MARGIN:
                break
            opt.step()
        else:
            raise RuntimeError(
                f"the harness model did not over-fit in {max_steps} steps: margin {margin:.3f} nats"
            )
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(model_dir)


def render_ids(tok: Any, messages: list[dict], tools: list[dict] | None) -> list[int]:
    from agent_rl.openai import chat

    return chat.render(tok, messages, tools)


def redrawn(tok: Any, ids: list[int], volatile: tuple[str, ...], *, seed: int) -> list[list[int]]:
    """REDRAWS copies of the prompt `ids` with the group of every `volatile` regex drawn anew, character by
    character from its own class (hex or decimal digits; other characters kept); none when nothing matches."""
    text = tok.decode(ids) if volatile else ""
    if not any(re.search(v, text) for v in volatile):
        return []
    rng = random.Random(seed)

    def draw(m: re.Match) -> str:
        value = m.group(1)
        digits = "0123456789abcdef" if any(c in "abcdef" for c in value) else "0123456789"
        new = "".join(rng.choice(digits) if c in digits else c for c in value)
        return m.group(0).replace(value, new, 1)

    copies = []
    for _ in range(REDRAWS):
        t = text
        for v in volatile:
            t = re.sub(v, draw, t)
        copies.append(tok(t, add_special_tokens=False)["input_ids"])
    return copies
