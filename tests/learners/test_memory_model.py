"""The memory model (agent_rl/learners/memory.py): its counts against the models, against what autograd saves,
against peaks measured in a fresh process on CPU, and against every peak benchmarks/results/gpu_learners.json
records on a GPU; the warning that `agent-rl train` prints before a run that cannot fit."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from agent_rl.learners import memory as mm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _learner_bench import QWEN25_05B, SMALL, Cell, Rank, batch, write_model  # noqa: E402

H200_BYTES = 141 * 10**9


def _qwen(**kw) -> dict:
    return QWEN25_05B | {"model_type": "qwen2"} | kw


@pytest.mark.parametrize(
    "cls, cfg",
    [
        ("Qwen2", _qwen()),  # Qwen2.5-0.5B: tied embeddings, q/k/v biases
        ("Qwen2", _qwen(tie_word_embeddings=False, num_hidden_layers=2)),
        ("Llama", {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160}),
        ("Qwen3", {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160, "head_dim": 32}),
    ],
)  # fmt: skip
def test_parameter_count_equals_the_transformers_model(cls: str, cfg: dict) -> None:
    import transformers

    config = getattr(transformers, f"{cls}Config")(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):  # shapes only: a 0.5B model costs nothing here
        model = getattr(transformers, f"{cls}ForCausalLM")(config)
    assert mm.ModelDims.from_config(cfg).params == sum(p.numel() for p in model.parameters())


def test_qwen25_05b_is_494m_parameters() -> None:
    assert mm.ModelDims.from_config(_qwen()).params == 494_032_768  # Qwen2.5-0.5B's model card: 0.49B


def test_lora_parameters_equal_peft_adapters(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(write_model(tmp_path / "m", SMALL))
    peft = get_peft_model(model, LoraConfig(r=8, target_modules=list(mm.LORA_TARGETS)))
    trainable = sum(p.numel() for p in peft.parameters() if p.requires_grad)
    assert mm.ModelDims.from_model_dir(tmp_path / "m").lora_params(8) == trainable


def _saved_activation_bytes(fn, model: torch.nn.Module) -> int:
    """Bytes of the distinct storages autograd saves for backward while fn() runs, weights (and autocast's
    copies of them: a parameter's shape, or its transpose) left out."""
    weight_shapes = {tuple(p.shape) for p in model.parameters()} | {
        tuple(p.shape)[::-1] for p in model.parameters()
    }
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if tuple(t.shape) not in weight_shapes:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("backend", ["torch", pytest.param("megatron", marks=pytest.mark.megatron)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_per_layer_activations_are_what_autograd_saves(tmp_path: Path, backend: str, dtype: str) -> None:
    """One more layer saves exactly the model's per-token count for each token: the difference of a 2-layer
    and a 1-layer model (200 tokens: no activation has a weight's shape)."""
    tokens = 200
    saved = {}
    for layers in (1, 2):
        model_dir = write_model(tmp_path / f"l{layers}", SMALL | {"num_hidden_layers": layers})
        rank = Rank(model_dir, Cell(backend, tokens, 2, dtype=dtype), "cpu")  # type: ignore[arg-type]
        b = batch(2, tokens, SMALL["vocab_size"])
        saved[layers] = _saved_activation_bytes(
            lambda rank=rank, b=b: rank.logprobs(b.input_ids[:1], b.attention_mask[:1]), rank.model
        )
    dims = mm.ModelDims.from_config(SMALL | {"model_type": "qwen2"})
    setup = mm.Setup(backend=backend, compute_dtype=dtype)  # type: ignore[arg-type]
    per_token = mm._per_layer_token_bytes(dims, setup)  # megatron: SDPAttention, no [heads, S, S] scores
    assert saved[2] - saved[1] == per_token * tokens


def _model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("mem") / "small", SMALL)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_dir(tmp_path_factory)


MEASURED_CELLS = {
    "torch": [
        Cell("torch", 2048, 2, dtype="float32"),  # exact OPOB: one trajectory per backward
        Cell("torch", 1024, 4, opob="proxy", recompute=True, dtype="float32"),  # 4 rows per forward
    ],
    "megatron": [
        Cell("megatron", 2048, 2, dtype="float32"),  # SDPAttention, chunked log-probs
        # bf16 model + fp32 main copies, full recompute
        Cell("megatron", 8192, 2, recompute=True, dtype="bfloat16"),
    ],
}


def _left_out(dims: mm.ModelDims, setup: mm.Setup, tokens: int) -> int:
    """Bytes the model leaves out of a step's peak on CPU (where the counter is exact: no allocator rounding): the
    [t, h]-sized tensors its terms do not name, alive beside the peak's workspace: the embedding's output, the
    final norm's casts and intermediates, the log-prob head's input gradient. Four fp32 [t, h] tensors bound them:
    the profiler's trace of the peaks (2026-12-06) shows, beside the named terms, three [t, h] tensors and a half
    one in the model's dtype for Megatron's 2x8192 bf16 cell, and two [t, h] fp32 ones for the torch 2x2048 cell."""
    return 4 * 4 * dims.hidden * setup.rows_per_forward(tokens) * tokens


def _over_counted(dims: mm.ModelDims, setup: mm.Setup, tokens: int) -> int:
    """Bytes the model may count above a step's peak on CPU: the allowance inside the workspace term its peak
    phase picked. The log-prob workspace: the torch learner's chunked head is bounded by the full log-softmax's 12
    bytes per [token, vocab] entry where it holds 8 in fp32 (10 in bf16) (memory._logprob_workspace); Megatron's
    head is counted as it runs. One layer's backward: the model allows half the layer's activations for the
    gradients one block holds at once, which the backward may spend only in part (the profiler's trace of the
    proxy 4x1024 cell, 2026-12-06: six 4 MiB gradients of the MLP's backward against 12.5 MiB allowed)."""
    t = setup.rows_per_forward(tokens) * tokens
    est = mm.step_memory(dims, setup, tokens)
    workspace = next(x.bytes for x in est.terms if x.name == "peak_workspace")
    if setup.backend == "megatron":
        logprob, over = mm._megatron_logprob_workspace(dims, setup, t), 0
    else:
        logprob = mm._logprob_workspace(dims, setup, t)
        span = min(t, setup.logprob_chunk_tokens) if setup.logprobs == "chunked" else t
        over = (12 - (8 if setup.compute_dtype == "float32" else 10)) * dims.vocab * span
    return over if workspace == logprob else mm._per_layer_token_bytes(dims, setup) * t // 2


# The Megatron cells run in make test-heavy (their time, ~40 s, is what the default job cannot spare).
@pytest.mark.parametrize(
    "backend", ["torch", pytest.param("megatron", marks=[pytest.mark.megatron, pytest.mark.heavy])]
)
def test_estimate_is_within_what_it_leaves_out_of_the_measured_peak(small_model: Path, backend: str) -> None:
    """Measured: a fresh process's peak of live tensor bytes over one step, as torch's CPU allocator counts them
    (benchmarks/_cpu_peak.py, counter "tensors": what torch.cuda.max_memory_allocated counts on a GPU; resident
    memory also counts a varying 10-25 MiB of non-tensor memory here). The band is what the model leaves out
    (`_left_out`) above the estimate and what it over-counts (`_over_counted`) below it, not a percentage."""
    from _cpu_peak import measure
    from gpu_learners import setup_for

    cells = MEASURED_CELLS[backend]
    cases = [{"model_dir": str(small_model), "cell": _fields(c)} for c in cells]
    measured = measure(cases, counter="tensors")
    dims = mm.ModelDims.from_model_dir(small_model)
    for cell, res in zip(cells, measured, strict=True):
        peak = res["peak_bytes"]
        setup = setup_for(cell, "cpu", dims)
        est = mm.step_memory(dims, setup, cell.length).total
        low, high = est - _over_counted(dims, setup, cell.length), est + _left_out(dims, setup, cell.length)
        assert low <= peak <= high, (cell.name, low, est, high, peak)


# Deep and narrow, small vocabulary: the layers' checkpoints, which a held proxy group multiplies, outweigh the
# log-prob workspace (on SMALL it is the other way round, and a group's second graph is ~1.5 of ~15 MiB).
DEEP = SMALL | {"vocab_size": 256, "hidden_size": 128, "num_hidden_layers": 12, "intermediate_size": 256}


def test_a_proxy_group_held_under_recompute_is_counted_and_within_25_percent(tmp_path: Path) -> None:
    """Proxy OPOB, full recompute, one row per forward and groups of 2: the torch learner keeps both graphs of
    a group until its baseline is known (vcpo StepConfig.proxy_hold_group), so both rows' checkpoints are alive;
    with learner.proxy_hold_group false (a forward-only pass first) one graph at a time. Both peaks within 25 %
    of the model, and the hold's own cost (the peaks' difference) is the model's: a learner that stopped
    holding would measure two equal peaks, which the 25 % bands alone would not tell apart."""
    from _cpu_peak import measure
    from _learner_bench import GROUP
    from gpu_learners import setup_for

    model = write_model(tmp_path / "deep", DEEP)
    length = 1024
    held = Cell("torch", length, 4, opob="proxy", recompute=True, dtype="float32", micro_batch_tokens=length)
    unheld = dataclasses.replace(held, hold_group=False)  # learner.proxy_hold_group: false
    dims = mm.ModelDims.from_model_dir(model)
    setup = {c: setup_for(c, "cpu", dims) for c in (held, unheld)}
    assert setup[held].rows_per_forward(length) == 1 and setup[held].rows_held(length) == GROUP
    assert setup[unheld].rows_held(length) == 1
    est = {c: mm.step_memory(dims, s, length) for c, s in setup.items()}
    one = mm.step_memory(dims, dataclasses.replace(setup[held], group_rows=1), length)  # one graph alive
    assert est[unheld].total == one.total
    ckpt = {
        e: next(t.bytes for t in x.terms if t.name == "checkpoints")
        for e, x in (("held", est[held]), ("one", one))
    }
    assert ckpt["held"] == GROUP * ckpt["one"]
    measured = measure(
        [{"model_dir": str(model), "cell": _fields(c)} for c in (held, unheld)], counter="tensors"
    )
    peak = {c: r["peak_bytes"] for c, r in zip((held, unheld), measured, strict=True)}  # live tensor bytes
    for c in (held, unheld):
        assert 0.75 <= est[c].total / peak[c] <= 1.25, (c.name, est[c].total, peak[c])
    # The hold keeps a second row's saved tensors (its layers' checkpoints, its embedding/norm/RoPE outputs): whole
    # tensors of known shapes, which the model counts exactly. Both schedules peak in the same phase (a row's
    # recomputed forward and backward), so the workspace at the peak is alike in both and cancels in the
    # difference; what remains is the small per-op temporaries the model leaves out, the same that put each peak
    # within 25 % of its estimate. A learner that stopped holding would measure a difference near 0.
    want = est[held].total - est[unheld].total
    assert want >= ckpt["held"] - ckpt["one"] > 0
    got = peak[held] - peak[unheld]
    assert 0.75 * want <= got <= 1.25 * want, (got, want)


def _fields(cell: Cell) -> dict:
    return {k: v for k, v in cell.as_dict().items() if k not in ("name", "tokens")}


def _recorded_gpu_cells() -> list:
    """Every learner cell benchmarks/results/gpu_learners.json records with a measured peak (the anchor, another
    library, has no estimate), as (name, Cell, measured peak bytes)."""
    res = json.loads((ROOT / "benchmarks" / "results" / "gpu_learners.json").read_text())
    fields = {f.name for f in dataclasses.fields(Cell)}
    return [
        pytest.param(
            Cell(**{k: v for k, v in c.items() if k in fields}), c["peak_gib"] * mm.GiB, id=c["name"]
        )
        for c in res["cells"]
        if c["status"] == "ok" and c["backend"] != "anchor" and c.get("peak_gib") is not None
    ]


@pytest.mark.parametrize("cell, peak", _recorded_gpu_cells())
def test_estimate_is_within_25_percent_of_every_recorded_gpu_peak(cell: Cell, peak: float) -> None:
    """The model (today's, through the recipe a user would write for the cell) against the peak the GPU run
    measured (torch.cuda.max_memory_allocated, the 0.5B shape). 25 %: issue 33's acceptance bound; on a GPU the
    caching allocator's rounding and the kernels' workspaces are not in the model. Exact OPOB's two gradient-sized
    sums are 22-24 % of the exact cells' peaks: a model without them leaves two cells below the band."""
    from gpu_learners import setup_for

    dims = mm.ModelDims.from_config(_qwen())
    est = mm.step_memory(dims, setup_for(cell, "cuda", dims), cell.length).total
    assert 0.75 <= est / peak <= 1.25, (cell.name, est / mm.GiB, peak / mm.GiB)


def test_the_recorded_gpu_cells_are_there() -> None:
    assert len(_recorded_gpu_cells()) >= 7  # the 2026-11-28 H200 run: seven learner cells measured


# Measured on one H200 (issue 33, 2026-11-26, bf16 autocast, the 0.5B shape), a configuration gpu_learners.json has
# no cell of: Megatron's local spec with eager attention, one 4096-token trajectory, 59.7 GiB.
def test_estimate_is_within_25_percent_of_megatrons_eager_attention_on_an_h200() -> None:
    setup = mm.Setup(
        backend="megatron", compute_dtype="bfloat16", device="cuda", attention="eager", packed=True
    )
    est = mm.step_memory(mm.ModelDims.from_config(_qwen()), setup, 4096).total / mm.GiB
    assert 0.75 <= est / 59.7 <= 1.25, est


def test_megatron_eager_attention_cannot_hold_8k_on_an_h200_and_fused_attention_can_hold_128k() -> None:
    """Issue 33: 8192 tokens did not fit on the H200 with the local spec; O(S) attention + recompute must."""
    dims = mm.ModelDims.from_config(_qwen())
    eager = mm.Setup(
        backend="megatron", compute_dtype="bfloat16", device="cuda", attention="eager", packed=True
    )
    assert mm.max_trajectory_tokens(dims, eager, H200_BYTES) < 8192
    fused = mm.Setup(backend="megatron", compute_dtype="bfloat16", device="cuda", recompute="full",
                     logprobs="chunked")  # fmt: skip
    assert mm.max_trajectory_tokens(dims, fused, H200_BYTES) >= 131072


def test_max_trajectory_tokens_is_the_longest_that_fits() -> None:
    dims = mm.ModelDims.from_config(_qwen())
    setup = mm.Setup(compute_dtype="bfloat16", device="cuda", recompute="full")
    budget = 80 * mm.GiB
    n = mm.max_trajectory_tokens(dims, setup, budget)
    assert mm.step_memory(dims, setup, n).total <= budget < mm.step_memory(dims, setup, n + 1).total
    assert mm.max_trajectory_tokens(dims, setup, mm.step_memory(dims, setup, 1).total - 1) == 0


def _recipe(model_dir: Path, **learner):
    from agent_rl.config import Recipe

    return Recipe.model_validate({
        "name": "mem", "model": {"path": str(model_dir)}, "envs": {"train": "unused.yaml"},
        "train": {"steps": 1, "batch_prompts": 1}, "engines": {"max_seq_len": 65536}, "learner": learner,
    })  # fmt: skip


def test_check_recipe_warns_with_the_numbers_and_what_to_change(small_model: Path) -> None:
    recipe = _recipe(small_model)
    dims = mm.ModelDims.from_model_dir(small_model)
    need = mm.step_memory(dims, mm.setup_of(recipe, dims, "cuda"), 65536).total
    small_gpu = mm.DeviceMemory("cuda:0 (test)", need // 2)
    warning = mm.check_recipe(recipe, small_gpu)
    assert warning is not None and "65536-token trajectory (engines.max_seq_len)" in warning
    assert "learner.gradient_checkpointing: true" in warning and "learner.dtype: bfloat16" in warning
    assert mm.check_recipe(recipe, mm.DeviceMemory("cuda:0 (test)", need)) is None


def test_check_recipe_offers_to_stop_holding_a_proxy_group_only_where_one_is_held(small_model: Path) -> None:
    from agent_rl.config import Recipe

    def warning(**learner) -> str:
        recipe = Recipe.model_validate(_recipe(small_model, **learner).model_dump() | {
            "algorithm": {"advantage": "opob", "opob_mode": "proxy"},
            "envs": {"train": str(ROOT / "envs" / "tiny_arith.yaml")},  # groups of 8
        })  # fmt: skip
        return mm.check_recipe(recipe, mm.DeviceMemory("cuda:0 (test)", 1)) or ""

    remedy = "set learner.proxy_hold_group: false"
    # one trajectory per forward (micro_batch_tokens), groups of 8 held under recompute: the group is the cost
    assert remedy in warning(gradient_checkpointing=True, micro_batch_tokens=1024)
    assert remedy not in warning(gradient_checkpointing=True, micro_batch_tokens=1024, proxy_hold_group=False)
    assert remedy not in warning(micro_batch_tokens=1024)  # no recompute: nothing held


def test_train_dry_run_prints_the_memory_warning(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    """The CLI path: a recipe whose longest trajectory (engines.max_seq_len) needs more than this machine has."""
    from agent_rl.trainer import main_train

    recipe = tmp_path / "r.yaml"
    env = ROOT / "envs" / "tiny_arith.yaml"
    recipe.write_text(json.dumps({
        "name": "mem", "model": {"path": str(tiny_model_dir)}, "envs": {"train": str(env)},
        "train": {"steps": 1, "batch_prompts": 1}, "engines": {"max_seq_len": 1 << 24},
        "logging": {"run_dir": str(tmp_path / "run")},
    }))  # fmt: skip
    assert main_train([str(recipe), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "warning: learner memory: a step on one 16777216-token trajectory" in err
