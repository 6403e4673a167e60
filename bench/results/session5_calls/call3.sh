O=$OUT
OUT=$O/a PHASES=none bash bench/gpu_session.sh > $O/install.txt 2>&1
export SKIP_INSTALL=1 PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
K3C="python3 -P -m k3compile.cli"
mkdir -p $O/multi $O/chunk $O/tune
$K3C compile bench/specs/kda_h16.toml -o $O/multi/gen > /dev/null 2>&1
timeout 170 torchrun --nproc-per-node 2 bench/cp_gpu.py multi --module $O/multi/gen/kda_h16.py --out $O/multi --tokens 131072 --check-tokens 32768 > $O/multi/log.txt 2>&1
echo "multi done $SECONDS" >> $O/times.txt
( export CUDA_VISIBLE_DEVICES=0
  BENCH_CASES="kda_h96 kda_h64 kda_h16 kda_h32_d64" OUT=$O/chunk PHASES=chunk timeout 320 bash bench/gpu_session.sh > $O/chunk/log.txt 2>&1
  echo "chunk done $SECONDS" >> $O/times.txt ) &
( export CUDA_VISIBLE_DEVICES=1
  BENCH_CASES="kda_h96 kda_h64 kda_h16 kda_h32_d64" TUNE_DIR=/tmp/tune1 OUT=$O/tune PHASES=tune timeout 300 bash bench/gpu_session.sh > $O/tune/log.txt 2>&1
  echo "tune done $SECONDS" >> $O/times.txt ) &
wait
cd $O && tar czf all.tgz --exclude='*/generated/*' --exclude='*/gen/*' --exclude='*.py' *.txt multi chunk tune 2>/dev/null
