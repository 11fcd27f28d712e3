"""HTTP clients implementing `EngineClient`: `SGLangClient` (SGLang's native API; our server speaks it too)
and `VLLMClient` (vLLM's OpenAI-compatible server with its RL/dev endpoints).

Weight updates from in-memory tensors go through a safetensors file in /dev/shm (RAM, not disk;
see weights.py), then the server's load-from-path endpoint; the file is removed afterwards. That
needs the server on the same machine; across machines use a shared path or the distributed update
(`init_weights_update_group` + `update_weights_from_distributed`: a broadcast from learner rank 0,
NCCL on GPUs, gloo on CPU; see agent_rl/weights/group.py).
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from agent_rl import auth
from agent_rl.engines import routed_experts
from agent_rl.engines.api import (
    BadRequest,
    EngineAuthFailed,
    EngineError,
    EngineUnavailable,
    Generation,
    SamplingParams,
)
from agent_rl.weights.adapters import Adapter, adapter_name
from agent_rl.weights.group import GroupSpec, TensorMeta
from agent_rl.weights.tensors import remove_checkpoint, shm_dir, write_shm_checkpoint

FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class HTTPEngine:
    """Shared plumbing: one aiohttp session per client, errors mapped to BadRequest / EngineUnavailable."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float | None = None,
        health_timeout_s: float = 5.0,
        api_key: str | None = None,
    ):
        """api_key: sent as a bearer token (default: the run's, $AGENT_RL_API_KEY; see agent_rl/auth.py)."""
        self.url = url.rstrip("/")
        self.headers = auth.bearer(api_key or auth.run_key())
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.health_timeout = aiohttp.ClientTimeout(total=health_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False  # after close(): no new session (one opened then would never be closed)
        self.version = 0  # last version pushed through this client
        self.lora_name: str | None = None  # LoRA: the adapter requests sample with (weights/adapters.py)
        self._lora_dir: Path | None = None  # memory-mode adapter written for the server, kept while loaded

    def session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise EngineUnavailable(f"{self.url}: this client was closed")
        if self._session is None or self._session.closed:
            # No connection cap: hundreds of concurrent generations are normal for a rollout worker.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=self.timeout, headers=self.headers
            )
        return self._session

    async def request(
        self, method: str, path: str, body: Any = None, *, text_reply: bool = False, **kw
    ) -> Any:
        """The JSON answer (`text_reply`: the text, for endpoints that answer plain text)."""
        try:
            async with self.session().request(method, self.url + path, json=body, **kw) as r:
                text = await r.text()
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            raise EngineUnavailable(f"{method} {self.url}{path}: {type(e).__name__}: {e}") from e
        check_status(r.status, f"{method} {self.url}{path}", text)
        return text if text_reply else json.loads(text) if text.strip() else None

    async def load_adapter(
        self, *, version: int, adapter: Adapter | None = None, path: str | None = None
    ) -> None:
        """LoRA: load the adapter under a new name (`policy-v<version>`), unload the previous one, and sample
        with it from now on; in-memory adapters go through a PEFT directory in /dev/shm, kept while loaded."""
        if (path is None) == (adapter is None):
            raise BadRequest("load_adapter needs exactly one of adapter= or path=")
        tmp = adapter.save(shm_dir() / "adapter") if adapter is not None else None
        name, old = adapter_name(version), self.lora_name
        try:
            await self._lora_call(self.LORA_LOAD, {"lora_name": name, "lora_path": str(tmp or path)})
        except BaseException:
            if tmp is not None:
                remove_checkpoint(tmp.parent)
            raise
        if old is not None and old != name:
            await self._lora_call(self.LORA_UNLOAD, {"lora_name": old})
        if self._lora_dir is not None:
            remove_checkpoint(self._lora_dir)
        self._lora_dir = tmp.parent if tmp is not None else None
        await self._after_adapter(version)
        self.lora_name, self.version = name, version

    LORA_LOAD = LORA_UNLOAD = ""  # the server's endpoints (per API)

    async def _lora_call(self, path: str, body: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _after_adapter(self, version: int) -> None:
        """Tell the server the version its tokens carry now."""

    async def health(self) -> bool:
        try:
            async with self.session().get(self.url + "/health", timeout=self.health_timeout) as r:
                return r.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()


def check_status(status: int, where: str, text: str) -> None:
    if status == 401:  # the key, not the request (a 403 names a path outside the weight dirs: the request's)
        raise EngineAuthFailed(f"{where} -> {status}: {text[:2000]}")
    if 400 <= status < 500:
        raise BadRequest(f"{where} -> {status}: {text[:2000]}")
    if status >= 500:
        raise EngineUnavailable(f"{where} -> {status}: {text[:2000]}")


class SGLangClient(HTTPEngine):
    """SGLang's native API: /generate with input_ids, /pause_generation, /update_weights_from_disk, ..."""

    @staticmethod
    def generate_body(
        input_ids: list[int], sampling: SamplingParams, request_id: str, lora: str | None = None
    ) -> dict[str, Any]:
        """The /generate request: GenerateReqInput fields, sampling_params as SGLang's SamplingParams;
        `lora`: the loaded adapter to sample with."""
        sp: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_new_tokens": sampling.max_new_tokens,
            "stop": list(sampling.stop),
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:  # SGLang versions before sampling_seed reject unknown keys
            sp["sampling_seed"] = sampling.seed
        if sampling.constraint is not None:  # json_schema | ebnf | regex | structural_tag, SGLang's names
            sp[sampling.constraint.kind] = sampling.constraint.value
        body = {
            "input_ids": list(input_ids),
            "sampling_params": sp,
            "rid": request_id,
            "return_logprob": True,
        }
        if sampling.top_logprobs:
            body["top_logprobs_num"] = sampling.top_logprobs
        if sampling.return_routed_experts:  # MoE rollout routing (engines/routed_experts.py)
            body["return_routed_experts"] = True
        return body | ({"lora_path": lora} if lora is not None else {})

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation:
        body = self.generate_body(input_ids, sampling, request_id, self.lora_name)
        r = await self.request("POST", "/generate", body)
        meta = r["meta_info"]
        ids = list(r["output_ids"])
        logprobs = [float(x[0]) for x in meta["output_token_logprobs"]]
        versions = meta.get("output_token_versions")
        if versions is None:  # real SGLang: one weight_version per response; pause-abort splits at updates
            versions = [_int_version(meta.get("weight_version"), self.version)] * len(ids)
        tops = None
        if sampling.top_logprobs:
            tops = [
                [(int(t), float(lp)) for lp, t, *_ in top] for top in meta.get("output_top_logprobs") or []
            ]
        # SGLang reports the log-probs of the (masked) distribution it sampled from; not the unmasked ones
        return Generation(
            ids, logprobs, list(versions), FINISH[meta["finish_reason"]["type"]], top_logprobs=tops,
            routed_experts=routed_experts.from_meta(meta, request_id) if sampling.return_routed_experts else None,
        )  # fmt: skip

    @staticmethod
    def score_body(input_ids: list[int], start: int, request_id: str) -> dict[str, Any]:
        """GenerateReqInput asking for log-probs of given tokens and sampling nothing: max_new_tokens 0,
        logprob_start_len = start - 1 (SGLang's input_token_logprobs pair token L with None and token L+i,
        i >= 1, with its log-prob; io_struct.py, scheduler_components/logprob_result_processor.py)."""
        return {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
            "rid": request_id,
            "return_logprob": True,
            "logprob_start_len": start - 1,
        }

    async def score(self, input_ids: list[int], *, start: int, request_id: str) -> list[float]:
        """log p(input_ids[t] | input_ids[:t]) for t = start..len-1 (a distillation teacher's call)."""
        r = await self.request("POST", "/generate", self.score_body(input_ids, start, request_id))
        entries = r["meta_info"]["input_token_logprobs"][1:]
        return _scores(self.url, request_id, input_ids, start, [(e[1], e[0]) for e in entries])

    PAUSE_BODY = {"mode": "abort"}  # PauseGenerationReqInput
    # LoadLoRAAdapterReqInput / UnloadLoRAAdapterReqInput; the server needs --enable-lora (and --max-lora-rank)
    LORA_LOAD, LORA_UNLOAD = "/load_lora_adapter", "/unload_lora_adapter"

    async def _lora_call(self, path: str, body: dict[str, Any]) -> None:
        r = await self.request("POST", path, body)
        if not (r or {}).get("success", False):
            raise EngineError(
                f"{self.url}{path} ({body.get('lora_name')}) failed: {(r or {}).get('error_message') or r}"
            )

    @staticmethod
    def version_body(version: int) -> dict[str, Any]:
        """UpdateWeightVersionReqInput: in-flight requests were aborted by the pause already."""
        return {"new_version": str(version), "abort_all_requests": False}

    async def _after_adapter(self, version: int) -> None:
        await self.request("POST", "/update_weight_version", self.version_body(version))

    @staticmethod
    def update_body(path: str, version: int) -> dict[str, Any]:
        """UpdateWeightFromDiskReqInput: SGLang's weight_version is a string."""
        return {"model_path": path, "weight_version": str(version)}

    async def pause(self) -> None:
        await self.request("POST", "/pause_generation", self.PAUSE_BODY)

    async def resume(self) -> None:
        await self.request("POST", "/continue_generation", {})

    async def update_weights(
        self, *, version: int, path: str | None = None, tensors: Mapping[str, Any] | None = None
    ) -> None:
        with weights_dir(path, tensors) as d:
            r = await self.request("POST", "/update_weights_from_disk", self.update_body(d, version))
        if not r.get("success", False):
            raise EngineError(f"{self.url}: update_weights_from_disk failed: {r.get('message')}")
        self.version = version

    # ---- distributed weight update (agent_rl/weights/group.py): SGLang endpoints; our server has them too ----

    BEGIN_BODY: dict[str, Any] = {}  # BeginWeightUpdateReqInput (selector defaults to "all")
    END_BODY: dict[str, Any] = {}  # EndWeightUpdateReqInput

    @staticmethod
    def init_group_body(spec: GroupSpec, rank_offset: int) -> dict[str, Any]:
        """InitWeightsUpdateGroupReqInput."""
        return {
            "master_address": spec.endpoint.address,
            "master_port": spec.endpoint.port,
            "rank_offset": rank_offset,
            "world_size": spec.world_size,
            "group_name": spec.group_name,
            "backend": spec.endpoint.backend,
        }

    @staticmethod
    def distributed_update_body(meta: TensorMeta, version: int, group_name: str) -> dict[str, Any]:
        """UpdateWeightsFromDistributedReqInput: tensors announced in broadcast order; weight_version a string."""
        return {
            "names": list(meta.names),
            "dtypes": list(meta.dtypes),
            "shapes": [list(s) for s in meta.shapes],
            "group_name": group_name,
            "flush_cache": True,
            "weight_version": str(version),
        }

    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"

    async def weight_group_size(self) -> int:
        """Ranks this server takes in a weight group: its tp size (/server_info; SGLang refuses dp > 1)."""
        info = await self.request("GET", "/server_info")
        tp, dp, pp = (int(info.get(k) or 1) for k in ("tp_size", "dp_size", "pp_size"))
        if dp != 1 or pp != 1:
            raise EngineError(
                f"{self.url}: dp_size={dp}, pp_size={pp}; update_weights_from_distributed needs one "
                "tensor-parallel group per server (start one server per data-parallel replica)"
            )
        return tp

    async def init_weights_update_group(self, spec: GroupSpec, rank_offset: int) -> None:
        """Join the trainer's group as ranks rank_offset .. rank_offset + tp - 1; returns once all have joined."""
        await self._checked("/init_weights_update_group", self.init_group_body(spec, rank_offset))

    async def update_weights_from_distributed(
        self, meta: TensorMeta, *, version: int, group_name: str
    ) -> None:
        """Receive `meta`'s tensors by broadcast from rank 0 (which sends them concurrently) as `version`.

        SGLang loads distributed weights only inside a begin/end weight-update session.
        """
        await self._checked("/begin_weight_update", self.BEGIN_BODY)
        try:
            await self._checked(
                "/update_weights_from_distributed", self.distributed_update_body(meta, version, group_name)
            )
        except BaseException:
            # close the session; the update's own error is the one to report
            with contextlib.suppress(EngineError):
                await self._checked("/end_weight_update", self.END_BODY)
            raise
        await self._checked("/end_weight_update", self.END_BODY)
        self.version = version

    async def destroy_weights_update_group(self, group_name: str) -> None:
        await self._checked("/destroy_weights_update_group", {"group_name": group_name})

    async def _checked(self, path: str, body: dict[str, Any]) -> None:
        r = await self.request("POST", path, body)
        if not (r or {}).get("success", False):
            raise EngineError(f"{self.url}{path} failed: {(r or {}).get('message')}")


def _scores(
    url: str, rid: str, input_ids: list[int], start: int, pairs: list[tuple[Any, Any]]
) -> list[float]:
    """The log-prob of each (token id, log-prob) pair a server answered for input_ids[start:], checked."""
    want = input_ids[start:]
    if [int(t) for t, _ in pairs] != want or any(lp is None for _, lp in pairs):
        raise EngineError(
            f"{url} ({rid}): asked for the log-probs of {len(want)} tokens from position {start}, got "
            f"{len(pairs)} entries that do not match them (ids {[t for t, _ in pairs][:5]}...)"
        )
    return [float(lp) for _, lp in pairs]


def _int_version(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


class VLLMClient(HTTPEngine):
    """vLLM's OpenAI server (`vllm serve`, started with VLLM_SERVER_DEV_MODE=1 for /pause, /resume and
    /collective_rpc). Streams /v1/completions with token-id prompts, so a pause (which aborts vLLM's
    requests) still returns the tokens produced so far. vLLM does not report versions per token:
    tokens carry the version this client last pushed when the request started (a pause-update-resume
    cycle never lets one request span two versions). Start vLLM with `--logprobs-mode processed_logprobs`
    to get log-probs of the sampling distribution (its default is the raw model log-softmax).
    """

    def __init__(self, url: str, *, model: str | None = None, **kw):
        super().__init__(url, **kw)
        self.model = model

    # our Constraint kinds -> vLLM's StructuredOutputsParams fields (vllm/sampling_params.py)
    STRUCTURED = {
        "json_schema": "json",
        "ebnf": "grammar",
        "regex": "regex",
        "structural_tag": "structural_tag",
    }

    @classmethod
    def structured_outputs(cls, sampling: SamplingParams) -> dict[str, Any] | None:
        c = sampling.constraint
        return None if c is None else {cls.STRUCTURED[c.kind]: c.value}

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation:
        if self.model is None:
            self.model = (await self.request("GET", "/v1/models"))["data"][0]["id"]
        version = self.version
        body: dict[str, Any] = {
            "model": self.lora_name or self.model,  # vLLM: a loaded LoRA adapter is addressed as a model
            "prompt": list(input_ids),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "stop": list(sampling.stop),
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "seed": sampling.seed,
            "logprobs": sampling.top_logprobs,
            "structured_outputs": self.structured_outputs(sampling),
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "stream": True,
        }
        ids: list[int] = []
        logprobs: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        finish = None
        headers = {"X-Request-Id": request_id}
        try:
            async with self.session().post(self.url + "/v1/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    check_status(r.status, f"POST {self.url}/v1/completions ({request_id})", await r.text())
                async for raw in r.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:
                        raise EngineError(f"{self.url} ({request_id}): {chunk['error']}")
                    choice = chunk["choices"][0]
                    lp = choice.get("logprobs") or {}
                    ids += [int(t.removeprefix("token_id:")) for t in lp.get("tokens", [])]
                    logprobs += [float(x) for x in lp.get("token_logprobs", [])]
                    for top in lp.get("top_logprobs") or [] if sampling.top_logprobs else []:
                        tops.append(
                            [(int(t.removeprefix("token_id:")), float(v)) for t, v in (top or {}).items()]
                        )
                    finish = choice.get("finish_reason") or finish
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            if not ids:
                raise EngineUnavailable(f"POST {self.url}/v1/completions ({request_id}): {e}") from e
        # A stream cut short (pause with mode=abort, server going away mid-request) is an abort.
        return Generation(
            ids,
            logprobs,
            [version] * len(ids),
            FINISH.get(finish or "abort", "abort"),
            top_logprobs=tops if sampling.top_logprobs else None,
        )

    def score_body(self, input_ids: list[int]) -> dict[str, Any]:
        """CompletionRequest for log-probs of given tokens: prompt_logprobs=0 returns, per prompt position t >= 1,
        {token id: Logprob} holding the prompt's own token (position 0: None); max_tokens must be >= 1
        (SamplingParams), so one greedy token is sampled and dropped."""
        return {
            "model": self.lora_name or self.model,
            "prompt": list(input_ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }

    async def score(self, input_ids: list[int], *, start: int, request_id: str) -> list[float]:
        """log p(input_ids[t] | input_ids[:t]) for t = start..len-1 (a distillation teacher's call)."""
        if self.model is None:
            self.model = (await self.request("GET", "/v1/models"))["data"][0]["id"]
        r = await self.request(
            "POST", "/v1/completions", self.score_body(input_ids), headers={"X-Request-Id": request_id}
        )
        plp = r["choices"][0].get("prompt_logprobs") or []
        pairs = [
            (t, (e or {}).get(str(t), {}).get("logprob"))
            for t, e in zip(input_ids[start:], plp[start:], strict=False)
        ]
        return _scores(self.url, request_id, input_ids, start, pairs)

    async def pause(self) -> None:
        await self.request("POST", "/pause", params={"mode": "abort"})

    # LoadLoRAAdapterRequest / UnloadLoRAAdapterRequest: the server needs --enable-lora and
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (engines/vllm_local.py sets both when learner.lora is set)
    LORA_LOAD, LORA_UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"

    async def _lora_call(self, path: str, body: dict[str, Any]) -> None:
        await self.request("POST", path, body, text_reply=True)  # answers plain text; errors are 4xx

    async def _after_adapter(self, version: int) -> None:
        await self.request("POST", "/reset_prefix_cache")
        await self.request("POST", "/update_weight_version", {"new_version": str(version)})

    async def resume(self) -> None:
        await self.request("POST", "/resume")

    async def update_weights(
        self, *, version: int, path: str | None = None, tensors: Mapping[str, Any] | None = None
    ) -> None:
        with weights_dir(path, tensors) as d:
            await self.request(
                "POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": d}}
            )
        await self.request("POST", "/reset_prefix_cache")  # cached keys were computed by the old weights
        await self.request("POST", "/update_weight_version", {"new_version": str(version)})
        self.version = version


@contextlib.contextmanager
def weights_dir(path: str | None, tensors: Mapping[str, Any] | None) -> Iterator[str]:
    """The directory a server reloads from: `path`, or `tensors` written to /dev/shm for the call (removed
    after it, whatever the server answered)."""
    if (path is None) == (tensors is None):
        raise BadRequest("update_weights needs exactly one of path= or tensors=")
    if tensors is None:
        yield str(path)
        return
    tmp = write_shm_checkpoint(tensors)
    try:
        yield str(tmp)
    finally:
        remove_checkpoint(tmp)
