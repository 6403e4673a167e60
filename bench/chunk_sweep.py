"""Sweep schedule choices of the chunk entry on the GPU in one run: compile one bench case's gate
variant (bench/chunk_cases.py) with several pipelines (pass options), check each against an fp32
token loop on a small shape with NaN-poisoned outputs, time it at the case's prefill shape with
per-kernel times, and print a table.

    python3 -P bench/chunk_sweep.py --case kda_h96 [--pairing bounded] [--batch 1 --tokens 8192] --out DIR

Needs k3compile installed (bench/device_run.sh does it). Its rows say which grouping and sizes
the tuner's search space is built from (k3c tune searches the space it settled on).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chunk_cases import CASES, PAIRINGS, gate_floor, pairings_of, read_layer, variant_table  # noqa: E402
from common import compare, kernel_times, make_inputs, reference  # noqa: E402

PIPELINES = [
    "lower-recurrent,derive-chunkwise,fuse-chunkwise",
    "lower-recurrent,derive-chunkwise,fuse-chunkwise{num-warps=4}",
    "lower-recurrent,derive-chunkwise,fuse-chunkwise{block-v=32}",
    "lower-recurrent,derive-chunkwise,fuse-chunkwise{scan-stages=1}",
    "lower-recurrent,derive-chunkwise{chunk-size=32},fuse-chunkwise",
    "lower-recurrent,derive-chunkwise{chunk-size=32},fuse-chunkwise{block-v=32 num-warps=4}",
    "lower-recurrent,derive-chunkwise{chunk-size=16},fuse-chunkwise{num-warps=4}",
]


def main() -> None:
    import k3compile
    from k3compile.spec import spec_from_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, choices=CASES, help="a case of bench/chunk_cases.py")
    parser.add_argument("--pairing", default="bounded", choices=PAIRINGS,
                        help="its gate variant: bounded (gate_input clamped, gates clamped at -5; default) or unbounded")
    parser.add_argument("--batch", type=int, help="B (default: the case's)")
    parser.add_argument("--tokens", type=int, help="T (default: the case's)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--pipelines", help="';'-separated pipelines (default: the built-in list)")
    args = parser.parse_args()
    layer = read_layer(args.case)
    if args.pairing not in pairings_of(layer["kind"]):
        parser.error(f"--pairing: {args.case} ({layer['kind']}) runs {', '.join(pairings_of(layer['kind']))} only")
    spec = spec_from_table(variant_table(layer, args.pairing), source=f"bench/specs/{args.case}.toml [{args.pairing}]")
    args.batch = args.batch or CASES[args.case][0]
    args.tokens = args.tokens or CASES[args.case][1]
    p = spec.params
    H, HV, K, V = p["num_heads"], p["num_v_heads"], p["head_k_dim"], p["head_v_dim"]
    gate = {"kda": "channel", "gla": "channel", "gated_deltanet": "scalar", "deltanet": None}[spec.kind]
    delta = spec.kind != "gla"
    floor = gate_floor(args.pairing)
    small = make_inputs(torch, 1, 300, H, HV, K, V, "cuda", 1, gate=gate, beta=delta, gate_floor=floor)
    ref = reference(torch, small, K ** -0.5)
    big = make_inputs(torch, args.batch, args.tokens, H, HV, K, V, "cuda", 2, gate=gate, beta=delta, gate_floor=floor)
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
            row["kernels_ms"] = kernel_times(torch, call, short=lambda n: n.split("_chunk_")[-1].removesuffix("_kernel"))
        except Exception as err:  # a candidate that fails to compile or run scores infinity
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "chunk_sweep.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "case": args.case, "pairing": args.pairing, "spec": spec.name,
         "command": " ".join(["python3", *sys.argv]), "batch": args.batch, "tokens": args.tokens, "rows": rows}, indent=1))
    print(f"\n{spec.name} ({args.pairing} pairing) B{args.batch} T{args.tokens} on {torch.cuda.get_device_name()}")
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
