"""One decode attention call per cache kind (bf16, then fp8) at the 35B-A3B's shapes (Hq 16, Hkv 2, D 256, the
output gate on), batch 1 and --depth tokens of context: the program to run under Nsight Compute, e.g.

  ncu --clock-control none -k regex:_decode_ --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats python lab/probe_decode_attention.py --depth 32768

Each kind is launched twice (the first compiles), so the kernels of the second call are the ones to read; the
library's current launch shape is used (triton_paged's module knobs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depth", type=int, default=32768)
    args = ap.parse_args(argv)
    from deltaserve.kernels.attention import triton_paged as tp
    from deltaserve.kernels.attention.kv_fp8 import quantize_rows

    dev = torch.device("cuda")
    hq, hkv, d, bs = 16, 2, 256, 64
    blocks = -(-(args.depth + 1) // bs)
    torch.manual_seed(0)
    tables = torch.randperm(blocks, device=dev, dtype=torch.int32).view(1, blocks)
    lens = torch.tensor([args.depth + 1], device=dev, dtype=torch.int32)
    q = torch.randn(1, hq, d, device=dev).bfloat16()
    gate = torch.randn(1, hq, d, device=dev).bfloat16()
    k16 = torch.randn(blocks, bs, hkv, d, device=dev).bfloat16()
    v16 = torch.randn(blocks, bs, hkv, d, device=dev).bfloat16()
    (k8, ks), (v8, vs) = quantize_rows(k16), quantize_rows(v16)
    for kc, vc, ksc, vsc in ((k16, v16, None, None), (k8, v8, ks.contiguous(), vs.contiguous())):
        for _ in range(2):
            tp.paged_decode_attention(q, kc, vc, tables, lens, d**-0.5, blocks * bs, gate=gate, k_scale=ksc,
                                      v_scale=vsc)
    torch.cuda.synchronize()
    print("probe done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
