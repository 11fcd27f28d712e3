"""megatron's GPTModel, stopped at the final norm: the learner needs log-probs, not logits.

`GPTModel._postprocess` applies the output layer to every token and returns the [s, b, V / tp]
logits. `HiddenStatesGPTModel` returns the final norm's output [s (/ tp under SP), b, H]
instead; `linear_logprobs` applies the output layer chunk by chunk inside the log-prob, so the
logits are never held whole. The output layer itself (or the tied embedding) is built and
loaded as usual; `output_weight` names the weight to use. Multi-token prediction is not used.
"""

from __future__ import annotations

from megatron.core.models.gpt import GPTModel
from torch import Tensor


class HiddenStatesGPTModel(GPTModel):
    def _postprocess(self, hidden_states: Tensor, **_unused) -> Tensor:
        return hidden_states

    def output_weight(self) -> Tensor:
        """This TP rank's [V / tp, H] output weight (the word embedding when they are tied)."""
        if self.share_embeddings_and_output_weights:
            return self.shared_embedding_or_output_weight()
        return self.output_layer.weight
