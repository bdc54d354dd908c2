#!/usr/bin/env bash
# Device call: records at this commit (the default CUDA-core MoE; scripts/device_bench_all.sh without its test
# window: the default path's kernels did not change since their last GPU tests, and this wave's changes had theirs
# in device_mma_ring*.sh), then the tensor-core MoE with the
# register ring and the sums-only norm (DELTASERVE_MOE=mma: tg128 and pp512 at d512, B=1; no records).  ~480 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_records_ring.sh
export TRITON_CACHE_DIR=/tmp/tcache
[ -f .tcache.tgz ] && tar xzf .tcache.tgz -C /tmp
t0=$SECONDS
TEST_TIMEOUT=1 \
  bash "$(dirname "$0")/device_bench_all.sh" 2>&1 | grep -E "passed|failed|^\| deltaserve|^\|.*(tg|pp)|FAILED|^E  " | head -40
echo "== records done ($((SECONDS-t0)) s)"
OUT=${OUT:-/tmp/out}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
DELTASERVE_MOE=mma timeout 90 python3 -m deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 128 -d 512 \
  -b 1 -r 3 --no-record > "$OUT/bench_mma.log" 2>&1
echo "== MoE mma ($((SECONDS-t0)) s)"; grep -E "^\| deltaserve" "$OUT/bench_mma.log" | sort -u
