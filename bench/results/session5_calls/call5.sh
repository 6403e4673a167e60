O=$OUT
OUT=$O/a PHASES=none bash bench/gpu_session.sh > $O/install.txt 2>&1
export SKIP_INSTALL=1 PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -P -m k3compile.cli compile bench/kda_bench.toml -o $O/gen -p 'derive-replay{draft-tokens=16},lower-speculative{verify=chunked}' > $O/compile.txt 2>&1
cat > $O/prof.py <<'PY'
import sys, torch, time
sys.path.insert(0, "bench")
from common import import_file, make_inputs
mod = import_file(sys.argv[1], "chunked")
from torch.profiler import profile, ProfilerActivity
for B, n in ((256, 1), (256, 8), (64, 1)):
    inp = make_inputs(torch, B, n, 32, 32, 128, 128, "cuda", 0)
    tok = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    pool = inp["initial_state"].clone(); slots = torch.arange(B, device="cuda")
    cache = torch.zeros(B, 16, 32, 384, device="cuda")
    f = lambda: mod.verify(**tok, state=pool, state_indices=slots, cache=cache)
    f(); torch.cuda.synchronize()
    t = time.perf_counter(); [f() for _ in range(5)]; torch.cuda.synchronize(); wall = (time.perf_counter() - t) / 5 * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(5): f()
        torch.cuda.synchronize()
    print(f"== B={B} n={n}: wall {wall:.3f} ms per verify call")
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
PY
timeout 120 python3 -P $O/prof.py $O/gen/kda_bench.py > $O/prof.txt 2>&1
