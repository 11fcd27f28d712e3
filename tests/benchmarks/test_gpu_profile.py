"""benchmarks/gpu_profile.py: the profiled cells on tiny shapes on CPU (the code path the GPU run takes), and the
kernel-kind table on kernel names a CUDA profile of these cells reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_profile import KINDS, PROFILED, SYNC_CALLS, kind_of  # noqa: E402


@pytest.mark.parametrize(
    ("kernel", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", "matmul"),
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_nn_align8>", "matmul"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>", "attention"),
        ("_cross_entropy_kernel", "loss head"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>", "loss head"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"),
        ("void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>", "copies"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)>", "elementwise / reduce"),
        ("aten::mm", "matmul"),
    ],
)  # fmt: skip
def test_kernels_fall_in_the_kind_their_name_says(kernel: str, kind: str) -> None:
    assert kind_of(kernel) == kind


@pytest.mark.parametrize(
    ("call", "blocks"),
    [("cudaStreamSynchronize", True), ("cudaDeviceSynchronize", True), ("cudaEventSynchronize", True),
     ("cudaLaunchKernel", False), ("cudaMemcpyAsync", False), ("cudaStreamWaitEvent", False)],
)  # fmt: skip
def test_only_the_calls_that_block_the_host_count_as_syncs(call: str, blocks: bool) -> None:
    assert bool(SYNC_CALLS.match(call)) is blocks


@pytest.mark.slow
@pytest.mark.heavy  # seven profiled learner builds in a subprocess (~35 s): CI's second job, off make test's budget
def test_cpu_smoke_profiles_every_cell_and_splits_its_busy_time_by_kind(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--cpu-smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_profile_smoke.json").read_text())
    md = (tmp_path / "gpu_profile_smoke.md").read_text()
    assert len(res["cells"]) == len(PROFILED)
    kinds = {k for k, _ in KINDS} | {"other"}
    for r in res["cells"]:
        assert r["status"] == "ok", r
        assert r["wall_s"] > 0 and r["device_busy_s"] > 0
        assert set(r["by_kind_s"]) <= kinds
        # the kinds partition the busy time: the same float seconds summed in another order (1e-9 s slack)
        assert sum(r["by_kind_s"].values()) == pytest.approx(r["device_busy_s"], abs=1e-9)
        assert r["top"] and all(t["kind"] == kind_of(t["kernel"]) for t in r["top"])
        assert r["sync_calls"] == 0 and r["syncs"] == {}  # a CPU step has no device to wait for
        assert f"| {r['name']} |" in md


@pytest.mark.slow
@pytest.mark.heavy  # profiled learner builds in a subprocess: CI's second job
def test_a_run_killed_half_way_keeps_the_cells_it_profiled(tmp_path: Path) -> None:
    """The device tool's limit kills a run that overstays it: the results file written after each cell keeps the
    cells profiled so far, and says which were not reached."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--cpu-smoke", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        done = 0
        for line in proc.stdout:  # the run prints "  -> ok ..." once a cell's results are written
            done += line.startswith("  -> ")
            if done == 2:
                break
        assert done == 2, "the run ended before profiling two cells"
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    res = json.loads((tmp_path / "gpu_profile_smoke.json").read_text())
    status = [r["status"] for r in res["cells"]]
    assert status[:2] == ["ok", "ok"] and len(status) == len(PROFILED), status
    assert all(s == "not_run" for s in status[3:]), status  # the third may have ended while the kill came
    md = (tmp_path / "gpu_profile_smoke.md").read_text()
    assert f"| {res['cells'][-1]['name']} | not_run: not reached yet |" in md
