"""sm_90 SASS of the decode attention's launches, compiled on a machine WITHOUT a GPU, through
`paged_decode_attention` itself: per form the split and merge kernels' registers, instructions, shared memory and a
hash of the instructions (addresses stripped), to tell whether a change to `kernels/attention/triton_paged.py` left
a form's code as it was and what a new form costs. Forms: the model's batch-1 call at the 35B-A3B's attention shape
(Hq 16, Hkv 2, D 256, block 64, a 32K host bound; bf16 cache, settled, the output gate, lens_add 1, the merge
writing the q4 g64 out projection's prep) and the fp8 cache's plain call, each with the long-row splits off and at
every --long setting (DELTASERVE_ATTN_LONG_SPLIT); env SASS_LONG_BN / SASS_LONG_STAGES set triton_paged's LONG_BN /
LONG_STAGES for a probe of the long form. Nothing runs: lab/sass_report.install's compile-only launches.

Compare two trees with a worktree of the older one:
  git worktree add /tmp/old <sha> && python lab/sass_attention.py --root /tmp/old --long '' && \
  python lab/sass_attention.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_tree  # noqa: E402


def main(argv=None) -> int:
    args, sass_report, compiled = sass_tree.start(
        __doc__, lambda ap: ap.add_argument("--long", default="8192x2,8192x4",
                                            help="long-split settings FROMxTILES to add ('' for none)"), argv)
    import torch

    from deltaserve.kernels.attention import triton_paged as tp
    from deltaserve.kernels.attention.kv_fp8 import FP8

    import attention_knobs

    probes = {name: int(os.environ[f"SASS_{name}"]) for name in ("LONG_BN", "LONG_STAGES")  # the long form's knobs
              if os.environ.get(f"SASS_{name}")}
    attention_knobs.applied(probes).__enter__()  # for the script's life
    tp.dot_f32 = lambda: False  # install() makes the kernels think they are interpreted: the GPU's bf16 MMAs

    hq, hkv, d, bs, depth = 16, 2, 256, 64, 32768
    blocks = depth // bs
    q = torch.zeros(1, hq, 2 * d, dtype=torch.bfloat16)  # q | gate, as the projection holds them
    tables = torch.zeros(1, blocks, dtype=torch.int32)
    ctx = torch.full((1,), depth - 1, dtype=torch.int64)

    def model_call():
        kc = torch.zeros(blocks, bs, hkv, d, dtype=torch.bfloat16)
        tp.paged_decode_attention(q[..., :d], kc, kc, tables, ctx, d**-0.5, depth, gate=q[..., d:], lens_add=1,
                                  settled=True, prep=(4, 64))

    def fp8_call():
        kc = torch.zeros(blocks, bs, hkv, d, dtype=FP8)
        sc = torch.zeros(blocks, bs, hkv)
        tp.paged_decode_attention(q[..., :d], kc, kc, tables, ctx, d**-0.5, depth, gate=q[..., d:], lens_add=1,
                                  k_scale=sc, v_scale=sc)

    settings = ["off"] + [s for s in args.long.split(",") if s]
    for setting in settings:
        os.environ["DELTASERVE_ATTN_LONG_SPLIT"] = setting
        for label, call in (("bf16 model", model_call), ("fp8", fp8_call)):
            before = set(compiled)
            call()
            for key in [k for k in compiled if k not in before] or ["(compiled before)"]:
                if key not in compiled:
                    print(f"long {setting:9} {label:10} {key}")
                    continue
                f = sass_tree.fingerprint(sass_report, compiled[key])
                print(f"long {setting:9} {label:10} {key.split('#')[0]:22} regs {f['regs']:>4}  instr "
                      f"{f['instructions']:5}  smem {f['smem']:6} B  spill stores {f['spills']}  sha1 {f['sha1']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
