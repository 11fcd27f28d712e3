"""What the embedded server's route modules share: app keys and text helpers (errors: agent_rl/openai/errors.py)."""

from __future__ import annotations

from aiohttp import web

from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.scheduler import Output
from agent_rl.openai.errors import Invalid

ENGINE = web.AppKey("engine", EmbeddedEngine)
MODEL_PATH = web.AppKey("model_path", str)


def tokenizer(request: web.Request):
    tok = request.app[ENGINE].scheduler.tokenizer
    if tok is None:
        raise Invalid(f"{request.app[MODEL_PATH]} has no tokenizer files: send token ids, not text")
    return tok


def trim_stop(text: str, out: Output, keep: bool) -> str:
    """Drop a matched stop string (and whatever its last token carried after it) from the text, as SGLang does."""
    if keep or not isinstance(out.matched, str):
        return text
    i = text.find(out.matched)
    return text if i < 0 else text[:i]
