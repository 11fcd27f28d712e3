"""Build a small tokenizer and a small Qwen2-architecture model from scratch, offline.

The CPU recipe and the test suite need a real Hugging Face model directory without a
model hub: a byte-level BPE tokenizer trained on the task's own text (digits split one
per token, so arithmetic is learnable) with a Qwen-style chat template, and a randomly
initialised `Qwen2ForCausalLM` saved next to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2's template, reduced to system/user/assistant turns.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512):
    """Train a byte-level BPE tokenizer (digits split individually) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
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
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(
    vocab_size: int,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_positions: int = 2048,
    tie_embeddings: bool = False,
    seed: int = 0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
):
    """A randomly initialised Qwen2ForCausalLM (fp32). Untied embeddings by default (vLLM reloads match HF)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate or 4 * hidden,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def build_tiny(
    out_dir: str | Path, texts: Iterable[str], *, vocab_size: int = 512, seed: int = 0, **model_kw
) -> Path:
    """Train a tokenizer on `texts`, build a model over it, save both to `out_dir`; return the path."""
    out = Path(out_dir)
    tok = train_tokenizer(texts, vocab_size)
    model = build_model(
        len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, seed=seed, **model_kw
    )
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def sample_corpus() -> list[str]:
    """Generic text covering the SimpleTIR surface forms (code fences, boxed answers, digits) for test models."""
    lines = []
    for a in range(0, 200, 7):
        b = (a * 37) % 101
        lines.append(
            f"Compute {a} * {b} + {a - b}. Let me use Python.\n```python\nprint({a} * {b} + {a - b})\n```\n"
            f"```output\n{a * b + a - b}\n```\nThe answer is \\boxed{{{a * b + a - b}}}."
        )
    lines.append("Reason step by step. You may write complete Python scripts in ```python fences.")
    lines.append(
        "Code execution result: Traceback (most recent call last): NameError: name 'x' is not defined"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    """`agent-rl tiny-model --out DIR [--corpus tiny_arith|generic] [--hidden ...]`."""
    import argparse

    p = argparse.ArgumentParser(prog="agent-rl tiny-model", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--corpus", choices=["tiny_arith", "generic"], default="tiny_arith", help="tokenizer training text"
    )
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.corpus == "tiny_arith":
        from envs.tiny_arith import corpus

        texts = corpus()
    else:
        texts = sample_corpus()
    out = build_tiny(
        args.out,
        texts,
        vocab_size=args.vocab_size,
        seed=args.seed,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
    )
    print(out)
    return 0
