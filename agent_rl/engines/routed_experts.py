"""Routed experts on the wire: SGLang's `/generate` field and the `meta_info` it answers with.

A request asks with `"return_routed_experts": true` (SGLang >= 0.5.x; the server must be started with
`--enable-return-routed-experts`, else the field is accepted and nothing comes back). The answer's
`meta_info["routed_experts"]` is the base64 of a flat array of `prompt_tokens + completion_tokens - 1`
rows of `num_hidden_layers x top_k` expert ids (one row per fed position, layer-major), int32 unless
`meta_info["routed_experts_dtype"]` names a narrower type (newer SGLang). `agent-rl serve` answers the
same way, so one client reads both.
"""

from __future__ import annotations

import base64
from array import array
from collections.abc import Mapping
from typing import Any

from agent_rl.engines.api import EngineError
from agent_rl.types import RoutedExperts, TrajectoryError

_WIRE = {"int32": "i", "int16": "h", "uint16": "H", "uint8": "B"}


def to_meta(routes: RoutedExperts) -> dict[str, Any]:
    """meta_info fields for `routes` (int32, as SGLang's default)."""
    wide = array("i", routes.ids)
    return {"routed_experts": base64.b64encode(wide.tobytes()).decode(), "routed_experts_dtype": "int32"}


def from_meta(meta: Mapping[str, Any], request_id: str) -> RoutedExperts | None:
    """The routing a /generate answer carries, or None when it carries none."""
    payload = meta.get("routed_experts")
    if not payload:
        return None
    dtype = meta.get("routed_experts_dtype") or "int32"
    if not isinstance(payload, str) or dtype not in _WIRE:
        raise EngineError(
            f"request {request_id}: routed_experts as {type(payload).__name__} of dtype {dtype!r}; this client "
            f"reads a base64 string of {sorted(_WIRE)}"
        )
    ids = array(_WIRE[dtype])
    ids.frombytes(base64.b64decode(payload))
    rows = int(meta["prompt_tokens"]) + int(meta["completion_tokens"]) - 1
    if rows <= 0 or len(ids) % rows:
        raise EngineError(f"request {request_id}: {len(ids)} routed expert ids are not {rows} whole rows")
    try:
        return RoutedExperts.from_ints(ids, len(ids) // rows)
    except TrajectoryError as e:
        raise EngineError(f"request {request_id}: {e}") from None
