"""`deltaserve bench --profile` sorts kernels into classes by name fragment: every decode kernel of the MoE block
(router, top-k, gate/up, down, combine) is "moe", so the class view cannot hide one of them under "other"."""

from deltaserve.bench.profile import classify


def test_moe_decode_kernels_are_moe():
    for name in ("_router_kernel", "_topk_kernel", "_gate_up_kernel", "_down_kernel", "_combine_kernel",
                 "_down_combine_kernel"):
        assert classify(name) == "moe", name


def test_unknown_kernels_are_other():
    assert classify("void at::native::reduce_kernel<512, 1>").startswith("other")
    assert classify("_gemv_kernel").startswith("linear")
