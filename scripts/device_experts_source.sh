#!/usr/bin/env bash
# Device call (prepared, not yet run): where the tensor-core experts kernel's warps wait at a 512-token prefill
# (pp512's largest cost, 16.3 of ~30 ms; ncu of 2026-12-01: latency per program, 9 cycles an instruction, long
# scoreboard 3.4 of them). (1) Nsight Compute's SASS source page for the gated gate/up and the scaled down at
# T = 512 (scripts/probe_moe_t1.py --t 512), the 25 instructions with the most stall samples and their reasons, so
# the next change targets the tile table / order gather / x / weight loads that the samples name; (2) the graph
# profiles of head and wide at batch 1 (bench --profile-graph), which kernels grow under wide (-3.0% at B=1, both
# suspects refuted on 2026-12-01).  ~240 s
# Usage (H200 machine, repo root): [GRAPH_MODES="head wide"] bash scripts/device_experts_source.sh  (GRAPH_MODES= skips (2))
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for form in gated scaled; do
  timeout 150 "$NCU" --clock-control none -k regex:_mma_experts --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
    python3 scripts/probe_moe_t1.py --t 512 --calls 4 --only $form > "$OUT/source_$form.csv" 2> "$OUT/source_$form.err"
  echo "== ncu source $form T=512 ($((SECONDS-t0)) s): $(wc -l < "$OUT/source_$form.csv") lines"
  python3 - "$OUT/source_$form.csv" <<'PY'
import csv, io, sys
text = open(sys.argv[1], errors="replace").read()
start = text.find('"#"')  # the source page's header row; what ncu prints before it is the program's output
if start < 0:
    start = text.find('"Address"')
rows = list(csv.DictReader(io.StringIO(text[max(start, 0):])))
if not rows:
    print("no source rows; first bytes:", text[:400]); sys.exit(0)
cols = list(rows[0])
stall = next((c for c in cols if "Warp Stall Sampling (All" in c), None) or next((c for c in cols if "Stall" in c), None)
src = next((c for c in cols if c.lower() in ("source", "sass")), cols[min(2, len(cols) - 1)])
def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0
total = sum(num(r.get(stall)) for r in rows) or 1.0
print(f"columns: {', '.join(c for c in cols if 'Stall' in c)[:300]}")
for r in sorted(rows, key=lambda r: -num(r.get(stall)))[:25]:
    print(f"{num(r.get(stall)) / total * 100:5.1f}%  {r.get('Address', r.get('#', '')):>8}  {str(r.get(src))[:90]}")
PY
done
for mode in ${GRAPH_MODES-head wide}; do
  DELTASERVE_DECODE_GEMV=$mode timeout 120 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 16 -r 3 \
    --no-record -d 512 -b 1 -n 32 --profile-graph > "$OUT/graph_$mode.log" 2>&1
  echo "== graph profile $mode ($((SECONDS-t0)) s)"; grep -A30 "decode graph profile" "$OUT/graph_$mode.log" | cut -c1-140
done
