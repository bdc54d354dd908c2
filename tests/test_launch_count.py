"""Launches of one fast-path decode step per decoder layer, counted under Triton's interpreter (tests/launch_counter.py
in a child process, TRITON_INTERPRET=1 set before Triton is imported). Run with -s to see the per-kernel table.

The bounds are the counts reached with fused projections (model/fusion.py) and fused residual adds (add_rms_norm,
the MoE combine's residual) on top of the one-launch GEMV (inline prep) and the 4-launch MoE decode. A 4-bit layer
launched 24 (DeltaNet+MoE) and 45 (attention+MoE) before fusion (with the GEMV then needing a prep launch each), 16 and
39 after it, 10 and 32 with the later kernels, 10 and 10 with the attention decode kernels (q/k norm + RoPE + KV append
in one launch, the output gate in the attention epilogue, RoPE angles in-kernel), 9 and 10 with the DeltaNet decode
conv in the input projection's GEMV epilogue; one more each with the MoE top-k in its own launch (measured on the
H200 against the top-k recomputed in every gate/up program), and 9 and 10 again with the top-k done by the router
launch's last-arriving program (kernels/triton_sync.py).
The packed (q4) decoder GEMVs then went back to a prep launch each (+2 per layer, 11 and 12: with PDL the prep
launch is hidden and the GEMV's x reads get cheaper, tg128 @ d512 421.5 -> 452.3 tok/s on the H200; bf16 weights
have no prep, 9 and 10). The input norm then wrote its GEMV's prep itself (model/fast.py::norm_for_gemv): 10 and 11.
The MoE top-k then went back to a launch of its own (moe_route(separate_topk=True): with PDL the launch
costs less than the router's serial last-arrival tail, tg128 @ d512 571.3 -> 580.4 tok/s on the H200): 11 and 12,
bf16 10 and 11.
A change that adds a launch per layer fails here: lower the bound when a change removes one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# (triton launches, torch ops) per layer, the most any layer of the kind launches
BOUNDS = {
    "q4": {"deltanet+moe": (11, 0), "attention+moe": (12, 0)},
    "bf16": {"deltanet+moe": (10, 0), "attention+moe": (11, 0)},
}


@pytest.fixture(scope="module")
def counts():
    pytest.importorskip("triton", reason="the launch counter runs the Triton kernels under the interpreter")
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1", DELTASERVE_REFERENCE="0",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.run([sys.executable, str(HERE / "launch_counter.py"), *BOUNDS], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    print(proc.stdout)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            rec = json.loads(line[7:])
            found[rec["quant"]] = {k: tuple(v) for k, v in rec["per_kind"].items()}
    return found


@pytest.mark.parametrize("quant", sorted(BOUNDS))
def test_decode_step_launches_per_layer_stay_within_bounds(counts, quant):
    got = counts[quant]
    assert set(got) == set(BOUNDS[quant]), f"layer kinds counted: {sorted(got)}"
    for kind, (triton_max, torch_max) in BOUNDS[quant].items():
        triton_n, torch_n = got[kind]
        assert triton_n <= triton_max, f"{quant} {kind}: {triton_n} Triton launches per layer (bound {triton_max})"
        assert torch_n <= torch_max, f"{quant} {kind}: {torch_n} torch kernels per layer (bound {torch_max})"


def test_counter_sees_every_kernel_class():
    """The counter itself: counting a known sequence of launches gives exactly those launches (a counter that
    missed Triton kernels or counted views would make the bounds above meaningless)."""
    code = (
        "import torch, triton, triton.language as tl, launch_counter as lc\n"
        "@triton.jit\n"
        "def _twice(x_ptr, N: tl.constexpr):\n"
        "    r = tl.arange(0, N)\n"
        "    tl.store(x_ptr + r, tl.load(x_ptr + r) * 2)\n"
        "c = lc.LaunchCounter()\n"
        "x = torch.ones(8)\n"
        "with lc._wrapped_triton_runs(c), c:\n"
        "    _twice[(1,)](x, N=8); _twice[(1,)](x, N=8)\n"
        "    y = x.view(2, 4)[0].reshape(4); z = torch.empty(3)\n"
        "    w = (y + 1).sum()\n"
        "assert torch.equal(x, torch.full((8,), 4.0)), x\n"
        "got = dict(c.counts['outside'])\n"
        "want = {('triton', '_twice'): 2, ('torch', 'aten.add.Tensor'): 1, ('torch', 'aten.sum.default'): 1}\n"
        "assert got == want, got\n"
        "print('OK')\n"
    )
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]
