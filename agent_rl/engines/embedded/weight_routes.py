"""The embedded server's side of SGLang's distributed weight update (the receiver of weight_group.py).

POST /init_weights_update_group joins the trainer's group (blocks until every member joined);
/begin_weight_update, /update_weights_from_distributed, /end_weight_update receive one broadcast
and load it as the given version; /destroy_weights_update_group leaves. GET /server_info reports
tp_size (always 1 here), which a trainer needs to compute world size and rank offsets.

Like SGLang, an update must run inside a begin/end session and a malformed request is refused
before receiving anything. A request that parses is always received in full, even if its names
or shapes do not fit the model (then nothing is loaded and the answer is a 400 naming the
tensor): the collective completes either way, so the trainer is never left blocked in it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from agent_rl.engines.embedded.web import ENGINE, MODEL_PATH
from agent_rl.engines.protocol import (
    BeginWeightUpdateReq,
    DestroyWeightsUpdateGroupReq,
    EndWeightUpdateReq,
    InitWeightsUpdateGroupReq,
    UpdateWeightsFromDistributedReq,
)
from agent_rl.openai.errors import Invalid, parse
from agent_rl.weights import group as weight_group

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass
class WeightGroups:
    """Groups this server joined (by name) and whether a weight-update session is open."""

    groups: dict[str, tuple[dist.ProcessGroup, str]] = field(default_factory=dict)  # name -> (group, backend)
    session_open: bool = False


GROUPS = web.AppKey("weight_groups", WeightGroups)


def _ok(message: str) -> web.Response:
    return web.json_response({"success": True, "message": message})


def _failed(message: str) -> web.Response:
    """SGLang answers a failed group operation with success=false and HTTP 400."""
    return web.json_response({"success": False, "message": message}, status=400)


async def init_weights_update_group(request: web.Request) -> web.Response:
    req = await parse(request, InitWeightsUpdateGroupReq)
    state = request.app[GROUPS]
    if req.group_name in state.groups:
        raise Invalid(
            f"group_name {req.group_name!r} is already joined; /destroy_weights_update_group it first"
        )
    endpoint = weight_group.Endpoint(req.master_address, req.master_port, "gloo")
    spec = weight_group.GroupSpec(endpoint, req.world_size, req.group_name)
    rank = req.rank_offset  # + tp rank, which is always 0 here
    try:
        group = await asyncio.to_thread(weight_group.join, spec, rank)
    except Exception as e:  # rendezvous timed out, address unreachable, ...
        log.exception("joining weight group %s failed", req.group_name)
        return _failed(f"failed to join {req.group_name!r} at {req.master_address}:{req.master_port}: {e}")
    state.groups[req.group_name] = (group, req.backend)
    return _ok(f"joined {req.group_name!r} as rank {rank} of {req.world_size}")


async def begin_weight_update(request: web.Request) -> web.Response:
    await parse(request, BeginWeightUpdateReq)
    state = request.app[GROUPS]
    if state.session_open:
        return _failed("a weight-update session is already open; call /end_weight_update first")
    state.session_open = True
    return _ok("weight-update session open")


async def end_weight_update(request: web.Request) -> web.Response:
    await parse(request, EndWeightUpdateReq)
    state = request.app[GROUPS]
    if not state.session_open:
        return _failed("no weight-update session is open; call /begin_weight_update first")
    state.session_open = False
    return _ok("weight-update session closed")


async def update_weights_from_distributed(request: web.Request) -> web.Response:
    req = await parse(request, UpdateWeightsFromDistributedReq)
    state, engine = request.app[GROUPS], request.app[ENGINE]
    if req.group_name not in state.groups:
        raise Invalid(
            f"group_name {req.group_name!r} is not joined (joined: {sorted(state.groups)}); "
            "call /init_weights_update_group first"
        )
    if not state.session_open:
        return _failed(
            "update_weights_from_distributed must run between /begin_weight_update and /end_weight_update"
        )
    try:
        version = engine.version if req.weight_version is None else int(req.weight_version)
    except ValueError:
        raise Invalid(f"weight_version must be an integer string, got {req.weight_version!r}") from None
    group, backend = state.groups[req.group_name]
    meta = weight_group.TensorMeta(tuple(req.names), tuple(req.dtypes), tuple(tuple(s) for s in req.shapes))
    aborted = await engine.abort() if req.abort_all_requests else 0
    # Received off the engine thread (generation goes on meanwhile), loaded between two decode steps.
    tensors = await asyncio.to_thread(weight_group.receive, meta, group, backend)
    await engine.update_weights(version=version, tensors=tensors)  # checks every name and shape first
    return web.json_response(
        {
            "success": True,
            "message": f"received {len(tensors)} tensors; loaded as version {version}",
            "num_paused_requests": aborted,
        }
    )


async def destroy_weights_update_group(request: web.Request) -> web.Response:
    req = await parse(request, DestroyWeightsUpdateGroupReq)
    entry = request.app[GROUPS].groups.pop(req.group_name, None)
    if entry is None:
        return _failed(f"group_name {req.group_name!r} is not joined")
    await asyncio.to_thread(weight_group.leave, entry[0])
    return _ok(f"left {req.group_name!r}")


async def server_info(request: web.Request) -> web.Response:
    """The subset of SGLang's /server_info a trainer reads to place its ranks."""
    engine = request.app[ENGINE]
    return web.json_response(
        {
            "model_path": request.app[MODEL_PATH],
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "device": "cpu",
            "weight_version": str(engine.version),
        }
    )


def add_weight_group_routes(app: web.Application) -> None:
    app[GROUPS] = WeightGroups()
    app.router.add_post("/init_weights_update_group", init_weights_update_group)
    app.router.add_post("/begin_weight_update", begin_weight_update)
    app.router.add_post("/update_weights_from_distributed", update_weights_from_distributed)
    app.router.add_post("/end_weight_update", end_weight_update)
    app.router.add_post("/destroy_weights_update_group", destroy_weights_update_group)
    app.router.add_get("/server_info", server_info)
