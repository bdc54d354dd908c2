#!/usr/bin/env bash
# Device call: a throughput deployment's DeltaNet step on 64 state columns a program (step_dv_block(throughput);
# the sweep: 85.9 -> 77.7 us at 64 streams, 13.8 -> 10.7 at 8) and the state's constant row stride (5,529 at 64
# streams with 32 columns). (1) GPU tests: the step at 64 columns against fp64, batch invariance at 32 and 64 columns
# (1 + 1 / 3 / 15 / 63 rows), the split forms against the head form, the engine's decode graphs == eager (q4 engines
# are throughput deployments: 64 columns); (2) tg64 @ d512 A/B at 64 and 8 streams: the default against
# DELTASERVE_GDN_STEP=split (predicted +2% and +2.5%); (3) records at this commit.  ~520 s
# Usage (H200 machine, repo root): DELTASERVE_COMMIT=<sha> bash scripts/device_gdn64_records.sh
source "$(dirname "$0")/device_env.sh"  # OUT, the wheels, PYTHONPATH, t0, gpu_tests, bench_tg, bench_records
TESTS_NAMED=1 gpu_tests 90 tests/gpu/test_kernels_gpu.py -k "gdn_decode_step or gdn_decode_batch or split_vs_whole"
TESTS_NAMED=1 gpu_tests 110 tests/gpu/test_engine_graph_gpu.py
for b in 64 8; do
  for cfg in "" "DELTASERVE_GDN_STEP=split"; do bench_tg "${cfg:-default}" $b 64 $cfg; done
done
bench_records 170 120
logs_into_one
ls "$OUT"; echo "done ($((SECONDS-t0)) s)"
