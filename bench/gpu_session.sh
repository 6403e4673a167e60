#!/usr/bin/env bash
# One device call (see bench/RESULTS.md): install the carried wheels (.whl: xdsl and its deps,
# fla-core 0.6.0) and k3compile, then run the phases named in PHASES (default: all):
#   verify     k3c verify of the examples in $SPECS on the GPU, bf16 and fp32: every spec in
#              $VERIFY_SHARDS shards (default 6, --shard), all side by side; the shards' output
#              in $OUT/verify.txt, a passed/failed line per spec and the phase's wall time
#   recurrent  decode timing of the recurrent entry vs fla's fused_recurrent_kda
#   spec       decode and speculative decoding (verify + commit, spec_step, their chunked verify, the snapshot baseline)
#              vs fla's fused_recurrent_kda, bench/speculative_gpu.py; then the CUDA-graph test
#   chunk      prefill timing of the chunk entry vs fla's chunk_kda / chunk_gated_delta_rule / chunk_gla
#              (the cases in $BENCH_CASES, default all; modules compiled into $OUT/generated)
#   profile    per-kernel GPU time of the chunk entry at B1 T8192 H96
#   sweep      the chunk entry under several pipelines (schedule choices), checked and timed
#   tune       k3c tune of every bench spec ($BENCH_CASES: those named) at its chunk_gpu.py shape, bf16: cold (fresh tuning and
#              Triton caches), a second shape of each spec (new bucket, Triton cache warm), then all
#              again from the cache (0 s); seconds per shape in $OUT/tune_times.txt. Exports
#              K3C_CACHE_DIR, so phases after it (e.g. PHASES="tune chunk") compile the winners
#   cp         context parallelism: bench/cp_gpu.py intra (segments=P vs the plain entry and fla at
#              B1 T131072 / B2 T16384 H16), and on a machine of several GPUs multi (torchrun, T = 1M)
# Run from the repo root with OUT set.
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ -z "${SKIP_INSTALL:-}" ]; then  # SKIP_INSTALL=1: sessions running side by side share one install
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
fi
export PYTHONPATH=/tmp/site  # -P below: the installed package, not the source folders
K3C="python3 -P -m k3compile.cli"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
for phase in ${PHASES:-verify recurrent chunk}; do
  case $phase in
    verify)
      # every spec's grid in $VERIFY_SHARDS shards (k3c verify --shard), all processes side by side:
      # the time goes into compiling the grid's kernels (CPU, a core each); one torch thread per
      # process, else each of the 30 would start a thread per core for the float64 references
      start=$SECONDS
      shards=${VERIFY_SHARDS:-6}
      for spec in ${SPECS:-kda gated_deltanet deltanet gla attnres}; do
        for ((i = 0; i < shards; i++)); do
          OMP_NUM_THREADS=1 $K3C verify "examples/$spec.toml" --shard "$i/$shards" > "/tmp/verify_${spec}_$i.txt" 2>&1 &
        done
      done
      wait
      for spec in ${SPECS:-kda gated_deltanet deltanet gla attnres}; do
        # a shard ends in "N passed, M failed"; one without that line stopped on an error
        for ((i = 0; i < shards; i++)); do cat "/tmp/verify_${spec}_$i.txt"; done | tee -a "$OUT/verify.txt" \
          | awk -v spec="$spec" -v shards="$shards" '
          / passed, [0-9]+ failed$/ { passed += $1; failed += $3; done++ }
          /error/ { print spec ": " $0 }
          END { printf "%s: %d passed, %d failed (%d/%d shards finished)\n", spec, passed, failed, done, shards }'
      done
      echo "verify: $((SECONDS - start)) s wall ($shards shards per spec)" ;;
    recurrent)
      $K3C compile bench/kda_bench.toml -o bench/generated
      python3 bench/recurrent_gpu.py --out "$OUT" ${RECURRENT_ARGS:-} ;;
    spec)
      $K3C compile bench/kda_bench.toml -o bench/generated/speculative \
        -p 'lower-decode,derive-replay{draft-tokens=16},lower-speculative'
      $K3C compile bench/kda_bench.toml -o bench/generated/snapshot \
        -p 'derive-replay{draft-tokens=16},lower-speculative{mode=snapshot}'
      $K3C compile bench/kda_bench.toml -o bench/generated/chunked \
        -p 'derive-replay{draft-tokens=16},lower-speculative{verify=chunked}'
      python3 bench/speculative_gpu.py --out "$OUT" ${SPEC_ARGS:-}
      if python3 -c "import pytest" 2>/dev/null; then  # -P: k3compile from /tmp/site, not the source folder
        python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu.py -k cuda_graphs 2>&1 | tee "$OUT/spec_graph_test.txt"
      fi ;;
    profile)
      for spec in bench/specs/kda_h96.toml; do $K3C compile "$spec" -o bench/generated; done
      python3 bench/chunk_profile.py --module bench/generated/kda_h96.py 2>&1 | tee "$OUT/profile.txt" ;;
    sweep)
      # SWEEP_PIPELINES: ';'-separated pipelines, passed as one argument (options hold spaces)
      python3 -P bench/chunk_sweep.py --spec bench/specs/kda_h96.toml --out "$OUT" \
        ${SWEEP_PIPELINES:+--pipelines "$SWEEP_PIPELINES"} ;;
    tune)
      tune_dir=${TUNE_DIR:-/tmp/k3c-tune}  # sessions side by side: one folder each
      rm -rf "$tune_dir"
      export K3C_CACHE_DIR=$tune_dir/cache
      # name:B,T of every case of bench/chunk_gpu.py (or those in $BENCH_CASES), and a second
      # shape (T/2: another bucket)
      cases=$(BENCH_CASES="${BENCH_CASES:-}" python3 -c 'import os, sys; sys.path.insert(0, "bench"); from chunk_gpu import CASES; only = os.environ["BENCH_CASES"].split(); print(" ".join("%s:%d,%d:%d,%d" % (n, c["B"], c["T"], c["B"], c["T"] // 2) for n, c in CASES.items() if not only or n in only))')
      for round in cold second cached; do
        for case in $cases; do
          IFS=: read -r name shape second <<< "$case"
          [ "$round" = second ] && shape=$second
          start=$(date +%s.%N)
          TRITON_CACHE_DIR=$tune_dir/triton $K3C tune "bench/specs/$name.toml" --shape "$shape" --dtype bfloat16 \
            2>&1 | tee -a "$OUT/tune.txt" | grep -E "^(winner|tuned in|from the cache|no candidate)"
          wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
          tuned=$(grep -E "^(tuned in|from the cache)" "$OUT/tune.txt" | tail -1)
          echo "$round $name B,T=$shape: ${wall} s wall (process start included) | $tuned" | tee -a "$OUT/tune_times.txt"
        done
      done
      for case in $cases; do  # the modules embed the winners; --frozen: nothing may be missing
        IFS=: read -r name shape second <<< "$case"
        $K3C compile "bench/specs/$name.toml" -o "$OUT/tuned_modules" --frozen --shape "$shape" --shape "$second" \
          2>&1 | tee -a "$OUT/tune.txt"
      done ;;
    chunk)
      # BENCH_CASES: the cases of bench/chunk_gpu.py to run (default: all), each compiled from
      # bench/specs/<case>.toml into $OUT/generated (with the tuned winners after the tune phase)
      names=${BENCH_CASES:-$(cd bench/specs && ls *.toml | sed 's/\.toml$//')}
      for name in $names; do $K3C compile "bench/specs/$name.toml" -o "$OUT/generated" --timing; done
      python3 bench/chunk_gpu.py --out "$OUT" --modules "$OUT/generated" --cases "$(echo $names | tr ' ' ,)" ${CHUNK_ARGS:-} ;;
    cp)
      $K3C compile bench/specs/kda_h16.toml -o bench/generated
      python3 bench/cp_gpu.py intra --module bench/generated/kda_h16.py --out "$OUT" ${CP_ARGS:-}
      gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
      if [ "$gpus" -ge 2 ]; then
        torchrun --nproc-per-node "$gpus" bench/cp_gpu.py multi --module bench/generated/kda_h16.py --out "$OUT"
      fi ;;
  esac
done
