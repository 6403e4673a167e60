"""Block AttnRes on the GPU: the one-phase aggregate against the two phases, per block of Q
aggregation points over n completed representatives (docs/attnres.md, "Block AttnRes: two phases").

    one phase   at each point j: attnres_aggregate([b_0 .. b_{n-1}, x], w_j, g_j)      (Q calls)
    two phases  attnres_block_partials([b_0 .. b_{n-1}], W, G) once, then at each point
                attnres_block_merge(partials_j, x, w_j, g_j)                            (1 + Q calls)

The layer (K3's configuration unless told otherwise: D = 7168, 8 blocks, Q = 24 points a block,
bf16 activations) is compiled once per pair of derive-block-attnres's rows-per-program and
partials (--builds: a program per row or groups of rows in both phases; the partials in fp32 as
the loop carries them or normalised in the activations' dtype), its entries called
directly; the one-phase aggregate is the same kernel in every build. The sources of the
one-phase calls are stacked once, outside the timing. Every
output of both forms is first checked against a float64 evaluation of the definition (softmax over
the sources of w_j . (g_j * RMSNorm(b_i)), the mix of the sources) on the first token rows, then
each form is timed per block (do_bench median). Bytes per token row and point are the kernels'
loads and stores counted from the shapes (k3compile.passes.derive_block_attnres.block_attnres_bytes),
as loaded and as if a row's programs shared one read of its representatives from L2; the table
gives the achieved bandwidth for the as-loaded figure and the copy bandwidth of the same run.

    python3 -P bench/block_attnres_gpu.py --out DIR [--tokens 8192] [--representatives 1,2,4,8] [--builds 1:normalised,8:normalised,1:numerator]
    python3 bench/block_attnres_gpu.py --out DIR --smoke      # CPU: Triton's interpreter, tiny sizes

Writes DIR/block_attnres.md (also printed) and DIR/block_attnres.json; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import copy_bandwidth, fmt, git_commit, ints  # noqa: E402

TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-5}  # RMS ratio against float64
CHECK_ROWS = 256  # token rows of the float64 check
EPS = 1e-6
NUM_BLOCKS = 8  # K3's block representatives at most (the layer's num_blocks)


def rms_ratio(torch, got, want) -> float:
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-300))


def reference_aggregate(torch, sources, query, gain):
    """The definition in float64: softmax over the sources of w . (g * RMSNorm(b_i)), then the mix."""
    x = sources.double()
    keys = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gain.double()
    weights = torch.softmax(keys @ query.double(), dim=0)
    return (weights[..., None] * x).sum(0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=8192, help="token rows per call, B = 1 (default 8192)")
    p.add_argument("--hidden", type=int, default=7168, help="D (default 7168: K3's)")
    p.add_argument("--queries", type=int, default=24, help="aggregation points a block, Q (default 24: K3's)")
    p.add_argument("--representatives", default="1,2,4,8", help="completed block representatives n (comma-separated)")
    p.add_argument("--builds", default="1:normalised,8:normalised,1:numerator",
                   help="derive-block-attnres{rows-per-program=R partials=P} builds as R:P, comma-separated")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(TOLERANCE))
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench rep, ms")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: interpreter, fp32, D 48, T 5, Q 3, n 1 and 3")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        args.tokens, args.hidden, args.queries, args.representatives, args.dtype = 5, 48, 3, "1,3", "float32"
    import torch
    import triton.testing

    import k3compile
    from k3compile.passes.derive_block_attnres import block_attnres_bytes
    from k3compile.pipeline import DEFAULT_PIPELINES
    from k3compile.spec import spec_from_table

    device = "cpu" if args.smoke else "cuda"
    dtype = getattr(torch, args.dtype)
    T, D, Q = args.tokens, args.hidden, args.queries
    rows = min(T, CHECK_ROWS)

    def bench(fn) -> float:
        if args.smoke:  # the interpreter: one call's wall time, a smoke figure only
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

    copy_Bps = None
    if not args.smoke:
        copy_Bps = copy_bandwidth(torch, bench, 2048, device)  # 2 GiB: well past L2
    print(f"copy bandwidth: {fmt(copy_Bps and copy_Bps / 1e12, 3)} TB/s", flush=True)

    layers = {}
    for build in args.builds.split(","):
        rows_per_program, _, partials = build.partition(":")
        # the forward phases only (the numerator partials have no derived backward)
        pipeline = DEFAULT_PIPELINES["attnres"].replace("derive-block-attnres-backward,", "").replace(
            "derive-block-attnres,", f"derive-block-attnres{{rows-per-program={rows_per_program} partials={partials}}},")
        spec = spec_from_table(dict(name=f"block_attnres_r{rows_per_program}_{partials}", kind="attnres",
                                    hidden_size=D, num_blocks=NUM_BLOCKS, block_size=12, eps=EPS),
                               source="<block_attnres_gpu>")
        layers[build] = k3compile.compile(spec, pipeline=pipeline)

    gen = torch.Generator(device=device).manual_seed(0)
    results, failed = [], False
    with torch.no_grad():
        queries = (0.05 * torch.randn(Q, D, generator=gen, device=device)).to(dtype)
        gains = (1 + 0.1 * torch.randn(Q, D, generator=gen, device=device)).to(dtype)
        partial_sum = torch.randn(1, T, D, generator=gen, device=device).to(dtype)
        for n, (build, layer) in itertools.product(ints(args.representatives), layers.items()):
            representatives = torch.randn(n, 1, T, D, generator=gen, device=device).to(dtype)
            sources = torch.cat([representatives, partial_sum[None]])

            def one_phase(layer=layer, sources=sources):
                return [layer.aggregate(sources, queries[j], gains[j])[0] for j in range(Q)]

            def two_phases(layer=layer, representatives=representatives):
                partials = layer.block_partials(representatives, queries, gains)
                return [layer.block_merge(partial_sum[None], queries[j], gains[j], *(p[j] for p in partials))[0]
                        for j in range(Q)]

            errors = {"one phase": 0.0, "two phases": 0.0}
            for form, outputs in (("one phase", one_phase()), ("two phases", two_phases())):
                for j, h in enumerate(outputs):
                    want = reference_aggregate(torch, sources[:, :, :rows], queries[j], gains[j])
                    errors[form] = max(errors[form], rms_ratio(torch, h[:, :rows], want))
            ok = all(error <= TOLERANCE[args.dtype] for error in errors.values())
            failed |= not ok
            times = {"one phase": bench(one_phase), "two phases": bench(two_phases)} if ok else {}
            if ok:
                first = [p[0] for p in layer.block_partials(representatives, queries, gains)]
                times["block_partials"] = bench(lambda: layer.block_partials(representatives, queries, gains))
                times["block_merge"] = bench(lambda: layer.block_merge(partial_sum[None], queries[0], gains[0], *first))
            per_point = block_attnres_bytes(D, n, Q, activation_bytes=dtype.itemsize, partials=build.partition(":")[2])
            row = dict(n=n, build=build, T=T, D=D, Q=Q, dtype=args.dtype, errors=errors,
                       check="ok" if ok else "FAILED", ms=times, bytes_per_row_point=per_point)
            for form, key in (("one phase", "one_phase"), ("two phases", "two_phase")):
                if form in times and copy_Bps:
                    row[f"{key}_TBps"] = per_point[key] * T * Q / (times[form] * 1e-3) / 1e12
            results.append(row)
            print(f"n={n} build {build}: one phase {fmt(times.get('one phase'), 3)} ms, two phases {fmt(times.get('two phases'), 3)} "
                  f"ms per block of {Q} points; errors {errors}; {row['check']}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    copy_text = f"{copy_Bps / 1e12:.3f} TB/s" if copy_Bps else "not measured (CPU)"
    lines = [
        "# Block AttnRes: the one-phase aggregate against the two phases, per block of aggregation points",
        "",
        f"device {'CPU (interpreter, smoke)' if args.smoke else torch.cuda.get_device_name()}; torch {torch.__version__}, "
        f"triton {triton.__version__}; commit {git_commit()}; {args.dtype}, B = 1, T = {T}, D = {D}, Q = {Q}; "
        f"copy bandwidth {copy_text}.",
        f"Command: `python3 -P bench/block_attnres_gpu.py --out DIR --tokens {T} --hidden {D} --queries {Q} "
        f"--representatives {args.representatives} --builds {args.builds} --dtype {args.dtype}`"
        + (" (--smoke)" if args.smoke else ""),
        "Times per block (Q points), do_bench median; check: both forms' every output against float64 on the first "
        f"{rows} rows (RMS ratio <= {TOLERANCE[args.dtype]:g}). Bytes per token row and point from the kernels' "
        "shapes: two phases as loaded / with one read of the representatives per row.",
        "",
        "| n | rows a program : partials | one phase ms | two phases ms | two / one | block_partials ms | block_merge ms | bytes one phase | "
        "bytes two phases (one read) | one phase TB/s | two phases TB/s | max error one / two | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t, b = r["ms"], r["bytes_per_row_point"]
        ratio = t["two phases"] / t["one phase"] if t else None
        lines.append(
            f"| {r['n']} | {r['build']} | {fmt(t.get('one phase'), 3)} | {fmt(t.get('two phases'), 3)} | {fmt(ratio, 2)} | "
            f"{fmt(t.get('block_partials'), 3)} | {fmt(t.get('block_merge'), 3)} | {b['one_phase']:,.0f} | "
            f"{b['two_phase']:,.0f} ({b['two_phase_one_read']:,.0f}) | {fmt(r.get('one_phase_TBps'), 2)} | "
            f"{fmt(r.get('two_phase_TBps'), 2)} | {r['errors']['one phase']:.1e} / {r['errors']['two phases']:.1e} | "
            f"{r['check']} |")
    table = "\n".join(lines) + "\n"
    (out / "block_attnres.md").write_text(table)
    (out / "block_attnres.json").write_text(json.dumps(dict(copy_TBps=copy_Bps and copy_Bps / 1e12, rows=results),
                                                       indent=1) + "\n")
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
