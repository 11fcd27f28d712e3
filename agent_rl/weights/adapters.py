"""LoRA adapters as the learner publishes them: the adapter tensors alone, never the base weights.

An `Adapter` holds PEFT's tensors under PEFT's names (`base_model.model.<module>.lora_A.weight` [r, in],
`...lora_B.weight` [out, r]) and the fields an engine needs (rank, alpha, targets). On disk it is PEFT's
format (adapter_config.json + adapter_model.safetensors), which PEFT, vLLM's /v1/load_lora_adapter and
SGLang's /load_lora_adapter read. It is read and written here by hand, so that the publisher and the
engines never import peft (only the learner does).

Engines take adapters through `AdapterLoader.load_adapter`: the embedded engine merges them into its
weights (engines/embedded/lora.py), vLLM and SGLang servers load them by path under a per-version name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

PREFIX = "base_model.model."
CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


@dataclass(frozen=True)
class Adapter:
    tensors: dict[str, torch.Tensor]
    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def pairs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """HF weight name (`model.layers.0.self_attn.q_proj.weight`) -> (A [r, in], B [out, r])."""
        out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, a in self.tensors.items():
            if name.endswith(".lora_A.weight"):
                module = name.removeprefix(PREFIX).removesuffix(".lora_A.weight")
                b = self.tensors.get(f"{PREFIX}{module}.lora_B.weight")
                if b is None:
                    raise ValueError(f"adapter: {name} has no matching lora_B")
                out[f"{module}.weight"] = (a, b)
        if len(out) * 2 != len(self.tensors):
            odd = [n for n in self.tensors if not n.endswith((".lora_A.weight", ".lora_B.weight"))]
            raise ValueError(f"adapter: tensors other than lora_A/lora_B pairs: {odd[:3]}")
        return out

    def clone(self) -> Adapter:
        return Adapter(
            {k: v.detach().clone() for k, v in self.tensors.items()},
            self.rank,
            self.alpha,
            self.target_modules,
        )

    def save(self, out: str | Path, *, base_model: str = "") -> Path:
        """Write PEFT's adapter directory (what PeftModel.from_pretrained, vLLM and SGLang load)."""
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.tensors.items()}, str(out / WEIGHTS))
        config = {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": self.rank, "lora_alpha": self.alpha, "lora_dropout": 0.0, "bias": "none",
            "target_modules": sorted(self.target_modules), "fan_in_fan_out": False, "use_rslora": False,
            "use_dora": False, "modules_to_save": None, "inference_mode": True,
        }  # fmt: skip
        (out / CONFIG).write_text(json.dumps(config, indent=2))
        return out

    @classmethod
    def load(cls, path: str | Path) -> Adapter:
        """Read a PEFT LoRA directory; refuses what a merge of B·A·α/r would not reproduce."""
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
            raise FileNotFoundError(f"{path}: not a PEFT adapter directory ({CONFIG} + {WEIGHTS})")
        try:
            c = json.loads((path / CONFIG).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path / CONFIG}: not JSON ({e})") from None
        if not isinstance(c, dict) or not isinstance(c.get("r"), int) or "lora_alpha" not in c:
            raise ValueError(f"{path / CONFIG}: not a LoRA adapter config (an object with r and lora_alpha)")
        for key, neutral in (
            ("use_dora", False),
            ("use_rslora", False),
            ("fan_in_fan_out", False),
            ("bias", "none"),
        ):
            if c.get(key, neutral) != neutral:
                raise ValueError(f"{path / CONFIG}: {key}={c[key]!r} is not supported (only {neutral!r})")
        if c.get("peft_type", "LORA") != "LORA" or c.get("modules_to_save"):
            raise ValueError(
                f"{path / CONFIG}: only plain LoRA adapters (peft_type LORA, no modules_to_save)"
            )
        targets = c.get("target_modules") or ()
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        try:
            tensors = load_file(str(path / WEIGHTS))
        except Exception as e:  # safetensors' SafetensorError: a corrupt or truncated file
            raise ValueError(
                f"{path / WEIGHTS}: not a readable safetensors file ({str(e).splitlines()[0]})"
            ) from None
        return cls(tensors, int(c["r"]), float(c["lora_alpha"]), targets)


@runtime_checkable
class AdapterLoader(Protocol):
    """An engine (or pool) that takes LoRA adapters: the next tokens it samples carry `version`."""

    async def load_adapter(
        self, *, version: int, adapter: Adapter | None = None, path: str | None = None
    ) -> None:
        """Exactly one of `adapter` (in-memory tensors) or `path` (a PEFT directory the server can read)."""
        ...


def loader(engine: object) -> AdapterLoader:
    if not isinstance(engine, AdapterLoader):
        raise TypeError(
            f"{type(engine).__name__} cannot load LoRA adapters (no load_adapter); learner.lora needs one"
        )
    return engine


def adapter_name(version: int) -> str:
    """The name a server registers version `version`'s adapter under (a new name per push: servers cache by name)."""
    return f"policy-v{version}"
