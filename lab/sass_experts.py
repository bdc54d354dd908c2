"""sm_90 SASS of the MoE's warpgroup-MMA experts launches, compiled on a machine WITHOUT a GPU: for each form the
instruction count and a hash of the instructions (addresses stripped), to tell whether a change to
`kernels/moe/wgmma_experts.py` or the program it shares with the dense GEMV (`kernels/quant/wgmma_gemv.py`) left a
form's code as it was. Forms: gate/up and down at 64 tokens (a 64-stream decode, 8-row tiles) and 512 tokens (a
prefill chunk, 16-row tiles) at the 35B-A3B's shapes; --sets adds the two tile sets' forms at 64 tokens
(wg_matmul_experts(tile_set=)). Nothing runs: lab/sass_report.install's compile-only launches.

Compare two trees with a worktree of the older one (a tree from before the launch moved to kernels/moe/ has it in
kernels/quant/wgmma_experts.py, which this script imports there):
  git worktree add /tmp/old <sha> && python lab/sass_experts.py --root /tmp/old && python lab/sass_experts.py
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_tree  # noqa: E402

E, H, INTER, SLOTS = 257, 2048, 512, 9  # 256 routed experts + the stacked shared one, top-8 + the shared slot


def main(argv=None) -> int:
    args, sass_report, compiled = sass_tree.start(
        __doc__, lambda ap: ap.add_argument("--sets", action="store_true",
                                            help="also the two tile sets' forms at 64 tokens"), argv)
    import torch

    try:
        from deltaserve.kernels.moe import wgmma_experts as wx
        from deltaserve.kernels.moe.mma_experts import MmaTiles
    except ImportError:  # an older --root: the launch still beside the program in quant/
        from deltaserve.kernels.quant import wgmma_experts as wx
        from deltaserve.kernels.quant.mma_gemv import MmaTiles

    # the wrapper refuses CPU tensors; its launch code is taken as it is, without that guard
    src = textwrap.dedent(inspect.getsource(wx.wg_matmul_experts))
    guard = 'if not HAVE_GLUON or backend.interpreting() or x.device.type != "cuda":'
    if guard not in src:
        raise SystemExit("sass_experts: wg_matmul_experts' device guard changed; update this script")
    ns = dict(vars(wx))
    exec(src.replace(guard, "if False:"), ns)  # noqa: S102 (the library's own source, one line changed)
    matmul = ns["wg_matmul_experts"]

    def stack(n, k):
        return (torch.zeros(E, n // 16, k // 64, 128, dtype=torch.int32),
                torch.zeros(E, n // 16, k // 64, 8, 2, 2, dtype=torch.bfloat16))

    gate, up, down = stack(INTER, H), stack(INTER, H), stack(H, INTER)
    forms = []

    def launch(label, tokens, tile_set=(0, 1)):
        m = tokens * SLOTS
        rows = wx.wg_tile_rows(m)
        nt = -(-m // rows) + min(E, m)
        z = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
        tiles = MmaTiles(z(nt), z(nt), z(nt), z(m), rows)
        ids = torch.zeros(tokens, SLOTS, dtype=torch.int32)
        hid = torch.zeros(m, INTER, dtype=torch.bfloat16)
        before = set(compiled)
        matmul(torch.zeros(tokens, H, dtype=torch.bfloat16), *gate, ids, tiles, SLOTS, xs=torch.zeros(tokens, H // 64),
               up=up, out=hid, stages=wx.wg_moe_stages(rows), **({"tile_set": tile_set} if tile_set[1] > 1 else {}))
        forms.append((f"{label} gate/up", [k for k in compiled if k not in before]))
        before = set(compiled)
        matmul(hid, *down, ids, tiles, 1, scale=torch.zeros(m), out=torch.zeros(m, H),
               stages=wx.wg_moe_down_stages(rows), **({"tile_set": tile_set} if tile_set[1] > 1 else {}))
        forms.append((f"{label} down", [k for k in compiled if k not in before]))

    launch("64 tokens", 64)
    launch("512 tokens", 512)
    if args.sets:
        for i in (0, 1):
            launch(f"64 tokens, set {i}", 64, (i, 2))
    for label, keys in forms:
        for key in keys:  # a form compiled before (the same variant) adds no key
            f = sass_tree.fingerprint(sass_report, compiled[key])
            print(f"{label:24} {f['instructions']:5} instructions  sha1 {f['sha1']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
