#!/usr/bin/env bash
# One device call (see bench/RESULTS.md): install the carried wheels (.whl: xdsl and its deps,
# fla-core 0.6.0) and k3compile, then run the phases named in PHASES (default: all):
#   verify     k3c verify of the examples in $SPECS on the GPU, bf16 and fp32
#   recurrent  decode timing of the recurrent entry vs fla's fused_recurrent_kda
#   spec       decode and speculative decoding (verify + commit, spec_step, the snapshot baseline)
#              vs fla's fused_recurrent_kda, bench/speculative_gpu.py; then the CUDA-graph test
#   chunk      prefill timing of the chunk entry vs fla's chunk_kda / chunk_gated_delta_rule / chunk_gla
#   profile    per-kernel GPU time of the chunk entry at B1 T8192 H96
#   sweep      the chunk entry under several pipelines (schedule choices), checked and timed
# Run from the repo root with OUT set.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site  # -P below: the installed package, not the source folders
K3C="python3 -P -m k3compile.cli"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
for phase in ${PHASES:-verify recurrent chunk}; do
  case $phase in
    verify)
      for spec in ${SPECS:-kda gated_deltanet deltanet gla attnres}; do
        $K3C verify "examples/$spec.toml" 2>&1 | tee -a "$OUT/verify.txt"
      done ;;
    recurrent)
      $K3C compile bench/kda_bench.toml -o bench/generated
      python3 bench/recurrent_gpu.py --out "$OUT" ${RECURRENT_ARGS:-} ;;
    spec)
      $K3C compile bench/kda_bench.toml -o bench/generated/speculative \
        -p 'lower-decode,derive-replay{draft-tokens=16},lower-speculative'
      $K3C compile bench/kda_bench.toml -o bench/generated/snapshot \
        -p 'derive-replay{draft-tokens=16},lower-speculative{mode=snapshot}'
      python3 bench/speculative_gpu.py --out "$OUT" ${SPEC_ARGS:-}
      if python3 -c "import pytest" 2>/dev/null; then  # -P: k3compile from /tmp/site, not the source folder
        python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu.py -k cuda_graphs 2>&1 | tee "$OUT/spec_graph_test.txt"
      fi ;;
    profile)
      for spec in bench/specs/kda_h96.toml; do $K3C compile "$spec" -o bench/generated; done
      python3 bench/chunk_profile.py --module bench/generated/kda_h96.py 2>&1 | tee "$OUT/profile.txt" ;;
    sweep)
      python3 -P bench/chunk_sweep.py --spec bench/specs/kda_h96.toml --out "$OUT" ${SWEEP_ARGS:-} ;;
    chunk)
      for spec in bench/specs/*.toml; do $K3C compile "$spec" -o bench/generated --timing; done
      python3 bench/chunk_gpu.py --out "$OUT" ${CHUNK_ARGS:-} ;;
  esac
done
