"""Meta-tests of the performance page's rendering (tools/benchmarks/report.py): what a row says follows
the raw numbers, including the target's verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.meta


def _suite(walls: list[float], failed: int = 0) -> dict:
    d = {"device": "cpu", "workers": 2, "tests": 1500, "failed": failed, "worker_s": 180.0,
         "wall_s": sorted(walls)[(len(walls) - 1) // 2],
         "slowest_files": [{"file": "meta/test_verdict.py", "worker_s": 40.0}]}
    if len(walls) > 1:
        d["wall_s_all"] = sorted(walls)
    return d


@pytest.mark.parametrize("walls, failed, shown, verdict", [
    ([97.4], 0, "97 s wall, 1500 tests", "met"),  # a file written before --runs: one run, no spread
    ([131.0, 96.0, 104.0], 0, "104 s wall, median of 3 runs (96-131 s)", "met"),
    ([118.0, 125.0, 122.0], 0, "122 s wall, median of 3 runs (118-125 s)", "**missed**"),
    ([90.0, 95.0, 99.0], 1, "95 s wall, median of 3 runs (90-99 s), 1500 tests, 1 failed", "**missed**"),
])
def test_the_suite_row_shows_the_median_its_spread_and_the_verdict(walls, failed, shown, verdict):
    from tools.benchmarks.report import (
        suite_rows,  # a checkout's tools/, not part of the installed package
    )

    (row,) = suite_rows(_suite(walls, failed))
    assert shown in row[1]
    assert row[-1] == f"≤ 120 s: {verdict}"


@pytest.mark.parametrize("times, spread", [
    ({"reference": [2.0, 2.0, 2.1], "peer": [3.0, 2.8, 3.0]}, 3.0 / 2.8 - 1),  # the worse of 0.05 and 0.071
    ({"reference": [3.2, 2.0, 2.5], "peer": [2.9, 2.8, 3.3]}, 3.2 / 2.0 - 1),
    # five rounds or more: the fastest and the slowest round of each contender are left out
    ({"reference": [2.06, 1.97, 1.94, 2.17, 2.54], "peer": [2.9, 2.77, 2.78, 2.77, 2.95]}, 2.17 / 1.97 - 1),
    ({"reference": [3.21, 2.04, 2.48, 2.02, 2.28], "peer": [2.87, 2.8, 3.31, 2.8, 2.74]}, 2.48 / 2.04 - 1),
    ({}, 0.0),
])
def test_round_spread_is_the_worst_contenders_slowest_over_fastest(times, spread):
    from tools.benchmarks.spread import round_spread

    assert round_spread(times) == pytest.approx(spread)


@pytest.mark.parametrize("times, busy", [
    ([2.0, 2.05, 1.98, 2.02, 2.01], False),
    ([2.06, 1.97, 1.94, 2.17, 2.54], False),  # one disturbed round: the median of five is unaffected
    ([3.21, 2.04, 2.48, 2.02, 2.28], True),  # a run whose ratio of medians came out 0.1 low
])
def test_a_row_from_a_busy_run_says_so(times, busy):
    """The SAC and PPO rows carry the marker exactly when a contender's rounds disagree by more than
    BUSY_SPREAD (its single fastest and slowest round left out)."""
    from tools.benchmarks.report import ppo_rows, sac_rows

    sac = {"device": "cpu", "shape": {"batch": 2048, "actions": 6000, "obs": 384, "hidden": 256, "top_p": 0.98},
           "median_s": {"reference": 2.0, "torchrl": 2.8}, "gflops": {"reference": 48.0, "torchrl": 34.0},
           "pct_of_peak": {"reference": 49.0}, "matmul_peak_gflops": 98.0, "ratio": 1.4,
           "times_s": {"reference": times, "torchrl": [2.8] * 5}}
    ppo = {"device": "cpu", "shape": {"N": 4096, "minibatch": 128}, "ratio": 1.6,
           "samples_per_s": {"reference": 84e3, "sb3_contrib": 52e3},
           "times_s": {"reference": times, "sb3_contrib": [0.08] * 5}}
    for (row, *_) in (sac_rows(sac), ppo_rows(ppo)):
        assert ("busy machine" in row[3]) is busy, row[3]
        assert row[3].startswith("**1.")  # the figure itself is still shown


def test_a_gpu_run_shows_the_captured_and_the_compiled_update_each_against_torchrl():
    """A CUDA raw file with the compiled side gets its own row, its ratio and verdict from its own median."""
    from tools.benchmarks.report import sac_rows

    med = {"reference": 0.0093, "torchrl": 0.0082, "reference_graph": 0.0072, "reference_graph_compiled": 0.0050}
    sac = {"device": "cuda", "shape": {"batch": 2048, "actions": 6000, "obs": 384, "hidden": 256, "top_p": 0.98},
           "median_s": med, "gflops": {k: 1.0 for k in med}, "pct_of_peak": {k: 1.0 for k in med},
           "matmul_peak_gflops": 4.7e4, "ratio": 0.88, "kernel_launches": {"reference": 300, "torchrl": 170,
           "reference_graph": 1, "reference_graph_compiled": 1}, "provenance": {"gpu": {"name": "H", "driver": "1"}}}
    rows = {r[0].split(" [")[0]: r for r in sac_rows(sac)}
    graph = rows["SAC update at V2 scale, captured as one CUDA graph and replayed"]
    compiled = rows["SAC update at V2 scale, fused heads torch.compile'd, captured and replayed"]
    assert graph[3] == "**1.14**" and graph[4] == "≥ 1.5: **missed**"
    assert compiled[1] == "5.0 ms (captured, not compiled: 7.2 ms)"
    assert compiled[3] == "**1.64**" and compiled[4] == "≥ 1.5: met"


def test_interleave_gives_each_round_a_fresh_setup_and_rotates_the_order():
    import torch

    from tools.benchmarks._common import interleave

    calls: list[tuple[str, int]] = []
    fresh = iter(range(100))

    def make(name):
        return lambda: (next(fresh),), lambda arg: calls.append((name, arg))

    times = interleave({"a": make("a"), "b": lambda: calls.append(("b", -1))}, rounds=3,
                       device=torch.device("cpu"), warmup=1)
    assert [len(t) for t in times.values()] == [3, 3]
    assert [n for n, _ in calls] == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rotated rounds
    assert [arg for n, arg in calls if n == "a"] == [0, 1, 2, 3]  # one setup per call, its value passed on


@pytest.mark.parametrize("form", ["interleaved", "pytest-benchmark"])
def test_the_stdb_row_reads_both_raw_forms_and_judges_the_ratio(form):
    from tools.benchmarks.report import stdb_rows

    rate = {"sqlite_store": 3.0e5, "raw_executemany": 4.6e5, "raw_int_executemany": 7.7e5, "memory_store": 1.0e6,
            "dict": 5.0e6}
    if form == "interleaved":
        d = {"edge_updates_per_s": rate, "times_s": {k: [1.0, 1.01, 1.0, 0.99, 1.0] for k in rate}}
    else:
        d = {"benchmarks": [{"name": f"test_{k}", "extra_info": {"edge_updates_per_s": v}} for k, v in rate.items()]}
    (row,) = stdb_rows(d)
    assert row[3].startswith(f"**{3.0 / 4.6:.2f}**") and "busy" not in row[3]
    assert row[4] == "≥ 500k/s: **missed** here; as a ratio, ≥ 0.38 of raw text `executemany`: met"


def test_the_suite_row_against_a_baseline_gives_the_ratio_of_the_medians_and_its_verdict():
    from tools.benchmarks.report import suite_rows

    d = _suite([300.0, 280.0, 290.0])
    d["baseline"] = {"commit": "a18a895", "wall_s": 240.0, "wall_s_all": [230.0, 240.0, 250.0], "tests": 1500}
    d["ratio_to_baseline"] = 290.0 / 240.0
    (row,) = suite_rows(d)
    assert "`a18a895`" in row[2] and "240 s wall, median of 3 (230-250 s)" in row[2]
    assert row[3] == "**1.21** of its time" and row[-1] == "≤ 1.20: **missed**"
    d["ratio_to_baseline"] = 1.19
    assert suite_rows(d)[0][-1] == "≤ 1.20: met"


def test_the_side_by_side_bench_interleaves_the_checkouts_and_divides_the_medians(tmp_path, monkeypatch):
    from tools.benchmarks import bench_suite_time as bench

    base = tmp_path / "base"
    (base / "conformance_tests").mkdir(parents=True)
    walls = {bench.ROOT: iter([330.0, 300.0, 310.0]), base.resolve(): iter([250.0, 240.0, 260.0])}
    order, caches = [], []

    def fake_run(device, root, python, cache):
        order.append(root)
        caches.append(cache)
        return {"wall_s": next(walls[root]), "exit_code": 0, "tests": 10, "failed": 0, "by_file": {"test_a.py": 1.0}}

    monkeypatch.setattr(bench, "one_run", fake_run)
    res = bench.main(["--runs", "3", "--baseline", str(base), "--json", str(tmp_path / "out.json")])
    assert order == [bench.ROOT, base.resolve()] * 3  # one of each in turn
    assert caches[0::2] == [caches[0]] * 3 and caches[1::2] == [caches[1]] * 3 and caches[0] != caches[1]
    assert Path.home() not in caches[0].parents  # each checkout its own cache across its runs, not the machine's
    assert (res["wall_s"], res["baseline"]["wall_s"]) == (310.0, 250.0)  # the medians
    assert res["ratio_to_baseline"] == 310.0 / 250.0 and res["baseline"]["wall_s_all"] == [240.0, 250.0, 260.0]
    with pytest.raises(SystemExit):  # a directory that is no checkout of the project
        bench.main(["--baseline", str(tmp_path)])


def test_a_failed_test_is_named_with_its_module(tmp_path):
    from tools.benchmarks.bench_suite_time import per_file_seconds

    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="conformance_tests.meta.test_a" name="t1" time="2"/>'
                     '<testcase classname="conformance_tests.meta.test_a" name="t2" time="1"><failure/></testcase>'
                     '<testcase classname="conformance_tests.test_b" name="t3" time="0.5"><error/></testcase>'
                     '</testsuite></testsuites>')
    assert per_file_seconds(junit) == ({"test_a.py": 3.0, "test_b.py": 0.5}, 3, ["test_a.py::t2", "test_b.py::t3"])


@pytest.mark.parametrize("name, cls", [  # kernel names as torch.profiler reported them on an H200 and an H100
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel",
     "matmul"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1"
     "::Params)", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<float>)",
     "matmul"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
     "at::native::sum_functor<float, float, float>::operator()>, unsigned int, float, 4> >", "reduction"),
    ("void at::native::tensor_kernel_scan_innermost_dim<double, std::plus<double> >(double*, double const*, "
     "unsigned int, unsigned int, unsigned int, double, std::plus<double>)", "scan"),
    ("void at::native::indexFuncLargeIndex<double, int, unsigned int, 2, 2, -2, true>", "index"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "softmax"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
     "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>", "foreach"),
    ("void at_cuda_detail::cub::DeviceSegmentedRadixSortKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<float, "
     "long, int>::Policy900, true, false, float, long, int const*, int const*, int, at_cuda_detail::cub::detail::"
     "identity_decomposer_t>", "sort"),
    ("triton_red_fused__softmax_add_clamp_gather_logsumexp_scatter_add_0", "fused"),  # Inductor's, whatever it fuses
    ("triton_poi_fused_mul_0", "fused"),
    ("aten::baddbmm", "matmul"), ("aten::index_add_", "index"), ("aten::where", "elementwise"),
    ("cudaStreamSynchronize", "other"),
])
def test_the_breakdown_puts_each_kernel_in_its_class(name, cls):
    from tools.benchmarks.bench_sac_breakdown import kernel_class

    assert kernel_class(name) == cls


def test_the_breakdown_runs_on_the_cpu_and_checks_the_top_p_plans_agree(tmp_path, monkeypatch, capsys):
    import json

    import torch

    pytest.importorskip("torchrl", reason="the breakdown profiles TorchRL's update beside ours (the torchrl extra)")

    from tools.benchmarks import bench_sac_breakdown as bd
    from tools.benchmarks import bench_sac_update

    rows = bench_sac_update.B
    argv = ["--batch", "16", "--rounds", "1", "--calls", "1", "--json", str(tmp_path / "bd.json")]
    res = bd.main(argv)
    assert bench_sac_update.B == rows, "the update benchmark's batch is left as it was"
    assert json.loads((tmp_path / "bd.json").read_text())["shape"]["batch"] == 16
    for side in ("reference", "torchrl"):
        b = res["breakdown"][side]
        assert b["total_s"] > 0 and sum(b["by_class_s"].values()) == pytest.approx(b["total_s"])
        assert b["by_class_s"]["matmul"] > 0  # the networks' matmuls were seen
        assert [t["s"] for t in b["top"]] == sorted((t["s"] for t in b["top"]), reverse=True)
    assert set(res["top_p"]) == {"flat", "peaked", "mixed"}
    assert "sorted / threshold" in capsys.readouterr().out
    from tools.benchmarks.report import breakdown_rows

    assert breakdown_rows(res) == [], "a CPU run is a smoke run: no row on the page"

    real = bd.top_p_select
    monkeypatch.setattr(bd, "top_p_select", lambda probs, mask, *, p, method: real(probs, mask, p=p, method=method)
                        if method == "sorted" else torch.zeros_like(mask))
    with pytest.raises(RuntimeError, match="select different sets"):
        bd.main(argv)


def test_a_gpu_breakdown_shows_the_classes_and_the_captured_top_p_plans():
    from tools.benchmarks.report import breakdown_rows

    side = {"total_s": 7.2e-3, "by_class_s": {"matmul": 2.5e-3, "sort": 1.5e-3, "elementwise": 3.2e-3, "other": 1e-8}}
    trl = {"total_s": 4.9e-3, "by_class_s": {"matmul": 2.5e-3, "elementwise": 2.4e-3}}
    kinds = {k: {"median_s": {"sorted_graph": 1.2e-3, "threshold_graph": 0.8e-3}, "graph_sorted_over_threshold": 1.5}
             for k in ("flat", "peaked", "mixed")}
    d = {"device": "cuda", "breakdown": {"reference": side, "torchrl": trl}, "top_p": kinds,
         "provenance": {"gpu": {"name": "H", "driver": "1"}}}
    update, top_p = breakdown_rows(d)
    assert update[1] == "7.2 ms: matmul 2.50, sort 1.50, elementwise 3.20"  # a class under 0.5% left out
    assert update[2] == "TorchRL: 4.9 ms: matmul 2.50, elementwise 2.40" and update[3] == "**0.68**"
    assert top_p[1].startswith("threshold: flat 0.80 ms") and top_p[3] == "flat 1.50, peaked 1.50, mixed 1.50"
    for r in kinds.values():  # a capture that failed on the GPU: the row falls back to the eager figures
        r.update(median_s={"sorted": 2.0e-3, "threshold": 1.0e-3}, sorted_over_threshold=2.0, graph_failed="x")
        del r["graph_sorted_over_threshold"]
    _, eager = breakdown_rows(d)
    assert "eager (the capture failed" in eager[0] and eager[1].startswith("threshold: flat 1.00 ms")
    assert eager[3] == "flat 2.00, peaked 2.00, mixed 2.00"
    d["breakdown"]["reference_compiled"] = {"total_s": 3.5e-3, "by_class_s": {"matmul": 2.5e-3, "fused": 1.0e-3}}
    update, compiled, _ = breakdown_rows(d)
    assert compiled[1] == "3.5 ms: matmul 2.50, fused 1.00" and compiled[3] == "**1.40**"
    d["breakdown"]["reference_compiled"] = {"failed": "BackendCompilerFailed: no triton"}
    _, compiled, _ = breakdown_rows(d)
    assert compiled[1] == "failed: BackendCompilerFailed: no triton" and compiled[3] == "—"


def test_a_contender_that_cannot_run_is_recorded_as_failed_and_the_others_still_run(monkeypatch):
    import torch

    from tools.benchmarks import bench_sac_breakdown as bd

    def broken(device):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(bd, "_sides", lambda device: {"reference": lambda device: (lambda: torch.ones(2).sum()),
                                                      "reference_compiled": broken})
    res = bd.breakdown(torch.device("cpu"), calls=1)
    assert res["reference_compiled"] == {"failed": "RuntimeError: no compiler"}
    assert res["reference"]["total_s"] > 0
    monkeypatch.setattr(bd, "_sides", lambda device: {"reference": broken})
    with pytest.raises(RuntimeError, match="no compiler"):  # ours or TorchRL's failing is an error, not a row
        bd.breakdown(torch.device("cpu"), calls=1)


def test_only_cuda_adds_the_compiled_contender():
    import torch

    from tools.benchmarks import bench_sac_breakdown as bd

    assert "reference_compiled" not in bd._sides(torch.device("cpu"))
    assert set(bd._sides(torch.device("cuda"))) == {"reference", "torchrl", "reference_compiled"}
