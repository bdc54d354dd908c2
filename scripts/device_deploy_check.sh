#!/usr/bin/env bash
# Device call: (1) GPU tests of the deployment-sized decode GEMV (the engine's graphs on the q4 model now decode on the
# tensor-core GEMV at max_num_seqs 32 / 4), the tensor-core model paths (the DeltaNet step a head per program among
# them) and the router rows; (2) bench --decode-gemv auto at B = 1, 8, 64 (head, mma, mma); (3) a 64- and 8-stream
# A/B of the DeltaNet step a head per program (DELTASERVE_GDN_STEP=head) and of the prepared wgmma experts kernel from
# 512 rows; (4) the prepared router row blocks at pp512 B=1 (1 against 8).  ~540 s
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_pp
TESTS_NAMED=1 gpu_tests 230 tests/gpu/test_engine_graph_gpu.py tests/gpu/test_model_mma_path.py \
  tests/gpu/test_kernels_gpu.py -k "engine or mma or gdn_step or router_rows"
M="--preset qwen3.6-35b-a3b --quant q4 -p 16 -d 512 -r 3 --no-record"
run_b() {  # run_b LABEL N BATCHES ENV...: tg N at each of BATCHES (one process), rows printed
  local label=$1 n=$2 bs=$3; shift 3
  env "$@" timeout 120 python3 -m deltaserve bench $M -n "$n" -b "$bs" > "$OUT/b_$label.log" 2>&1
  echo "== $label ($((SECONDS-t0)) s)"; grep -E '^\| deltaserve.*tg' "$OUT/b_$label.log" | sort -u | cut -c50-110
  grep -E "Error|error" "$OUT/b_$label.log" | tail -2
}
run_b auto 64 1,8,64
tar czf "$OUT/tcache.tgz" -C /tmp tcache
run_b gdn_head 64 8,64 DELTASERVE_GDN_STEP=head
run_b wgmma512 64 64 DELTASERVE_MOE_WGMMA_MIN_ROWS=512
for nb in 1 8; do bench_pp "router row blocks $nb" 1 DELTASERVE_ROUTER_ROW_BLOCKS=$nb; done
tar czf "$OUT/tcache.tgz" -C /tmp tcache
echo "done ($((SECONDS-t0)) s)"
