"""The programmatic-dependent-launch protocol (deltaserve/kernels/triton_pdl.py), checked on the kernels' source:
a kernel launched with PDL may start before its predecessor has finished, so before its wait it may only read
constant data. Statically: in every @triton.jit kernel with a PDL parameter, pdl_open(PDL) comes first and no
store or atomic (direct, or through a helper that stores) comes before the wait in source order. Plus the switch:
PDL is never requested off CUDA or under DELTASERVE_PDL=0. (PDL on == off, bit for bit, on the GPU:
tests/gpu/test_model_fast_path.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

KERNELS = Path(__file__).resolve().parent.parent / "deltaserve" / "kernels"
WRITES = {"store", "atomic_add", "atomic_cas", "atomic_xchg", "atomic_max", "atomic_min", "atomic_and",
          "atomic_or", "atomic_xor"}


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _jit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Module-level @triton.jit / @gluon.jit functions, including those under a module-level `if` (the Gluon
    kernels are defined only when Gluon imports)."""
    out = {}
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.If):
            stack[:0] = node.body + node.orelse
        elif isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            out[node.name] = node
    return out


def _all_jit() -> dict[str, ast.FunctionDef]:
    funcs = {}
    for path in KERNELS.rglob("*.py"):
        funcs.update(_jit_functions(ast.parse(path.read_text())))
    return funcs


def _writes(fn: ast.FunctionDef, funcs: dict, seen: set) -> bool:
    """Does fn (or a jit helper it calls) store or do an atomic?"""
    if fn.name in seen:
        return False
    seen.add(fn.name)
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            n = _name(node)
            if n in WRITES or n == "last_arrival" or (n in funcs and _writes(funcs[n], funcs, seen)):
                return True
    return False


def _is_wait(call: ast.Call, funcs: dict, flag: str = "PDL") -> bool:
    """pdl_wait(..), or a call of a jit helper passed `flag` (a kernel's PDL, a helper's own PDL_WAIT) as its
    PDL_WAIT parameter (gemv_row, gemv_row_pair: they wait after requesting weights;
    test_wait_helpers_wait_before_writing checks them)."""
    n = _name(call)
    if n == "pdl_wait":
        return True
    helper = funcs.get(n)
    if helper is None:
        return False
    params = [a.arg for a in helper.args.args]
    if "PDL_WAIT" not in params:
        return False
    i = params.index("PDL_WAIT")
    passed = call.args[i] if i < len(call.args) else next((k.value for k in call.keywords if k.arg == "PDL_WAIT"),
                                                            None)
    return isinstance(passed, ast.Name) and passed.id == flag


def _calls_in_order(fn: ast.FunctionDef) -> list[ast.Call]:
    return sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))


def _call_writes(call: ast.Call, funcs: dict) -> bool:
    """Does this call store or do an atomic (directly, or in the jit helper it calls)?"""
    n = _name(call)
    return n in WRITES or n == "last_arrival" or (n in funcs and _writes(funcs[n], funcs, set()))


def _pdl_kernels():
    """(jit helpers by name for call resolution, {"module:kernel": FunctionDef} of the kernels with a PDL
    parameter). Kernels are keyed by module: two modules may each have a _gate_up_kernel."""
    kernels = {}
    for path in sorted(KERNELS.rglob("*.py")):
        for name, fn in _jit_functions(ast.parse(path.read_text())).items():
            if any(a.arg == "PDL" for a in fn.args.args) and name not in ("pdl_open", "pdl_wait"):
                kernels[f"{path.parent.name}/{path.stem}:{name}"] = fn
    return _all_jit(), kernels


def test_pdl_kernels_found():
    _, kernels = _pdl_kernels()
    for expected in ("quant/triton_gemv:_gemv_kernel", "moe/triton_decode:_router_kernel",
                     "moe/triton_moe_gemv:_gate_up_kernel", "moe/triton_moe_gemv:_down_kernel",
                     "moe/triton_moe_gemv:_combine_kernel", "gated_delta/triton_decode:_step_rows_kernel",
                     "kernels/triton_norm:_rms_norm_kernel", "attention/triton_qk_prep:_qk_prep_kernel",
                     "attention/triton_paged:_decode_split_kernel", "quant/mma_gemv:_mma_gemv_kernel",
                     "moe/mma_experts:_mma_experts_kernel"):
        assert expected in kernels


def _is_open(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _name(stmt.value) == "pdl_open"


def _late_open(stmt: ast.stmt) -> bool:
    """`if not OPEN_LATE: pdl_open(PDL)`: a kernel that may open late, after its first wait, so that the next
    launch starts only once this one's predecessor has completed (triton_pdl's protocol, the early readers)."""
    return (isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "not OPEN_LATE" and not stmt.orelse
            and len(stmt.body) == 1 and _is_open(stmt.body[0]))


@pytest.mark.parametrize("kernel", sorted(_pdl_kernels()[1]))
def test_no_write_before_wait(kernel):
    funcs, kernels = _pdl_kernels()
    fn = kernels[kernel]
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    first = body[0]
    late = _late_open(first)
    assert late or _is_open(first), \
        f"{kernel}: the first statement must be pdl_open(PDL) (or `if not OPEN_LATE: pdl_open(PDL)`)"
    calls = _calls_in_order(fn)
    waits = [c for c in calls if _is_wait(c, funcs)]
    assert waits, f"{kernel}: has a PDL parameter but never waits (pdl_wait(PDL))"
    first_wait = (waits[0].lineno, waits[0].col_offset)
    if late:  # the late open comes after the kernel's first wait
        opens = [n for n in ast.walk(fn) if isinstance(n, ast.If) and ast.unparse(n.test) == "OPEN_LATE"
                 and len(n.body) == 1 and _is_open(n.body[0])]
        assert opens and all((n.lineno, n.col_offset) > first_wait for n in opens), \
            f"{kernel}: OPEN_LATE must open (pdl_open(PDL)) after the first wait, and only there"
    for c in calls:
        if (c.lineno, c.col_offset) >= first_wait:
            break
        assert not _call_writes(c, funcs), f"{kernel}: line {c.lineno} writes memory ({_name(c)}) before the PDL wait"


def test_wait_helpers_wait_before_writing():
    """A jit helper with a PDL_WAIT parameter stands in for its caller's wait, so it must itself call
    pdl_wait(PDL_WAIT) before any write, in source order."""
    funcs = _all_jit()
    helpers = {n: f for n, f in funcs.items() if any(a.arg == "PDL_WAIT" for a in f.args.args)}
    assert {"gemv_row", "gemv_row_pair"} <= set(helpers)
    for name, fn in helpers.items():
        waited = False
        for c in _calls_in_order(fn):
            if _is_wait(c, funcs, "PDL_WAIT"):
                waited = True
                continue
            assert waited or not _call_writes(c, funcs), \
                f"{name}: line {c.lineno} writes memory ({_name(c)}) before its PDL wait"
        assert waited, f"{name}: has a PDL_WAIT parameter but never waits"


def test_launch_sites_pass_pdl_to_pdl_kernels():
    """Every launch with **pdl_args(..) targets a kernel that has the PDL parameter (the flag and Triton's
    launch_pdl always travel together)."""
    _, kernels = _pdl_kernels()
    found = 0
    for path in KERNELS.rglob("*.py"):
        names = {k.split(":")[1] for k in kernels if k.startswith(f"{path.parent.name}/{path.stem}:")}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and any(isinstance(k.value, ast.Call) and _name(k.value) == "pdl_args"
                                                  for k in node.keywords if k.arg is None):
                target = node.func.value if isinstance(node.func, ast.Subscript) else node.func
                assert isinstance(target, ast.Name) and target.id in names, \
                    f"{path.name}:{node.lineno}: pdl_args on a launch of {ast.unparse(target)}"
                found += 1
    assert found >= 10


def test_pdl_switch(monkeypatch):
    from deltaserve.kernels import triton_pdl

    assert triton_pdl.pdl_args(torch.zeros(1)) == {}  # CPU: never
    monkeypatch.setenv("DELTASERVE_PDL", "0")
    assert not triton_pdl.pdl_enabled(torch.zeros(1))
