"""Our SGLang request bodies and server fields use SGLang's own names, checked against SGLang's source.

SGLang cannot be imported on a CPU machine (its io_struct chain needs CUDA builds of torchvision
and friends), so the request types are read from the source with `ast`: the annotated fields of
GenerateReqInput, SamplingParams, PauseGenerationReqInput, UpdateWeightFromDiskReqInput, AbortReq,
ContinueGenerationReqInput, and the distributed weight update's InitWeightsUpdateGroupReqInput,
UpdateWeightsFromDistributedReqInput, Begin/EndWeightUpdateReqInput, DestroyWeightsUpdateGroupReqInput.
The source comes from SGLANG_SRC (an unpacked `sglang` package directory), an installed `sglang`, or else
the sglang wheel itself: `pip download --no-deps sglang==SGLANG_VERSION` (no install), of which the
files read here are kept in ~/.cache/agent-rl/ (once; a 39 MB download).
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest

from agent_rl.engines import protocol
from agent_rl.engines.api import SamplingParams
from agent_rl.engines.client import SGLangClient
from agent_rl.weights.group import Endpoint, GroupSpec, TensorMeta

BASE_REQ = {"rid", "http_worker_ipc"}  # fields every BaseReq carries


SGLANG_VERSION = "0.5.23"  # the version the README names; bump it here to check a newer SGLang
SOURCES = (
    "srt/managers/io_struct.py",
    "srt/sampling/sampling_params.py",
    "srt/server_args.py",
    "srt/arg_groups/fields/parallel.py",
)


def sglang_dir() -> Path:
    if src := os.environ.get("SGLANG_SRC"):
        return Path(src)
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return sglang_from_wheel(SGLANG_VERSION)


def sglang_from_wheel(version: str) -> Path:
    """The files read here, from the sglang wheel (downloaded without its dependencies, never installed)."""
    import subprocess
    import sys
    import tempfile
    import zipfile

    from envs.spec import default_cache_root

    root = default_cache_root().parent / f"sglang-{version}" / "sglang"
    if all((root / f).is_file() for f in SOURCES):
        return root
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp]
        res = subprocess.run([*cmd, f"sglang=={version}"], capture_output=True, text=True, timeout=600)
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if res.returncode != 0 or not wheels:
            pytest.skip(
                f"cannot download the sglang {version} wheel (set SGLANG_SRC instead): {res.stderr[-300:]}"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            for f in SOURCES:
                (root / f).parent.mkdir(parents=True, exist_ok=True)
                (root / f).write_bytes(z.read(f"sglang/{f}"))
    return root


def class_fields(path: Path, name: str) -> set[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    raise AssertionError(f"{path}: class {name} not found")


@pytest.fixture(scope="module")
def sglang_types() -> dict[str, set[str]]:
    root = sglang_dir()
    io, sp = root / "srt" / "managers" / "io_struct.py", root / "srt" / "sampling" / "sampling_params.py"
    names = [
        "GenerateReqInput",
        "PauseGenerationReqInput",
        "UpdateWeightFromDiskReqInput",
        "AbortReq",
        "ContinueGenerationReqInput",
        "InitWeightsUpdateGroupReqInput",
        "UpdateWeightsFromDistributedReqInput",
        "DestroyWeightsUpdateGroupReqInput",
        "BeginWeightUpdateReqInput",
        "EndWeightUpdateReqInput",
        "LoadLoRAAdapterReqInput",
        "UnloadLoRAAdapterReqInput",
        "UpdateWeightVersionReqInput",
    ]
    types = {n: class_fields(io, n) | BASE_REQ for n in names}
    types["SamplingParams"] = class_fields(sp, "SamplingParams")
    return types


def test_sglang_client_request_bodies_use_sglang_field_names(sglang_types):
    body = SGLangClient.generate_body(
        [1, 2], SamplingParams(stop=("x",), stop_token_ids=(3,), seed=1, return_routed_experts=True), "rid-1"
    )
    assert "return_routed_experts" in body  # MoE rollout routing (engines/routed_experts.py)
    assert set(body) <= sglang_types["GenerateReqInput"]
    assert set(body["sampling_params"]) <= sglang_types["SamplingParams"]
    assert set(SGLangClient.PAUSE_BODY) <= sglang_types["PauseGenerationReqInput"]
    assert set(SGLangClient.update_body("/tmp/w", 3)) <= sglang_types["UpdateWeightFromDiskReqInput"]


def test_weight_group_request_bodies_use_sglang_field_names(sglang_types):
    spec = GroupSpec(Endpoint("10.0.0.1", 29500, "nccl"), world_size=9, group_name="g")
    init = SGLangClient.init_group_body(spec, rank_offset=1)
    assert set(init) <= sglang_types["InitWeightsUpdateGroupReqInput"]
    # every required field of SGLang's request is sent (the unannotated-default ones are optional)
    assert {"master_address", "master_port", "rank_offset", "world_size"} <= set(init)
    meta = TensorMeta(("lm_head.weight",), ("bfloat16",), ((8, 4),))
    update = SGLangClient.distributed_update_body(meta, 3, "g")
    assert set(update) <= sglang_types["UpdateWeightsFromDistributedReqInput"]
    assert (
        update["weight_version"] == "3" and update["dtypes"] == ["bfloat16"] and update["shapes"] == [[8, 4]]
    )
    assert set(SGLangClient.BEGIN_BODY) <= sglang_types["BeginWeightUpdateReqInput"]
    assert set(SGLangClient.END_BODY) <= sglang_types["EndWeightUpdateReqInput"]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (protocol.GenerateReq, "GenerateReqInput"),
        (protocol.SGLangSampling, "SamplingParams"),
        (protocol.PauseReq, "PauseGenerationReqInput"),
        (protocol.UpdateFromDiskReq, "UpdateWeightFromDiskReqInput"),
        (protocol.AbortReq, "AbortReq"),
        (protocol.ContinueReq, "ContinueGenerationReqInput"),
        (protocol.InitWeightsUpdateGroupReq, "InitWeightsUpdateGroupReqInput"),
        (protocol.UpdateWeightsFromDistributedReq, "UpdateWeightsFromDistributedReqInput"),
        (protocol.DestroyWeightsUpdateGroupReq, "DestroyWeightsUpdateGroupReqInput"),
        (protocol.BeginWeightUpdateReq, "BeginWeightUpdateReqInput"),
        (protocol.EndWeightUpdateReq, "EndWeightUpdateReqInput"),
    ],
)
def test_server_accepts_only_sglang_field_names(sglang_types, ours, theirs):
    assert set(ours.model_fields) <= sglang_types[theirs], set(ours.model_fields) - sglang_types[theirs]


def test_server_info_sizes_we_read_are_sglang_server_args():
    """SGLangClient.weight_group_size reads tp_size, dp_size and pp_size from /server_info (ServerArgs fields)."""
    root = sglang_dir()
    namespaced = (
        root / "srt" / "arg_groups" / "fields" / "parallel.py"
    )  # newer SGLang: ServerArgs in namespaces
    fields = (
        class_fields(namespaced, "Parallel")
        if namespaced.is_file()
        else class_fields(root / "srt" / "server_args.py", "ServerArgs")
    )
    assert {"tp_size", "dp_size", "pp_size"} <= fields


def test_lora_request_bodies_and_server_fields_use_sglang_field_names(sglang_types):
    """LoRA (learner.lora): SGLangClient's adapter calls and our server's LoRA routes use SGLang's names."""
    from agent_rl.engines.embedded.lora_routes import (
        LoadLoRAAdapterReq,
        UnloadLoRAAdapterReq,
        UpdateWeightVersionReq,
    )

    assert {"lora_name", "lora_path"} <= sglang_types["LoadLoRAAdapterReqInput"]
    assert {"lora_name"} <= sglang_types["UnloadLoRAAdapterReqInput"]
    assert set(SGLangClient.version_body(3)) <= sglang_types["UpdateWeightVersionReqInput"]
    body = SGLangClient.generate_body([1, 2], SamplingParams(), "rid", lora="policy-v3")
    assert body["lora_path"] == "policy-v3" and set(body) <= sglang_types["GenerateReqInput"]
    for ours, theirs in (
        (LoadLoRAAdapterReq, "LoadLoRAAdapterReqInput"),
        (UnloadLoRAAdapterReq, "UnloadLoRAAdapterReqInput"),
        (UpdateWeightVersionReq, "UpdateWeightVersionReqInput"),
    ):
        assert set(ours.model_fields) <= sglang_types[theirs], set(ours.model_fields) - sglang_types[theirs]


def test_the_teachers_scoring_request_uses_sglang_field_names(sglang_types):
    """A distillation teacher's call (agent_rl/teacher): /generate with max_new_tokens 0 and logprob_start_len."""
    body = SGLangClient.score_body([1, 2, 3, 4], 2, "teacher/g0/1.0")
    assert set(body) <= sglang_types["GenerateReqInput"]
    assert set(body["sampling_params"]) <= sglang_types["SamplingParams"]
    assert body["logprob_start_len"] == 1 and body["sampling_params"]["max_new_tokens"] == 0
