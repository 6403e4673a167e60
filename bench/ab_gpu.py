"""Two builds of k3compile, A and B, their generated kernels timed side by side in one process on
the GPU: the `chunk` entry of every case and gate pairing of bench/chunk_cases.py, `decode` at
B = 1, 64, 256 over a state pool with scattered slots in a CUDA graph, and the AttnRes
`aggregate` at D = 7168. A and B get the same inputs; the table gives both times, B / A, and
whether B's outputs equal A's bit for bit (a change that moves no arithmetic must keep them so).
Times are medians of ROUNDS rounds that alternate A and B, each round Triton's do_bench (median
of its repetitions), so drift of the GPU's clocks hits both sides alike.

Each build compiles the same set of modules with its own k3compile (`compile`, on any machine);
`run` needs only torch and triton:

    PYTHONPATH=<build A's site> python -P bench/ab_gpu.py compile --out bench/generated/ab/a
    PYTHONPATH=<build B's site> python -P bench/ab_gpu.py compile --out bench/generated/ab/b
    python3 bench/ab_gpu.py run --a bench/generated/ab/a --b bench/generated/ab/b --out DIR   # on the GPU

One build can stand for both, B with other pass options: `compile --kinds attnres
--attnres-pipeline '...'` (e.g. fuse-attnres{rows-per-program=4} with the rest of the default), or
`compile --kinds chunk --chunk-pipeline '...'` for every chunk variant (e.g.
'lower-recurrent,derive-chunkwise,fuse-chunkwise{block-v=128 scan-warps=8}').

Writes DIR/ab.md (also printed) and DIR/ab.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import zlib
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from chunk_cases import CASES, GATE_FLOOR, gate_floor, ours_semantics, write_variant_specs  # noqa: E402
from common import git_commit, import_file, make_inputs  # noqa: E402

DECODE_SPEC = Path(__file__).resolve().parent / "kda_bench.toml"
ATTNRES_SPEC = Path(__file__).resolve().parents[1] / "examples" / "attnres.toml"
DECODE_BATCHES = (1, 64, 256)
DECODE_POOL = 1024  # state pool rows; each step's rows are a random scattered subset
ATTNRES_SOURCES = (2, 5, 9)  # S of the AttnRes cases, each at every row count of --attnres-rows
ROUNDS = 5


def compile_modules(out: Path, kinds: str = "chunk,decode,attnres", attnres_pipeline: str | None = None,
                    chunk_pipeline: str | None = None) -> None:
    """This interpreter's k3compile compiles the modules of `kinds` (comma-separated): every chunk
    variant (under `chunk_pipeline`, else its kind's default), the decode layer, the AttnRes block
    (under `attnres_pipeline`, else its default)."""
    import k3compile

    kinds_asked = set(kinds.split(","))
    count = 0
    if "chunk" in kinds_asked:
        with tempfile.TemporaryDirectory() as specs:
            for name, _, _ in write_variant_specs(Path(specs), CASES):
                k3compile.compile(Path(specs) / f"{name}.toml", out, pipeline=chunk_pipeline)
                count += 1
    if "decode" in kinds_asked:
        k3compile.compile(DECODE_SPEC, out)
        count += 1
    if "attnres" in kinds_asked:
        k3compile.compile(ATTNRES_SPEC, out, pipeline=attnres_pipeline)
        count += 1
    print(f"compiled {count} modules into {out} with k3compile from {Path(k3compile.__file__).parent}")


def layer_of(module) -> dict:
    """The spec's [layer] table, read back from the module's docstring (`layer: k3.<op> <...>`)."""
    line = next(line for line in module.__doc__.splitlines() if line.startswith("layer: "))
    items = line[line.index("<") + 1:line.rindex(">")].split(", ")
    return {k: v for k, v in (item.split(" = ", 1) for item in items)}


def chunk_cases(torch, a_dir: Path, b_dir: Path, gate_scale: float = 1.0, cases: str | None = None):
    """(name, call A, call B) per chunk variant (of `cases`, comma-separated; default all)."""
    with tempfile.TemporaryDirectory() as specs:
        listed = list(write_variant_specs(Path(specs), CASES))
    for variant, case, pairing in listed:
        if cases and case not in cases.split(","):
            continue
        a, b = (import_file(d / f"{variant}.py", f"{d.name}_{variant}") for d in (a_dir, b_dir))
        layer = layer_of(a)
        H, HV = int(layer["num_heads"]), int(layer["num_v_heads"])
        K, V = int(layer["head_k_dim"]), int(layer["head_v_dim"])
        gate = "scalar" if layer["gate"] == "scalar" else "channel"
        beta = layer["delta_rule"] == "true"
        B, T = CASES[case]
        inp = make_inputs(torch, B, T, H, HV, K, V, "cuda", seed=zlib.crc32(variant.encode()) % 1000, gate=gate, beta=beta,
                          gate_floor=gate_floor(pairing), gate_scale=gate_scale)

        def caller(module, inp=inp):
            return lambda: module.chunk(inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"],
                                        initial_state=inp["initial_state"], output_final_state=True)

        steep = f", gates {gate_scale:g} x logsigmoid(randn)" if gate_scale != 1 else ""
        yield f"chunk {variant} B{B} T{T} H{HV} [{ours_semantics(pairing)}{steep}]", caller(a), caller(b)


def decode_cases(torch, a_dir: Path, b_dir: Path):
    a, b = (import_file(d / "kda_bench.py", f"{d.name}_kda_bench") for d in (a_dir, b_dir))
    layer = layer_of(a)
    H, K, V = int(layer["num_heads"]), int(layer["head_k_dim"]), int(layer["head_v_dim"])
    for B in DECODE_BATCHES:
        inp = make_inputs(torch, B, 1, H, H, K, V, "cuda", seed=B, gate_floor=GATE_FLOOR)
        pool = torch.randn(DECODE_POOL, H, K, V, device="cuda") * 0.1
        slots = torch.randperm(DECODE_POOL, device="cuda")[:B].to(torch.int32)
        pools = {"a": pool.clone(), "b": pool.clone()}

        def caller(module, side, inp=inp, slots=slots):
            # one decode step in a CUDA graph; each replay advances the pool's rows again
            def step():
                return module.decode(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], state=pools[side],
                                     state_indices=slots, check_indices=False)
            return step

        yield f"decode B{B} (pool {DECODE_POOL}, scattered slots, CUDA graph)", caller(a, "a"), caller(b, "b")


def attnres_cases(torch, a_dir: Path, b_dir: Path, row_counts: str = "8192"):
    a, b = (import_file(d / "attnres.py", f"{d.name}_attnres") for d in (a_dir, b_dir))
    D = int(layer_of(a)["hidden_size"])
    for rows, S in itertools.product((int(n) for n in row_counts.split(",")), ATTNRES_SOURCES):
        gen = torch.Generator(device="cpu").manual_seed(S * rows)
        sources = torch.randn(S, 1, rows, D, generator=gen).to("cuda", torch.bfloat16)
        query = torch.randn(D, generator=gen).to("cuda", torch.bfloat16)
        gain = (1 + 0.1 * torch.randn(D, generator=gen)).to("cuda", torch.bfloat16)

        def caller(module, sources=sources, query=query, gain=gain):
            return lambda: module.aggregate(sources, query, gain)

        yield f"attnres aggregate S{S} N{rows} D{D}", caller(a), caller(b)


def outputs(result) -> list:
    return [t for t in (result if isinstance(result, tuple) else (result,)) if t is not None]


def run(args) -> int:
    import torch
    import triton.testing

    rows, failed = [], 0
    groups = [("chunk", partial(chunk_cases, gate_scale=args.gate_scale, cases=args.cases)), ("decode", decode_cases),
              ("attnres", partial(attnres_cases, row_counts=args.attnres_rows))]
    for kind, cases in [g for g in groups if g[0] in args.kinds.split(",")]:
        for name, call_a, call_b in cases(torch, args.a, args.b):
            # outputs first (one call each on the same inputs: decode's pools start equal)
            got_a, got_b = outputs(call_a()), outputs(call_b())
            same = all(torch.equal(x, y) for x, y in zip(got_a, got_b, strict=True))
            failed += not same
            timer = triton.testing.do_bench_cudagraph if kind == "decode" else triton.testing.do_bench
            times = {"a": [], "b": []}
            for _ in range(ROUNDS):
                for side, call in (("a", call_a), ("b", call_b)):
                    times[side].append(timer(call) * 1e3)  # µs
            a_us, b_us = statistics.median(times["a"]), statistics.median(times["b"])
            rows.append(dict(case=name, a_us=a_us, b_us=b_us, ratio=b_us / a_us, bitwise_equal=same))
            print(f"{name}: A {a_us:.1f} µs, B {b_us:.1f} µs, B/A {b_us / a_us:.3f}, "
                  f"{'bitwise equal' if same else 'OUTPUTS DIFFER'}", flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                commit=git_commit(), a=str(args.a), b=str(args.b), rounds=ROUNDS)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"A: {args.a}, B: {args.b}; {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, "
             f"tree {meta['commit']}; medians of {ROUNDS} alternating rounds of do_bench (decode: do_bench_cudagraph)",
             "", "| case | A µs | B µs | B / A | outputs |", "|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['a_us']:.1f} | {r['b_us']:.1f} | {r['ratio']:.3f} | "
              f"{'bitwise equal' if r['bitwise_equal'] else 'differ'} |" for r in rows]
    (args.out / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    compile_parser = sub.add_parser("compile", help="compile the modules with this interpreter's k3compile")
    compile_parser.add_argument("--out", type=Path, required=True)
    compile_parser.add_argument("--kinds", default="chunk,decode,attnres", help="which modules (comma-separated)")
    compile_parser.add_argument("--attnres-pipeline", help="the AttnRes block's pipeline (default: its kind's)")
    compile_parser.add_argument("--chunk-pipeline", help="every chunk variant's pipeline (default: its kind's)")
    run_parser = sub.add_parser("run", help="time build A's modules against build B's on the GPU")
    run_parser.add_argument("--a", type=Path, required=True)
    run_parser.add_argument("--b", type=Path, required=True)
    run_parser.add_argument("--out", type=Path, required=True)
    run_parser.add_argument("--kinds", default="chunk,decode,attnres", help="which groups of cases (comma-separated)")
    run_parser.add_argument("--cases", help="chunk cases (comma-separated; default: all of chunk_cases.py)")
    run_parser.add_argument("--attnres-rows", default="8192", help="token rows of the AttnRes cases (comma-separated)")
    run_parser.add_argument("--gate-scale", type=float, default=1.0,
                            help="chunk gates drawn as SCALE * logsigmoid(randn) (default 1)")
    args = parser.parse_args(argv)
    if args.command == "compile":
        compile_modules(args.out, args.kinds, args.attnres_pipeline, args.chunk_pipeline)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
