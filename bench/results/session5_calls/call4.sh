O=$OUT
OUT=$O/a PHASES=none bash bench/gpu_session.sh > $O/install.txt 2>&1
export SKIP_INSTALL=1 PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
K3C="python3 -P -m k3compile.cli"
mkdir -p $O/multi $O/chunk
$K3C compile bench/specs/kda_h16.toml -o $O/multi/gen > /dev/null 2>&1
timeout 120 torchrun --nproc-per-node 2 bench/cp_gpu.py multi --module $O/multi/gen/kda_h16.py --out $O/multi --no-fla > $O/multi/log.txt 2>&1
echo "multi done $SECONDS" >> $O/times.txt
BENCH_CASES="kda_h32_d64" OUT=$O/chunk PHASES=chunk timeout 150 bash bench/gpu_session.sh > $O/chunk/log.txt 2>&1
echo "chunk done $SECONDS" >> $O/times.txt
cd $O && tar czf all.tgz --exclude='*/generated/*' --exclude='*/gen/*' --exclude='*.py' *.txt multi chunk 2>/dev/null
