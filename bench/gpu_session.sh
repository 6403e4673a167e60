#!/usr/bin/env bash
# One device call (see bench/RESULTS.md): install the carried wheels (.whl: xdsl and its deps,
# fla-core 0.6.0) and k3compile, verify every example on the GPU in bf16 and fp32, then time
# the recurrent kernel side by side with fla. Run from the repo root with OUT set.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site  # -P below: the installed package, not the source folders
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
for spec in ${SPECS:-kda gated_deltanet deltanet gla attnres}; do
  python3 -P -m k3compile.cli verify "examples/$spec.toml" 2>&1 | tee -a "$OUT/verify.txt"
done
python3 -P -m k3compile.cli compile bench/kda_bench.toml -o bench/generated
python3 bench/recurrent_gpu.py --out "$OUT" ${BENCH_ARGS:-}
