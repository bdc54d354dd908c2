# The tensor-core device calls' shared set-up, sourced by scripts/device_mma_*.sh (H200 machine, repo root): $OUT,
# the carried wheels (.whl/, listed in wheels.txt) installed into /tmp/site, the repository and them on PYTHONPATH,
# one Triton cache per machine, and t0 for the calls' elapsed-seconds prints.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
t0=$SECONDS
