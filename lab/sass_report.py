"""Compile the decode kernels for sm_90 on a machine WITHOUT a GPU and report, per kernel, what ptxas made of it:
registers per thread, SASS instructions, where the 128-bit global loads sit against the first FFMA and the PDL
wait. Nothing is launched: every `kernel[grid](...)` becomes Triton's warmup (compile only) against a stand-in
driver whose target is GPUTarget("cuda", 90, 32); CPU tensors stand in for device memory.

It answers layout questions before any device time is spent, e.g. "are the second weight's loads issued before
the first weight's FMAs" (lab/NOTES.md: the GEMV chunk loads and the MoE gate/up pair were found this way).
Timing still needs the H200 (lab/sweep_decode_kernels.py).

  python lab/sass_report.py [--only gemv|moe|all] [--pdl/--no-pdl] [--dump KERNEL]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.pop("TRITON_INTERPRET", None)  # must be unset before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
GEMV_SHAPES = ((12352, 2048), (2048, 4096), (9216, 2048), (248320, 2048))  # Qwen3.6-35B-A3B decode linears


class CompileOnlyDriver:
    """The part of Triton's active-driver interface that compiling (not launching) needs, for sm_90."""

    def __init__(self):
        self.target = GPUTarget("cuda", 90, 32)

    def is_active(self):
        return True

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_device_interface(self):
        return torch.cuda

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):
        return None


def install(pdl: bool) -> dict:
    """Switch Triton to compile-only launches; returns {label: CompiledKernel}, one per distinct compiled
    variant (a kernel compiled at several shapes gets "name", "name#2", ...)."""
    triton.runtime.driver.set_active(CompileOnlyDriver())
    compiled: dict = {}

    def getitem(self, grid):
        def launch(*args, **kwargs):
            k = self.run(*args, grid=grid, warmup=True, **kwargs)
            if all(v is not k for v in compiled.values()):
                n = sum(1 for label in compiled if label.split("#")[0] == self.fn.__name__)
                compiled[self.fn.__name__ + (f"#{n + 1}" if n else "")] = k
            return k
        return launch

    JITFunction.__getitem__ = getitem
    sys.path.insert(0, str(ROOT))
    from deltaserve.kernels import backend, triton_pdl

    backend.interpreting = lambda: True  # the kernels' CPU-tensor guard: let CPU tensors reach the launches
    triton_pdl.pdl_enabled = lambda t: pdl
    return compiled


def _tool(args: list[str], cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(BIN / args[0]), *args[1:], f.name], capture_output=True, text=True).stdout


def instructions(k) -> list[str]:
    """The SASS instruction lines of a compiled kernel, in order (cuobjdump's address-tagged lines)."""
    return [ln for ln in _tool(["cuobjdump", "-sass"], k.asm["cubin"]).splitlines()
            if re.search(r"/\*[0-9a-f]{4,5}\*/ ", ln) and ";" in ln]


def summary(name: str, k) -> str:
    regs = re.search(r"REG:(\d+)", _tool(["cuobjdump", "-res-usage"], k.asm["cubin"]))
    ins = instructions(k)
    ldg = [i for i, ln in enumerate(ins) if "LDG" in ln and ".128" in ln]
    ffma = next((i for i, ln in enumerate(ins) if "FFMA" in ln), None)
    wait = [i for i, ln in enumerate(ins) if "ACQBULK" in ln]
    before = sum(1 for i in ldg if ffma is None or i < ffma)
    return (f"{name:20} regs {regs.group(1) if regs else '?':>4}  instr {len(ins):5}  LDG.128 {len(ldg):3} "
            f"({before} before the first FFMA at {ffma})  PDL wait at {wait or '-'}")


def run_gemv() -> None:
    from deltaserve.kernels.quant import triton_gemv as tg

    for n, k in GEMV_SHAPES:
        w = torch.zeros(n, k // 8, dtype=torch.int32)
        s = torch.zeros(n, k // 64, dtype=torch.bfloat16)
        tg.affine_gemv(torch.zeros(1, k, dtype=torch.bfloat16), w, s, s, 4, 64)


def run_moe() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    sys.path.insert(0, str(ROOT / "lab"))
    import sweep_decode_kernels as sw
    from deltaserve.kernels.moe import triton_moe_gemv as m2

    kw, _ = sw.moe_setup(dict(sw.FULL), torch.device("cpu"))
    x = torch.randn(1, sw.FULL["h"]).bfloat16()
    m2.moe_decode_v2(x, top_k=sw.FULL["k"], residual=x, **kw)


ATTN_KNOBS = (  # (label, {lab/attention_knobs.py knob: value}): the decode split program's launch shapes worth comparing
    ("library", {}), ("st3", {"DECODE_STAGES": {}}), ("st1", {"DECODE_STAGES": {"bf16": 1, "fp8": 1}}),
    ("st2", {"DECODE_STAGES": {"bf16": 2, "fp8": 2}}), ("w8", {"DECODE_WARPS": {"bf16": 8, "fp8": 8}}),
    ("strided-st1", {"DECODE_PROGRAMS": 264}), ("strided-st2", {"DECODE_PROGRAMS": 264,
                                                                "DECODE_STAGES": {"bf16": 2, "fp8": 2}}),
    ("strided-st3", {"DECODE_PROGRAMS": 264, "DECODE_STAGES": {"bf16": 3, "fp8": 3}}),
)


def run_attn() -> list[str]:
    """The decode split kernel at the 35B-A3B's attention shape (Hq 16, Hkv 2, D 256, 32K context), bf16 and fp8
    caches, under each ATTN_KNOBS shape: registers, shared memory and instructions per variant."""
    sys.path.insert(0, str(ROOT / "lab"))
    import attention_knobs
    from deltaserve.kernels.attention import triton_paged as tp
    from deltaserve.kernels.attention.kv_fp8 import FP8

    hq, hkv, d, bs, depth = 16, 2, 256, 64, 32768
    blocks = depth // bs
    q = torch.zeros(1, hq, d, dtype=torch.bfloat16)
    tables = torch.zeros(1, blocks, dtype=torch.int32)
    lens = torch.full((1,), depth, dtype=torch.int32)
    lines = []
    for kind, dt in (("bf16", torch.bfloat16), ("fp8", FP8)):
        kc = torch.zeros(blocks, bs, hkv, d, dtype=dt)
        sc = torch.zeros(blocks, bs, hkv) if dt == FP8 else None
        for label, knobs in ATTN_KNOBS:
            with attention_knobs.applied(knobs):
                split, bn = attention_knobs.get("SPLIT_TOKENS"), attention_knobs.get("DECODE_BN") or 32
                warps, stages = attention_knobs.get("DECODE_WARPS")[kind], attention_knobs.get("DECODE_STAGES")[kind]
                strided = attention_knobs.get("DECODE_PROGRAMS") is not None
            k = tp._decode_split_kernel.run(
                q, kc, kc, tables, lens, q, q, q, q, q, sc if sc is not None else q, sc if sc is not None else q,
                q.stride(0), q.stride(1), tables.stride(0), hkv * d, d, 1, 1, 1, 1, 1, 0, 0, 1.0, G=hq // hkv, GP=16,
                D=d, BS=bs, SPLIT=split, BN=bn, F32=False, HAS_GATE=False, LENS_ADD=0,
                FP8=dt == FP8, STRIDED=strided, num_warps=warps, grid=(1, hkv, blocks),
                **({} if stages is None else {"num_stages": stages}),
                warmup=True)
            ins = instructions(k)
            mma = ("wgmma" if any("HGMMA" in ln for ln in ins) else
                   "mma.sync" if any("HMMA" in ln for ln in ins) else "?")
            spills = sum("STL" in ln for ln in ins)
            lines.append(summary(f"split {kind} {label}", k).split("  PDL")[0]
                         + f"  smem {k.metadata.shared} B  {mma}  spill stores {spills}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("gemv", "moe", "attn", "all"), default="all")
    ap.add_argument("--no-pdl", dest="pdl", action="store_false", help="compile without PDL (serial launches)")
    ap.add_argument("--dump", metavar="KERNEL", help="print the SASS of this kernel")
    args = ap.parse_args(argv)
    compiled = install(args.pdl)
    lines = []
    for part, fn in (("gemv", run_gemv), ("moe", run_moe)):
        if args.only in (part, "all"):
            before = set(compiled)
            fn()
            for name in compiled:
                if name not in before:
                    lines.append(summary(name, compiled[name]))
    if args.only in ("attn", "all"):
        lines += run_attn()
    print(f"sm_90, PDL {'on' if args.pdl else 'off'}; GEMV variants in the order {GEMV_SHAPES} (N, K)")
    print("\n".join(lines))
    if args.dump:
        print(_tool(["cuobjdump", "-sass"], compiled[args.dump].asm["cubin"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
