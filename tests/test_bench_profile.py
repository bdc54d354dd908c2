"""`deltaserve bench --profile` sorts kernels into classes by name fragment: every decode kernel of the MoE block
(router, top-k, gate/up, down, combine) is "moe", so the class view cannot hide one of them under "other"."""

from deltaserve.bench.profile import classify


def test_moe_decode_kernels_are_moe():
    for name in ("_router_kernel", "_topk_kernel", "_gate_up_kernel", "_down_kernel", "_combine_kernel",
                 "_down_combine_kernel", "_mma_experts_kernel", "_wg_experts_kernel", "_tiles_order_kernel"):
        assert classify(name) == "moe", name


def test_unknown_kernels_are_other():
    assert classify("void at::native::reduce_kernel<512, 1>").startswith("other")
    assert classify("_gemv_kernel").startswith("linear")
    assert classify("_wg_gemv_kernel").startswith("linear")  # the dense decode GEMV on warpgroup MMAs


def test_prefill_kernels_have_their_classes():
    """The prefill's dense projections (dequantise, then the tiled matmul) are linear, fla's l2norm and w/u
    recompute are the DeltaNet prefill, and the attention's q/k prep is attention, not a GEMV's prep."""
    for name in ("_dense_mm_tma_kernel", "_dense_mm_kernel", "_dequant_kernel"):
        assert classify(name).startswith("linear"), name
    assert classify("l2norm_fwd_kernel") == classify("recompute_w_u_fwd_kernel") == "deltanet prefill"
    assert classify("_qk_prep_kernel") == "attention"
    assert classify("_prep_kernel").startswith("linear")


def test_critical_path_attributes_overlap_to_the_kernel_that_ends_later():
    from deltaserve.bench.profile import critical_path

    # one step: a [0, 10), b starts at 4 (PDL: it waits inside) and ends at 13, c [13, 20) after a 0-gap, d [21, 22)
    step = [("a", 0.0, 10.0), ("b", 4.0, 9.0), ("c", 13.0, 7.0), ("d", 21.0, 1.0)]
    second = [(n, t + 100.0, d) for n, t, d in step]
    span, per = critical_path(second + step, 2)  # order of the events does not matter
    assert span == 22.0
    assert per["a"] == [1, 10.0, 10.0] and per["b"] == [1, 9.0, 3.0] and per["c"] == [1, 7.0, 7.0]
    assert per["d"] == [1, 1.0, 2.0]  # the idle microsecond before it is its own
    assert sum(v[2] for v in per.values()) == span
    # a kernel that ends before the previous one (another stream's) costs nothing on the path
    span, per = critical_path([("a", 0.0, 10.0), ("side", 2.0, 3.0), ("b", 9.0, 4.0)], 1)
    assert span == 13.0 and per["side"][2] == 0.0 and per["b"][2] == 3.0


def test_critical_path_refuses_uneven_steps():
    import pytest

    from deltaserve.bench.profile import critical_path

    with pytest.raises(ValueError, match="do not split into 2 equal steps"):
        critical_path([("a", 0.0, 1.0)] * 3, 2)


def test_profile_prefill_runs_the_batch_it_is_given(tmp_path):
    """`bench --profile-prefill` profiles the first -b prompts (it once profiled one whatever -b said): on the CPU
    reference path the report names the batch and the blocks of every layer kind ran under their labels."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from model_helpers import make_hf_model, ours_from_checkpoint

    from deltaserve.bench.profile import profile_prefill
    from deltaserve.kernels import backend

    model = ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32), tmp_path / "ckpt")
    backend.use_reference(True)
    try:
        torch.manual_seed(0)
        report = profile_prefill(model, model.config, 6, batch=3, block_size=16)
    finally:
        backend.use_reference(False)
    assert report.startswith("# prefill profile: batch 3 x 6 tokens"), report.splitlines()[0]
    for block in ("deltanet mixer", "attention mixer", "moe block"):
        assert f"block: {block}" in report, report


def test_graph_profile_names_a_kernel_per_grid():
    """The graph profile lists a kernel once per launch grid (one GEMV kernel serves several weights), and keeps a
    trace event without a grid by its name; the suffix never changes the kernel's class."""
    from deltaserve.bench.profile import _with_grid

    assert _with_grid({"name": "_gemv_kernel", "args": {"grid": [772, 1, 1]}}) == "_gemv_kernel grid [772, 1, 1]"
    assert _with_grid({"name": "_gemv_kernel", "args": {}}) == "_gemv_kernel"
    assert _with_grid({"name": "x"}) == "x"
    assert classify(_with_grid({"name": "_decode_split_kernel", "args": {"grid": [1, 2, 9]}})) == "attention"


def test_graph_report_spans_and_ranks_by_critical_time():
    """The graph profiles' report (decode and prefill share it): the replay's span, the classes and kernels by
    critical time, and a clear line when the trace does not hold the graph's kernels one by one."""
    from deltaserve.bench.profile import _graph_report

    step = [("_router_mma_kernel", 0.0, 20.0), ("_topk_kernel", 15.0, 8.0), ("_wg_experts_kernel", 23.0, 100.0)]
    report = _graph_report(step + [(n, t + 500.0, d) for n, t, d in step], 2, "# prefill graph profile (x)",
                           "a prefill", 5)
    lines = report.splitlines()
    assert lines[0] == "# prefill graph profile (x): span 123.0 us, 3 kernels a prefill", lines[0]
    ranked = [ln.split()[-1] for ln in lines if ln.startswith("    ")]
    assert ranked == ["_wg_experts_kernel", "_router_mma_kernel", "_topk_kernel"], ranked
    assert "moe" in lines[2]  # every one of them is the MoE's
    uneven = _graph_report(step, 2, "# prefill graph profile (x)", "a prefill", 5)
    assert uneven.startswith("# prefill graph profile (x): 3 kernel events for 2 replays"), uneven


def test_prefill_graph_profile_says_when_it_cannot_capture(tmp_path):
    """Off CUDA (the reference model on the CPU) `bench --profile-prefill-graph` says so instead of failing."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from model_helpers import make_hf_model, ours_from_checkpoint

    from deltaserve.bench.profile import profile_prefill_graph

    model = ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32), tmp_path / "ckpt")
    assert profile_prefill_graph(model, model.config, 6).startswith("# prefill graph profile: the model cannot")
