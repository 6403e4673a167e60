O=$OUT
OUT=$O/a PHASES=none bash bench/gpu_session.sh > $O/install.txt 2>&1; mkdir -p $O/a
export SKIP_INSTALL=1 PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
K3C="python3 -P -m k3compile.cli"
( export CUDA_VISIBLE_DEVICES=0; mkdir -p $O/spec
  OUT=$O/spec PHASES=spec timeout 270 bash bench/gpu_session.sh > $O/spec/log.txt 2>&1
  echo "spec done $SECONDS" >> $O/times.txt
  timeout 170 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py > $O/pytest_gpu.txt 2>&1
  echo "pytest gpu done $SECONDS" >> $O/times.txt ) &
( export CUDA_VISIBLE_DEVICES=1; mkdir -p $O/verify $O/chunk $O/cp
  OUT=$O/verify PHASES=verify timeout 120 bash bench/gpu_session.sh > $O/verify/log.txt 2>&1
  echo "verify done $SECONDS" >> $O/times.txt
  OUT=$O/chunk PHASES=chunk timeout 170 bash bench/gpu_session.sh > $O/chunk/log.txt 2>&1
  echo "chunk done $SECONDS" >> $O/times.txt
  CP_ARGS="--segments 4,8,16 --cases B1_T131072,B2_T16384" OUT=$O/cp PHASES=cp timeout 100 bash bench/gpu_session.sh > $O/cp/log.txt 2>&1
  echo "cp done $SECONDS" >> $O/times.txt ) &
wait
timeout 60 python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu_cp.py -k two_gpus > $O/pytest_two.txt 2>&1
echo "all done $SECONDS" >> $O/times.txt
cd $O && tar czf all.tgz --exclude='*/generated/*' --exclude='*/modules/*' --exclude='*.py' *.txt spec verify chunk cp 2>/dev/null
