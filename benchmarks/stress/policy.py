"""A 66k-parameter GRU policy that vcpo drives like a Hugging Face causal LM.

`forward(input_ids, attention_mask=...)` returns an object with `.logits` [B, T, V], so
vcpo's own `logprobs_of` and `logit_grad_proxy_of` work on it unchanged; the learner code
under study is exactly the library's. The recurrence also gives cheap incremental sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class PolicyOutput:
    logits: Tensor  # [B, T, V]


class GRUPolicy(nn.Module):
    def __init__(self, vocab: int, embed: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> PolicyOutput:
        # Every sequence of the task has the same length, so there is no padding to mask.
        out, _ = self.gru(self.embed(input_ids))
        return PolicyOutput(self.head(out))

    def step(self, tokens: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """Logits of the next token after `tokens` [B, L], and the carried hidden state."""
        out, state = self.gru(self.embed(tokens), state)
        return self.head(out[:, -1]), state


@torch.no_grad()
def generate(
    policy: GRUPolicy, context: Tensor, new_tokens: int, *, generator: torch.Generator | None, greedy: bool
) -> Tensor:
    """[B, new_tokens] continuation of `context` [B, L]: sampled at temperature 1, or argmax."""
    logits, state = policy.step(context, None)
    out = []
    for _ in range(new_tokens):
        if greedy:
            tok = logits.argmax(-1)
        else:
            tok = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator).squeeze(1)
        out.append(tok)
        logits, state = policy.step(tok[:, None], state)
    return torch.stack(out, dim=1)
