"""Make the old tree of issue 58's A/B: `git archive COMMIT` into a folder (default .old, to carry to the device:
add /.old/ to .git/info/exclude), with the MoE top-k's key-order normaliser of d8551f4 laid into its `_topk`, so
the A/B compares the refactor alone: d8551f4 changed a routing weight's last bit at rare tokens on purpose (the
exactness fix of issue 59), and a tree before it differs from main there by design.

  python3 lab/ab_old_tree.py [--commit ea8531e] [--out .old]

Trees from 39cedb0 on hold one `_topk` form in kernels/moe/triton_router_common.py (d8551f4 itself is there from
d8551f4 on: nothing to lay in); older ones hold its forms in kernels/moe/triton_decode.py, the default ("best",
BITONIC == 2) summing the k terms with tl.sum. Refuses a tree whose normaliser it does not find, naming the file.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE_SUM = """if NORMALIZE:
    norm = tl.sum(tl.where(kk < TOPK, tl.exp(best_logits - top), 0.0), axis=0)
    wts = tl.where(sel, tl.exp(logits - top), 0.0) / norm"""
KEY_ORDER = """if NORMALIZE:
    # (A/B tree: d8551f4's normaliser, the k terms added one after another in key order)
    terms = tl.exp(best_logits - top)
    norm = tl.sum(tl.where(kk == 0, terms, 0.0), axis=0)
    for i in tl.static_range(1, TOPK):
        norm = norm + tl.sum(tl.where(kk == i, terms, 0.0), axis=0)
    wts = tl.where(sel, tl.exp(logits - top), 0.0) / norm"""


def lay_in(text: str) -> str | None:
    """text with its tree-sum normaliser (at the indent it has: 4 in _topk's body, 8 in the old BITONIC == 2
    branch) replaced by the key-order one, or None where it is not found exactly once."""
    for indent in (" " * 8, " " * 4):
        old = textwrap.indent(TREE_SUM, indent)
        if text.count(old) == 1:
            return text.replace(old, textwrap.indent(KEY_ORDER, indent))
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commit", default="ea8531e")
    ap.add_argument("--out", type=Path, default=ROOT / ".old")
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        ap.error(f"{args.out} is not empty: remove it first")
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", args.commit], check=True, capture_output=True).stdout
    args.out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(args.out, filter="data")
    common = args.out / "deltaserve/kernels/moe/triton_router_common.py"
    if common.exists() and "tl.static_range(1, TOPK)" in common.read_text():
        print(f"{args.commit}: the key-order normaliser is there already")
        return 0
    decode = args.out / "deltaserve/kernels/moe/triton_decode.py"
    for path in (common, decode):
        new = lay_in(path.read_text()) if path.exists() else None
        if new is not None:
            path.write_text(new)
            print(f"{args.commit} in {args.out}: the key-order normaliser laid into {path.relative_to(args.out)}")
            return 0
    print(f"{args.commit}: no tree-sum normaliser found in {common.relative_to(args.out)} or "
          f"{decode.relative_to(args.out)}; the tree is left as archived", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
