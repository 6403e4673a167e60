O=$OUT
OUT=$O/a PHASES=none bash bench/gpu_session.sh > $O/install.txt 2>&1; mkdir -p $O/a
export SKIP_INSTALL=1 PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
K3C="python3 -P -m k3compile.cli"
git log -1 --format=%H > $O/commit.txt 2>/dev/null
( export CUDA_VISIBLE_DEVICES=0; mkdir -p $O/serving
  timeout 280 python3 -P bench/serving_sweep.py --out $O/serving > $O/serving/log.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1; mkdir -p $O/sweep96 $O/sweep16 $O/cp16
  P0='lower-recurrent,derive-chunkwise,fuse-chunkwise'
  P1='lower-recurrent,derive-chunkwise{solve-block=1},fuse-chunkwise'
  timeout 80 python3 -P bench/chunk_sweep.py --spec bench/specs/kda_h96.toml --out $O/sweep96 --pipelines "$P0;$P1" > $O/sweep96/log.txt 2>&1
  timeout 60 python3 -P bench/chunk_sweep.py --spec bench/specs/kda_h16.toml --batch 2 --tokens 16384 --out $O/sweep16 --pipelines "$P0;$P1" > $O/sweep16/log.txt 2>&1
  $K3C compile bench/specs/kda_h16.toml -o $O/cp16/gen -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-segment-scan{chunk-size=16},lower-segment-scan' > $O/cp16/log.txt 2>&1
  timeout 120 python3 bench/cp_gpu.py intra --module $O/cp16/gen/kda_h16.py --out $O/cp16 --segments 4,8,16 --cases B1_T131072,B2_T16384 >> $O/cp16/log.txt 2>&1 ) &
wait
echo "phase A done $SECONDS" > $O/times.txt
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu_cp.py -k two_gpus > $O/pytest_two.txt 2>&1
echo "two_gpus done $SECONDS" >> $O/times.txt
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu_cp.py -k "segments and bfloat16" > $O/pytest_seg_bf16.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu_cp.py -k "segments and float32" > $O/pytest_seg_fp32.txt 2>&1 &
wait
echo "all done $SECONDS" >> $O/times.txt
cd $O && tar czf all.tgz --exclude='*/gen/*' --exclude='*/modules/*' *.txt serving sweep96 sweep16 cp16 a 2>/dev/null
