"""model/fusion.py: projections sharing an input fused into one weight whose row slices the parts view.

Fused and unfused models compute the same (reference path: bit for bit; fast path under the interpreter: within the
fast-path tolerance), keep their state_dict, use no extra memory, fuse idempotently, and leave mixed storage kinds
alone.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from deltaserve.model import ForwardBatch, fusion
from model_helpers import make_hf_model, ours_from_checkpoint, ours_from_state_dict

HERE = Path(__file__).resolve().parent
GROUP_NAMES = {"linear_attn": "in_proj", "self_attn": "qkv_proj"}


def _owners(model):
    """(owner module, fused name) of every fusion group in the model."""
    for m in model.modules():
        group = getattr(type(m), "FUSED_PROJECTIONS", None)
        if group is not None:
            yield m, group[0], group[1]


def _unfused_copy(model):
    """A deep copy whose every parameter owns fresh storage (so no group is fused)."""
    other = copy.deepcopy(model)
    for m in other.modules():
        for name, p in list(m._parameters.items()):
            m._parameters[name] = nn.Parameter(p.detach().clone(), requires_grad=False)
    assert all(fusion.fused(o, n) is None for o, n, _ in _owners(other))
    return other


def _decode_logits(model, dtype=torch.float32, steps: int = 2) -> torch.Tensor:
    prompts = [[3, 5, 7, 9, 11, 2, 4], [8, 8, 1, 30, 22]]
    tables = [[0, 1], [2, 3]]
    cache = model.make_cache(4, 16, 2, dtype)
    out = []
    with torch.no_grad():
        out.append(model(ForwardBatch.build(prompts, [0, 0], tables, [0, 1], 16, logits="all"), cache))
        ctx, toks = [len(p) for p in prompts], [[p[-1]] for p in prompts]
        for _ in range(steps):
            logits = model(ForwardBatch.build(toks, ctx, tables, [0, 1], 16), cache)
            out.append(logits)
            ctx, toks = [c + 1 for c in ctx], [[int(t)] for t in logits.argmax(-1)]
    return torch.cat(out)


@pytest.fixture(scope="module", params=[True, False], ids=["moe", "dense"])
def dense_model(request):
    return ours_from_state_dict(make_hf_model(request.param, seed=1))


def test_reference_path_is_bit_identical_after_fusion(dense_model):
    fused = copy.deepcopy(dense_model)
    n = fused.fuse_projections()
    assert n == len(list(_owners(fused))), "every group of an fp32 dense model is fusable"
    assert torch.equal(_decode_logits(dense_model), _decode_logits(fused))


def test_state_dict_names_shapes_and_values_unchanged(dense_model):
    before = {k: v.clone() for k, v in dense_model.state_dict().items()}
    fused = copy.deepcopy(dense_model)
    fused.fuse_projections()
    after = fused.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert after[k].shape == v.shape and after[k].dtype == v.dtype and torch.equal(after[k], v), k
    # load_state_dict writes through the views into the fused weight
    sd = {k: v + 1 if v.is_floating_point() else v for k, v in before.items()}
    fused.load_state_dict(sd)
    la = fused.layers[0].linear_attn
    f = fusion.fused(la, "in_proj")
    assert f is not None and torch.equal(f.weight[: la.in_proj_qkv.weight.shape[0]], sd["layers.0.linear_attn.in_proj_qkv.weight"])


def test_parts_are_views_of_the_fused_storage_and_memory_does_not_grow(dense_model):
    def storage_bytes(m):
        return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in m.parameters()}.values())

    fused = copy.deepcopy(dense_model)
    before = storage_bytes(fused)
    fused.fuse_projections()
    assert storage_bytes(fused) == before
    for owner, name, attrs in _owners(fused):
        f = fusion.fused(owner, name)
        lo = f.weight.data_ptr()
        hi = lo + f.weight.numel() * f.weight.element_size()
        row = 0
        for a, size in zip(attrs, f.sizes):
            w = getattr(owner, a).weight
            assert w.untyped_storage().data_ptr() == f.weight.untyped_storage().data_ptr()
            assert lo <= w.data_ptr() < hi and w.is_contiguous()
            assert torch.equal(w, f.weight[row : row + size])
            row += size
        assert row == f.weight.shape[0]
    la = fused.layers[0].linear_attn
    assert fusion.fused(la, "in_proj").sizes == [la.in_proj_qkv.weight.shape[0], la.value_dim, la.hv, la.hv]


def test_fusion_is_idempotent(dense_model):
    fused = copy.deepcopy(dense_model)
    n = fused.fuse_projections()
    objs = {(id(o), name): fusion.fused(o, name) for o, name, _ in _owners(fused)}
    ptrs = [p.data_ptr() for p in fused.parameters()]
    assert fused.fuse_projections() == n
    assert all(fusion.fused(o, name) is objs[(id(o), name)] for o, name, _ in _owners(fused))
    assert [p.data_ptr() for p in fused.parameters()] == ptrs


def test_moved_parameters_make_the_group_stale_and_refusing_rebuilds_it(dense_model):
    fused = copy.deepcopy(dense_model)
    fused.fuse_projections()
    fused.to(torch.bfloat16)  # every parameter gets new storage: the fused copies are no longer what the parts hold
    assert all(fusion.fused(o, n) is None for o, n, _ in _owners(fused))
    fused.fuse_projections()
    f = fusion.fused(fused.layers[0].linear_attn, "in_proj")
    assert f is not None and f.weight.dtype == torch.bfloat16


def test_unfusable_mixes_are_left_alone(dense_model):
    from deltaserve.quant.fp8 import Fp8Linear

    model = copy.deepcopy(dense_model)
    la, attn = model.layers[0].linear_attn, model.layers[3].self_attn
    la.in_proj_b.weight = nn.Parameter(la.in_proj_b.weight.detach().to(torch.bfloat16), requires_grad=False)
    fp8 = Fp8Linear(attn.k_proj.weight.shape[1], attn.k_proj.weight.shape[0], (128, 128))
    attn.k_proj = fp8
    model.fuse_projections()
    assert fusion.fused(la, "in_proj") is None  # fp32 | fp32 | bf16 | fp32: mixed dtypes
    assert fusion.fused(attn, "qkv_proj") is None  # dense | fp8 | dense
    assert fusion.fused(model.layers[1].linear_attn, "in_proj") is not None  # the others still fuse
    assert la.in_proj_qkv.weight.untyped_storage().nbytes() == la.in_proj_qkv.weight.numel() * 4  # untouched


def test_affine_groups_fuse_all_three_tensors():
    from launch_counter import tiny_q4_model

    model = tiny_q4_model()  # bench/random_model fuses after building
    la = model.layers[0].linear_attn
    f = fusion.fused(la, "in_proj")
    assert f is not None and f.spec == la.in_proj_qkv.spec
    for key in ("weight", "scales", "biases"):
        full = getattr(f, key)
        assert getattr(la.in_proj_a, key).untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
        assert torch.equal(getattr(la.in_proj_z, key), full[la.in_proj_qkv.weight.shape[0] :][: la.value_dim])
    ref = _unfused_copy(model)
    assert torch.equal(_decode_logits(model, torch.bfloat16), _decode_logits(ref, torch.bfloat16))


def test_loader_fuses(tmp_path):
    model = ours_from_checkpoint(make_hf_model(True, seed=0), tmp_path)
    assert all(fusion.fused(o, n) is not None for o, n, _ in _owners(model))


def _fast_child() -> None:
    """Fast path under the interpreter: fused (one launch per group) vs unfused (one per projection)."""
    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    from deltaserve.kernels.gated_delta import triton_decode
    from launch_counter import tiny_q4_model
    from test_fast_path_interpret import _reference_gdn_prefill

    interpreter_numpy_shim()
    triton_decode.gdn_prefill = _reference_gdn_prefill  # fla has no interpreter path (see test_fast_path_interpret)
    for quant in ("q4", "bf16"):
        model = tiny_q4_model(quant)
        ref = _unfused_copy(model)
        prompt, table = [3, 5, 7, 9], [0]
        outs = []
        for m in (model, ref):
            cache = m.make_cache(2, 16, 1, torch.bfloat16)
            with torch.no_grad():
                a = m(ForwardBatch.build([prompt], [0], [table], [0], 16), cache)
                b = m(ForwardBatch.build([[prompt[-1]]], [len(prompt)], [table], [0], 16), cache)
            outs.append(torch.cat([a, b]).float())
        rel = ((outs[0] - outs[1]).abs().max() / outs[1].abs().max()).item()
        assert rel < 0.02, f"{quant}: fused fast path differs from unfused by {rel:.3g}"
        print(quant, "rel", rel)
    print("OK")


def test_fast_path_fused_matches_unfused_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1", DELTASERVE_REFERENCE="0",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    code = "import test_fusion, sys; test_fusion._fast_child()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
