"""Chat templates: the compact Hermes one for models built from scratch, and real families' templates.

- `HERMES_TOOLS` is Qwen2.5's ChatML layout with Hermes tool calls, made compact for a tiny context:
  the tools are listed by name in the system turn, an assistant tool call is
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, tool results come back in a user turn
  as `<tool_response>\\n...\\n</tool_response>`.
- `TEMPLATES["qwen3"]` (chat_templates/qwen3.jinja) is Qwen3's template as shipped in
  Qwen/Qwen3-8B `tokenizer_config.json` (revision 895c8d171bc03c30e113cd7a28c02494b5e068b7):
  `<think>` reasoning (kept only for the turns after the last user query), Hermes `<tool_call>`s,
  `enable_thinking`. Use it with `--tool-parser hermes --reasoning-parser qwen3`.
- `TEMPLATES["llama3_json"]` (chat_templates/llama3_json.jinja) is Llama 3.2's template as shipped in
  meta-llama/Llama-3.2-1B-Instruct `tokenizer_config.json`: tools in the first user turn, a call is the
  JSON `{"name": ..., "parameters": {...}}`, tool results in an `ipython` turn. Use `--tool-parser llama3_json`.

Hugging Face model directories normally carry their template; these are for checkpoints that lost it
(converted or built from scratch) and for tests. `set_template(model_dir, template)` writes one into a
tokenizer directory.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

HERMES_TOOLS = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n' }}{%- endif %}"
    "{{ 'tools:' }}{%- for t in tools %}{{ ' ' + t.function.name }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'user' or m.role == 'system' %}"
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

_DIR = files("agent_rl.openai") / "chat_templates"
TEMPLATES = {
    "hermes_tools": HERMES_TOOLS,
    "qwen3": (_DIR / "qwen3.jinja").read_text(),
    "llama3_json": (_DIR / "llama3_json.jinja").read_text(),
}


def set_template(tokenizer_dir: str | Path, template: str = HERMES_TOOLS) -> None:
    """Save `template` (a Jinja string or a TEMPLATES key) as the chat template of the tokenizer in `tokenizer_dir`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.chat_template = TEMPLATES.get(template, template)
    tok.save_pretrained(str(tokenizer_dir))
