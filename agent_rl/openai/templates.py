"""Chat templates with native tool calling for models that have none (the tiny models built from scratch).

`HERMES_TOOLS` is Qwen2.5's ChatML layout with Hermes tool calls, made compact for a tiny context:
the tools are listed by name and description in the system turn, an assistant tool call is
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, tool results come back in a user turn as
`<tool_response>\n...\n</tool_response>`. `set_template(model_dir)` writes it into a tokenizer directory.
"""

from __future__ import annotations

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


def set_template(tokenizer_dir: str | Path, template: str = HERMES_TOOLS) -> None:
    """Save `template` as the chat template of the tokenizer in `tokenizer_dir`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.chat_template = template
    tok.save_pretrained(str(tokenizer_dir))
