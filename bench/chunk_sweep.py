"""Sweep schedule choices of the chunk entry on the GPU in one run: compile the same spec with
several pipelines (pass options), check each against an fp32 token loop on a small shape with
NaN-poisoned outputs, time it at a prefill shape with per-kernel times, and print a table.

    python3 -P bench/chunk_sweep.py --spec bench/specs/kda_h96.toml --batch 1 --tokens 8192 --out DIR

Needs k3compile installed (bench/gpu_session.sh does it). A poor man's autotuner until issue 3's
tuner lands: its rows say which grouping and sizes to build the tuner's search space from.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, make_inputs, reference  # noqa: E402

PIPELINES = [
    "lower-recurrent,derive-chunkwise,fuse-chunkwise",
    "lower-recurrent,derive-chunkwise,fuse-chunkwise{num-warps=4}",
    "lower-recurrent,derive-chunkwise,fuse-chunkwise{block-v=32}",
    "lower-recurrent,derive-chunkwise,fuse-chunkwise{scan-stages=1}",
    "lower-recurrent,derive-chunkwise{chunk-size=32},fuse-chunkwise",
    "lower-recurrent,derive-chunkwise{chunk-size=32},fuse-chunkwise{block-v=32 num-warps=4}",
    "lower-recurrent,derive-chunkwise{chunk-size=16},fuse-chunkwise{num-warps=4}",
]


def kernel_times(fn, iters=5):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name.split("_chunk_")[-1].removesuffix("_kernel")] += event.device_time / iters / 1e3
    return dict(totals)


def main() -> None:
    import k3compile
    from k3compile.spec import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pipelines", help="';'-separated pipelines (default: the built-in list)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    p = spec.params
    H, HV, K, V = p["num_heads"], p["num_v_heads"], p["head_k_dim"], p["head_v_dim"]
    gate = {"kda": "channel", "gla": "channel", "gated_deltanet": "scalar", "deltanet": None}[spec.kind]
    delta = spec.kind != "gla"
    small = make_inputs(torch, 1, 300, H, HV, K, V, "cuda", 1, gate=gate, beta=delta)
    ref = reference(torch, small, K ** -0.5)
    big = make_inputs(torch, args.batch, args.tokens, H, HV, K, V, "cuda", 2, gate=gate, beta=delta)
    rows = []
    for pipeline in args.pipelines.split(";") if args.pipelines else PIPELINES:
        row = {"pipeline": pipeline}
        try:
            start = time.perf_counter()
            layer = k3compile.compile(spec, out_dir=Path(args.out) / "modules" / str(len(rows)), pipeline=pipeline)
            layer.module.POISON_OUTPUTS = True
            o, s = layer.chunk(**small, output_final_state=True)
            torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - start
            row["rms_o"], row["rms_S"] = compare(torch, o, ref[0])[1], compare(torch, s, ref[1])[1]
            layer.module.POISON_OUTPUTS = False
            call = lambda: layer.chunk(**big, output_final_state=True)  # noqa: E731
            row["ms"] = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
            row["kernels_ms"] = kernel_times(call)
        except Exception as err:  # a candidate that fails to compile or run scores infinity
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "chunk_sweep.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "spec": args.spec, "batch": args.batch, "tokens": args.tokens,
         "rows": rows}, indent=1))
    print(f"\n{spec.name} B{args.batch} T{args.tokens} on {torch.cuda.get_device_name()}")
    print("| pipeline | ms | kernels ms | rms o | rms S | first call s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| `{r['pipeline']}` | error: {r['error']} | | | | |")
        else:
            kernels = ", ".join(f"{k} {v:.2f}" for k, v in r["kernels_ms"].items())
            print(f"| `{r['pipeline']}` | {r['ms']:.3f} | {kernels} | {r['rms_o']:.2e} | {r['rms_S']:.2e} | {r['first_call_s']:.1f} |")


if __name__ == "__main__":
    main()
