"""SGLang's LoRA endpoints on the embedded server: /load_lora_adapter, /unload_lora_adapter, /update_weight_version.

Bodies are named as SGLang's LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput and
UpdateWeightVersionReqInput (tests/engines/test_sglang_field_names.py). The embedded engine serves one
policy: the loaded adapter is merged into its weights (embedded/lora.py) and applies to every request;
/generate's `lora_path`, when given, must name it. A client sets the version its tokens carry with
/update_weight_version after loading, as with SGLang.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from agent_rl.auth import check_weight_path
from agent_rl.engines.embedded.web import ENGINE, WEIGHT_DIRS
from agent_rl.openai.errors import Invalid, parse
from agent_rl.weights.adapters import Adapter


class LoadLoRAAdapterReq(BaseModel):
    """SGLang's LoadLoRAAdapterReqInput (pinned has no meaning here: one adapter, always resident)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: str | None = None


class UnloadLoRAAdapterReq(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_id: str | None = None


class UpdateWeightVersionReq(BaseModel):
    """SGLang's UpdateWeightVersionReqInput: what a client posts after loading an adapter."""

    model_config = ConfigDict(extra="forbid")
    new_version: str
    abort_all_requests: bool = True


async def load_lora_adapter(request: web.Request) -> web.Response:
    req = await parse(request, LoadLoRAAdapterReq)
    real = check_weight_path(req.lora_path, request.app[WEIGHT_DIRS], "lora_path")  # load what was checked
    if not Path(real).is_dir():
        raise Invalid(f"lora_path {req.lora_path!r} is not a directory on the server's machine")
    engine = request.app[ENGINE]
    try:
        adapter = Adapter.load(real)
    except (FileNotFoundError, ValueError) as e:  # not an adapter directory, or a corrupt one: the client's
        raise Invalid(f"lora_path {req.lora_path!r}: {e}", param="lora_path") from None
    await engine.load_adapter(version=engine.version, adapter=adapter, name=req.lora_name)
    return web.json_response({"success": True, "loaded_adapters": {req.lora_name: req.lora_path}})


async def update_weight_version(request: web.Request) -> web.Response:
    """Tokens sampled from now on carry `new_version` (SGLang: set after loading an adapter)."""
    req = await parse(request, UpdateWeightVersionReq)
    if not req.new_version.isdigit():
        raise Invalid(f"new_version must be an integer string here, got {req.new_version!r}")
    engine = request.app[ENGINE]
    aborted = await engine.abort() if req.abort_all_requests else 0
    await engine.call(lambda: engine.scheduler.weights_changed(int(req.new_version)))
    return web.json_response(
        {"success": True, "message": f"version {req.new_version}", "num_paused_requests": aborted}
    )


async def unload_lora_adapter(request: web.Request) -> web.Response:
    req = await parse(request, UnloadLoRAAdapterReq)
    engine = request.app[ENGINE]
    if engine.adapter_name != req.lora_name:
        # the publisher unloads the previous version after loading the next: it is already replaced
        return web.json_response(
            {"success": True, "loaded_adapters": {}, "message": f"{req.lora_name!r} is not loaded"}
        )
    await engine.unload_adapter()
    return web.json_response({"success": True, "loaded_adapters": {}})


def check_lora_path(lora_path: object, loaded: str | None) -> None:
    """/generate's lora_path must name the loaded adapter (or be absent: the engine's one policy)."""
    names = lora_path if isinstance(lora_path, list) else [lora_path]
    for n in names:
        if n is not None and n != loaded:
            raise Invalid(
                f"lora_path {n!r} is not the loaded adapter ({loaded!r}); the embedded engine serves one"
            )


def add_lora_routes(app: web.Application) -> None:
    app.router.add_post("/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/unload_lora_adapter", unload_lora_adapter)
    app.router.add_post("/update_weight_version", update_weight_version)
