#!/usr/bin/env bash
# The GPU measurements of bench/RESULTS.md in one call on the device machine. Installs the carried
# wheels (.whl: xdsl and its deps, fla-core 0.6.0) and k3compile into /tmp/site, then runs the
# phases named in PHASES (default: verify recurrent chunk; PHASES=none only installs):
#   verify         k3c verify of the examples in $SPECS on the GPU, bf16, fp16 and fp32: every spec in
#                  $VERIFY_SHARDS shards (default 6, --shard), all side by side; the shards' output
#                  in $OUT/verify.txt, a passed/failed line per spec and the phase's wall time
#   gpu-tests      pytest -m gpu of each file in $GPU_TEST_FILES (default tests/test_gpu.py, test_gpu_numerics.py,
#                  test_gpu_ops.py, test_gpu_cp.py; $GPU_TESTS_ARGS: more pytest arguments, e.g. -k two_gpus);
#                  $OUT/gpu_tests.txt
#   recurrent      decode timing of the recurrent entry vs fla's fused_recurrent_kda
#   spec           decode and speculative decoding (verify + commit, spec_step, their chunked verify, the
#                  snapshot baseline) vs fla's fused_recurrent_kda, bench/speculative_gpu.py; then the
#                  CUDA-graph test
#   serving        the serving kernels' launch sweep (block-v x num-warps x token-stages), bench/serving_sweep.py
#   verify-profile per-kernel profile of the chunked verify (lower-speculative{verify=chunked}), bench/verify_profile.py
#   chunk          prefill timing of the chunk entry vs fla's chunk_kda / chunk_gated_delta_rule / chunk_gla,
#                  every case of $BENCH_CASES (default all) under each gate pairing of $PAIRINGS (default
#                  both; bench/chunk_cases.py), the variants compiled into $OUT/generated
#   profile        per-kernel GPU time of the chunk entry of $PROFILE_CASE (default kda_h96) at its shape
#   sweep          the chunk entry of each case in $SWEEP_CASES (default kda_h96) under several pipelines
#                  ($SWEEP_PIPELINES: ';'-separated), checked and timed; $OUT/sweep_<case>/
#   tune           k3c tune of every variant of $BENCH_CASES / $PAIRINGS at its chunk_gpu.py shape, bf16: cold
#                  (fresh tuning and Triton caches), a second shape of each (T/2: a new bucket, Triton cache
#                  warm), then all again from the cache (0 s); seconds per shape in $OUT/tune_times.txt.
#                  Exports K3C_CACHE_DIR, so phases after it (e.g. PHASES="tune chunk") compile the winners
#   ab             two builds' kernels side by side (bench/ab_gpu.py, $AB_ARGS: e.g. --kinds chunk --gate-scale 10): the modules each build compiled into
#                  $AB_A and $AB_B (default bench/generated/ab/a, .../b; carried, compiled where the builds are)
#   block-attnres  Block AttnRes's two phases against the one-phase aggregate per block of K3's 24 points,
#                  n = 1, 2, 4, 8 representatives, D = 7168, T = 8192, a program per row and groups of 8
#                  rows (bench/block_attnres_gpu.py, $BLOCK_ATTNRES_ARGS)
#   attnres-ceiling the AttnRes aggregate next to torch's sum of the same sources and a copy, S = 2, 5, 9
#                  (bench/attnres_ceiling_gpu.py): what bandwidth its traffic can reach
#   moe            the LatentMoE layer of examples/latent_moe.toml (K3's dims) vs torch pipelines, decode and
#                  prefill: bench/moe_gpu.py ($MOE_ARGS), its module compiled into $OUT/generated/moe
#   backward       training: k3compile.ops chunk functions forward + backward vs fla's, gradients vs float64
#                  autograd of the reference (bench/backward_gpu.py, $BACKWARD_ARGS)
#   backward-verify every form of bench/backward_gpu.py's verify in its own process, side by side (the
#                  first-use compiles are the time; $BACKWARD_VERIFY_ARGS, e.g. --no-fla: ours against
#                  float64 only, without fla's autotuning); the rows of all in $OUT/backward_verify.md
#   backward-sweep the backward schedule's options (derive-backward / lower-backward) checked and timed with
#                  per-kernel times and peak memory, next to fla's backward (bench/backward_sweep.py, $BACKWARD_SWEEP_ARGS)
#   fla-suite      fla's own op tests with k3compile.ops in place of fla's (bench/fla_suite.py): the tests
#                  folder of a flash-linear-attention checkout at $FLA_TESTS (default bench/generated/fla/tests,
#                  carried: `git -C <checkout> archive HEAD tests | tar -x -C bench/generated/fla`); $FLA_SUITE_ARGS
#   cp             context parallelism of $CP_CASE's variant (default kda_h16 [bounded]): bench/cp_gpu.py
#                  intra ($CP_ARGS), and on a machine of several GPUs multi over all of them ($CP_MULTI_ARGS)
#   attnres-train  Block AttnRes's two phases in training (bench/block_attnres_train_gpu.py): ours per form
#                  (--parts c,d: phase 1's columns and query-blocks forms, forward and backward), then the two
#                  phases against flash-attn-res and the one-phase aggregate (--parts a,b; carry its wheel in
#                  .whl) under the defaults and again with both columns forms chosen through K3C_PASS_OPTIONS;
#                  $ATTNRES_TRAIN_ARGS (e.g. --representatives 1,8); $OUT/attnres_train/{forms,default,columns}
#   moe-train      the LatentMoE training step against the torch._grouped_mm layer with per-kernel profiles
#                  (bench/moe_train_gpu.py --profile), $MOE_TRAIN_ARGS, and $MOE_TRAIN_VARIANTS: derive-moe-backward's
#                  forms timed per kernel (e.g. 'both:glu-adjoint=kernel sorted-wgrad-rows=copy'); $OUT/moe_train
#   million        a million tokens on one GPU: KDA B1 T1048576 H16 forward + backward through k3compile.ops'
#                  layer's chunk(segments="auto") and segments=None against fla's chunk_kda, both gate
#                  pairings, times, peak memory and gradients (slices and norms) side by side, each side
#                  in a fresh Python process of its own so that one's OOM cannot touch another's run
#                  (bench/million_tokens_gpu.py, $MILLION_ARGS: e.g. --no-fla, --gates bounded, --tokens
#                  524288, --tokens-list 262144,524288,1048576 for the longest each side fits, OOM per
#                  side and length); about 4 minutes a length, most of it fla's autotuning and the first
#                  compiles; $OUT/million_tokens.{md,json}
# $GATE_PAIRING (bounded or unbounded; default bounded) picks the variant of the profile, sweep and cp
# phases. Run from the repo root with OUT set. Two runs side by side, one per GPU, share one install:
#   OUT=$OUT PHASES=none bash bench/device_run.sh
#   CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 OUT=$OUT/a PHASES=... bash bench/device_run.sh &
#   CUDA_VISIBLE_DEVICES=1 SKIP_INSTALL=1 TUNE_DIR=/tmp/tune1 OUT=$OUT/b PHASES=... bash bench/device_run.sh &
#   wait
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if [ -z "${SKIP_INSTALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
fi
export PYTHONPATH=/tmp/site  # -P below: the installed package, not the source folders
# fla's autotuning takes minutes per shape (most of a backward row's time): Triton's disk cache
# of autotune timings (TRITON_CACHE_AUTOTUNING, Triton >= 3.4; fla's configs have no pre-hooks)
# is seeded from $AUTOTUNE_SEED (default bench/autotune/fla_h200.tar.gz, where committed), so
# fla runs the configs an earlier run's autotuning chose; a seed for another Triton, fla or GPU
# simply misses. Every run leaves the timings its cache holds in $OUT/autotune.tar.gz.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache} TRITON_CACHE_AUTOTUNING=1
seed=${AUTOTUNE_SEED:-bench/autotune/fla_h200.tar.gz}
if [ -f "$seed" ]; then
  mkdir -p "$TRITON_CACHE_DIR" && tar -xzf "$seed" -C "$TRITON_CACHE_DIR" && echo "autotune timings from $seed" \
    || echo "autotune seed $seed not read: fla autotunes" >&2
fi
pack_autotune() {
  (cd "$TRITON_CACHE_DIR" 2>/dev/null && find . -name '*.autotune.json' | sort | tar -czf "$OUT/autotune.tar.gz" -T - 2>/dev/null)
}
trap pack_autotune EXIT
K3C="python3 -P -m k3compile.cli"
PAIRING=${GATE_PAIRING:-bounded}
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"

# variants CASES PAIRINGS: writes the cases' gate variants into $OUT/specs, prints
# "<variant> <case> <pairing> <B> <T>" per line (bench/chunk_cases.py)
variants() {
  python3 bench/chunk_cases.py specs "$OUT/specs" --cases "$(echo $1 | tr ' ' ,)" --pairings "$(echo $2 | tr ' ' ,)"
}
# variant CASE: the spec of CASE's $PAIRING variant
variant() { variants "$1" "$PAIRING" | { read -r name _ && echo "$OUT/specs/$name.toml"; }; }
all_cases=$(python3 -c 'import sys; sys.path.insert(0, "bench"); from chunk_cases import CASES; print(*CASES)')

for phase in ${PHASES:-verify recurrent chunk}; do
  echo "== phase $phase ($(date -u +%FT%TZ))"
  case $phase in
    none) ;;
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
    gpu-tests)
      for file in ${GPU_TEST_FILES:-tests/test_gpu.py tests/test_gpu_numerics.py tests/test_gpu_ops.py tests/test_gpu_cp.py}; do  # -P: k3compile from /tmp/site
        echo "\$ pytest -m gpu $file ${GPU_TESTS_ARGS:-}" | tee -a "$OUT/gpu_tests.txt"
        python3 -P -m pytest -q -p no:cacheprovider -m gpu "$file" ${GPU_TESTS_ARGS:-} 2>&1 | tee -a "$OUT/gpu_tests.txt"
      done ;;
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
    serving)
      python3 -P bench/serving_sweep.py --out "$OUT/serving" ${SERVING_ARGS:-} ;;
    verify-profile)
      $K3C compile bench/kda_bench.toml -o bench/generated/chunked \
        -p "derive-replay{draft-tokens=16},lower-speculative{verify=chunked${VERIFY_OPTIONS:+ $VERIFY_OPTIONS}}"
      python3 bench/verify_profile.py --module bench/generated/chunked/kda_bench.py ${VERIFY_PROFILE_ARGS:-} \
        2>&1 | tee "$OUT/verify_profile.txt" ;;
    profile)
      case_name=${PROFILE_CASE:-kda_h96}
      spec=$(variant "$case_name")
      $K3C compile "$spec" -o bench/generated
      read -r B T < <(python3 -c "import sys; sys.path.insert(0, 'bench'); from chunk_cases import CASES; print(*CASES['$case_name'])")
      heads=$(python3 -c "import tomllib; print(tomllib.load(open('$spec', 'rb'))['layer']['num_heads'])")
      python3 bench/chunk_profile.py --module "bench/generated/$(basename "$spec" .toml).py" --batch "$B" --tokens "$T" \
        --heads "$heads" ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.txt" ;;
    sweep)
      # SWEEP_PIPELINES: ';'-separated pipelines, passed as one argument (options hold spaces)
      for case_name in ${SWEEP_CASES:-kda_h96}; do
        python3 -P bench/chunk_sweep.py --case "$case_name" --pairing "$PAIRING" --out "$OUT/sweep_$case_name" \
          ${SWEEP_PIPELINES:+--pipelines "$SWEEP_PIPELINES"} 2>&1 | tee "$OUT/sweep_$case_name.txt"
      done ;;
    tune)
      tune_dir=${TUNE_DIR:-/tmp/k3c-tune}  # runs side by side: one folder each
      rm -rf "$tune_dir"
      export K3C_CACHE_DIR=$tune_dir/cache
      listed=$(variants "${BENCH_CASES:-$all_cases}" "${PAIRINGS:-bounded unbounded}") || exit 1
      for round in cold second cached; do
        while read -r name _ _ B T; do
          shape=$B,$T
          [ "$round" = second ] && shape=$B,$((T / 2))
          start=$(date +%s.%N)
          TRITON_CACHE_DIR=$tune_dir/triton $K3C tune "$OUT/specs/$name.toml" --shape "$shape" --dtype bfloat16 \
            2>&1 | tee -a "$OUT/tune.txt" | grep -E "^(winner|tuned in|from the cache|no candidate)"
          wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
          tuned=$(grep -E "^(tuned in|from the cache)" "$OUT/tune.txt" | tail -1)
          echo "$round $name B,T=$shape: ${wall} s wall (process start included) | $tuned" | tee -a "$OUT/tune_times.txt"
        done <<< "$listed"
      done
      while read -r name _ _ B T; do  # the modules embed the winners; --frozen: nothing may be missing
        $K3C compile "$OUT/specs/$name.toml" -o "$OUT/tuned_modules" --frozen --shape "$B,$T" --shape "$B,$((T / 2))" \
          2>&1 | tee -a "$OUT/tune.txt"
      done <<< "$listed" ;;
    chunk)
      # every variant compiled into $OUT/generated (with the tuned winners after the tune phase)
      cases=${BENCH_CASES:-$all_cases}
      pairings=${PAIRINGS:-bounded unbounded}
      listed=$(variants "$cases" "$pairings") || exit 1
      while read -r name _; do $K3C compile "$OUT/specs/$name.toml" -o "$OUT/generated" --timing; done <<< "$listed"
      python3 bench/chunk_gpu.py --out "$OUT" --modules "$OUT/generated" --cases "$(echo $cases | tr ' ' ,)" \
        --pairings "$(echo $pairings | tr ' ' ,)" ${CHUNK_ARGS:-} ;;
    ab)
      python3 bench/ab_gpu.py run --a "${AB_A:-bench/generated/ab/a}" --b "${AB_B:-bench/generated/ab/b}" --out "$OUT" \
        ${AB_ARGS:-} ;;
    block-attnres)
      K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/block_attnres_gpu.py --out "$OUT" ${BLOCK_ATTNRES_ARGS:-} ;;
    attnres-ceiling)
      $K3C compile examples/attnres.toml -o "$OUT/generated/attnres"
      python3 bench/attnres_ceiling_gpu.py --module "$OUT/generated/attnres/attnres.py" --out "$OUT" ;;
    moe)
      $K3C compile examples/latent_moe.toml -o "$OUT/generated/moe" --no-autotune
      python3 bench/moe_gpu.py --module "$OUT/generated/moe/latent_moe.py" --out "$OUT" ${MOE_ARGS:-} ;;
    fla-suite)
      python3 bench/fla_suite.py --tests "${FLA_TESTS:-bench/generated/fla/tests}" --out "$OUT/fla_suite" \
        ${FLA_SUITE_ARGS:-} 2>&1 | tail -40 ;;
    backward)
      # training: k3compile.ops' chunk functions forward + backward against fla's, and our gradients
      # against float64 autograd of the reference ($BACKWARD_ARGS: e.g. --skip-verify, --cases ...)
      K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/backward_gpu.py --out "$OUT" ${BACKWARD_ARGS:-} ;;
    backward-verify)
      forms=$(python3 -c 'import sys; sys.path.insert(0, "bench"); from backward_gpu import VERIFY_FORMS
print(*(label.replace(" ", "_").replace(",", "") for label, *_ in VERIFY_FORMS))')
      for form in $forms; do
        K3C_CACHE_DIR=/tmp/k3c_cache_$form OMP_NUM_THREADS=1 python3 -P bench/backward_gpu.py --out "/tmp/backward_verify/$form" \
          --skip-bench --forms "$form" ${BACKWARD_VERIFY_ARGS:-} > "/tmp/backward_verify_$form.txt" 2>&1 &
      done
      wait
      { echo "| form | dtype | gradient | ours / ref (RMS ratio) | fla / ref | tolerance | |"; echo "|---|---|---|---|---|---|---|"
        for form in $forms; do tail -n +3 "/tmp/backward_verify/$form/backward_verify.md" 2>/dev/null \
          || echo "| $form | - | - | - | - | - | no result: $(tail -1 /tmp/backward_verify_$form.txt) |"; done; } \
        | tee "$OUT/backward_verify.md" | grep -c "| pass |" | sed 's/$/ rows pass/' ;;
    backward-sweep)
      # the backward schedule's options side by side, checked and timed with per-kernel times
      # (bench/backward_sweep.py, $BACKWARD_SWEEP_ARGS: e.g. --member gdn --long-check, --no-fla)
      # (the generated modules stay in /tmp: only a few files come back from $OUT)
      K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/backward_sweep.py --out /tmp/backward_sweep ${BACKWARD_SWEEP_ARGS:-}
      cp /tmp/backward_sweep/backward_sweep.md /tmp/backward_sweep/backward_sweep.json "$OUT/" ;;
    cp)
      spec=$(variant "${CP_CASE:-kda_h16}")
      module="bench/generated/$(basename "$spec" .toml).py"
      $K3C compile "$spec" -o bench/generated
      python3 bench/cp_gpu.py intra --module "$module" --out "$OUT" ${CP_ARGS:-}
      gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
      if [ "$gpus" -ge 2 ]; then
        torchrun --nproc-per-node "$gpus" bench/cp_gpu.py multi --module "$module" --out "$OUT" ${CP_MULTI_ARGS:-}
      fi ;;
    million)
      K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/million_tokens_gpu.py --out "$OUT" ${MILLION_ARGS:-} ;;
    attnres-train)
      columns='derive-block-attnres{partials-schedule=columns},derive-block-attnres-backward{partials-backward=columns}'
      K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/block_attnres_train_gpu.py --out "$OUT/attnres_train/forms" \
        --parts c,d ${ATTNRES_TRAIN_ARGS:-}
      K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/block_attnres_train_gpu.py --out "$OUT/attnres_train/default" \
        --parts a,b ${ATTNRES_TRAIN_ARGS:-}
      K3C_PASS_OPTIONS=$columns K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/block_attnres_train_gpu.py \
        --out "$OUT/attnres_train/columns" --parts a,b ${ATTNRES_TRAIN_ARGS:-} ;;
    moe-train)
      K3C_CACHE_DIR=/tmp/k3c_cache python3 -P bench/moe_train_gpu.py --out "$OUT/moe_train" --profile ${MOE_TRAIN_ARGS:-} \
        ${MOE_TRAIN_VARIANTS:+--variants "$MOE_TRAIN_VARIANTS"} ;;
    *) echo "unknown phase '$phase'" >&2; exit 2 ;;
  esac
done
