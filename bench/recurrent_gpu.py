"""Decode-time benchmark of a k3compile-generated KDA `recurrent` against fla's fused_recurrent_kda.

Standalone: needs torch and triton (and fla-core for the comparison), NOT k3compile or xDSL.
It imports modules that k3compile already generated, from `--modules DIR`:

    python -c "import k3compile; k3compile.compile('bench/kda_bench.toml', 'bench/generated')"
    python3 bench/recurrent_gpu.py --out DIR                  # on the GPU machine, from the repo root
    TRITON_INTERPRET=1 python bench/recurrent_gpu.py --device cpu --tiny --out /tmp/rb   # CPU smoke test

Each module `<name>.py` exposes
    recurrent(q, k, v, g=None, beta=None, scale=None, initial_state=None,
              output_final_state=False, cu_seqlens=None) -> (o, final_state)
with fla's layouts: q, k [B,T,H,K]; v [B,T,HV,V]; g [B,T,HV,K]; beta [B,T,HV]; state [N,HV,K,V] fp32.

Writes DIR/recurrent_bench.md (the table also goes to stdout) and DIR/recurrent_bench.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import (  # noqa: E402
    compare,
    cpu_time_ms,
    device_name as get_device_name,
    fmt,
    git_commit,
    import_file,
    import_fla,
    ints,
    io_bytes,
    make_inputs,
    reference,
    short_error,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Time a generated KDA `recurrent` (decode shapes) side by side with fla's fused_recurrent_kda.",
    )
    p.add_argument("--out", required=True, help="folder for recurrent_bench.md and recurrent_bench.json")
    p.add_argument("--modules", default="bench/generated", help="folder of generated modules (default: bench/generated)")
    p.add_argument("--module", default="kda_bench", help="module name, file <modules>/<name>.py (default: kda_bench)")
    p.add_argument("--heads", type=int, default=32, help="qk heads H (must match the module; default 32)")
    p.add_argument("--v-heads", type=int, default=None, help="value heads HV (default: --heads)")
    p.add_argument("--head-k-dim", type=int, default=128, help="K (default 128)")
    p.add_argument("--head-v-dim", type=int, default=128, help="V (default 128)")
    p.add_argument("--batches", default="1,64,256", help="comma-separated B values (default 1,64,256)")
    p.add_argument("--tokens", default="1,8", help="comma-separated T values (default 1,8)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu (Triton interpreter)")
    p.add_argument("--tiny", action="store_true", help="smoke test: B in (1,2), T in (1,2), few reps; with --device cpu sets TRITON_INTERPRET=1")
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms (default 25)")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench rep, ms (default 100)")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timing columns (do_bench_cudagraph)")
    p.add_argument("--no-fla", action="store_true", help="do not import or time fla")
    p.add_argument("--no-ref", action="store_true", help="skip the fp32 torch token-loop reference check")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    on_cpu = args.device == "cpu"
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    if args.tiny:
        batches, tokens = [1, 2], [1, 2]
    else:
        batches, tokens = ints(args.batches), ints(args.tokens)

    import torch
    import triton
    import triton.testing

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --device cpu --tiny for a smoke test")
    device = torch.device(args.device)

    H, K, V = args.heads, args.head_k_dim, args.head_v_dim
    HV = args.v_heads or H
    scale = K**-0.5

    module_path = Path(args.modules) / f"{args.module}.py"
    source = module_path.read_bytes()
    ours_mod = import_file(module_path, args.module)
    ours = ours_mod.recurrent

    fla_fn, fla_version, fla_error, fla_note = None, None, None, None
    if args.no_fla:
        fla_error = "disabled (--no-fla)"
    else:
        start = time.perf_counter()
        try:
            fla_fn, fla_version, fla_note = import_fla("fla.ops.kda", "fused_recurrent_kda")
        except Exception as err:  # noqa: BLE001 - any import failure: still time ours
            fla_fn, fla_error, fla_note = None, short_error(err), None
        fla_import_s = time.perf_counter() - start

    def call_ours(inp):
        return ours(
            inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"], scale=scale,
            initial_state=inp["initial_state"], output_final_state=True,
        )

    def call_fla(inp):
        # Pre-normalised q/k, post-sigmoid beta, log-space g: no in-kernel norm / gate / sigmoid.
        return fla_fn(
            inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], scale=scale,
            initial_state=inp["initial_state"], output_final_state=True,
            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
        )

    def sync():
        if not on_cpu:
            torch.cuda.synchronize()

    def bench(fn):
        if on_cpu:
            return cpu_time_ms(fn, reps=2 if args.tiny else 5)
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

    def bench_graph(fn):
        if on_cpu or args.no_graph:
            return None
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=args.rep, return_mode="median")
        except Exception as err:  # noqa: BLE001
            return "graph failed: " + short_error(err)[:60]

    rows = []
    for B in batches:
        for T in tokens:
            row = dict(B=B, T=T, H=H, HV=HV, K=K, V=V)
            inp = make_inputs(torch, B, T, H, HV, K, V, device, args.seed + 1000 * B + T)
            row["bytes"] = io_bytes(inp, B, T, HV, V, out_elem=2)
            results = {}
            for name, fn in (("ours", call_ours), ("fla", call_fla if fla_fn is not None else None)):
                if fn is None:
                    row[f"{name}_error"] = fla_error
                    continue
                try:
                    sync()
                    start = time.perf_counter()
                    results[name] = fn(inp)
                    sync()
                    row[f"{name}_first_call_s"] = time.perf_counter() - start
                    row[f"{name}_ms"] = bench(lambda: fn(inp))
                    row[f"{name}_graph_ms"] = bench_graph(lambda: fn(inp))
                    row[f"{name}_TBps"] = row["bytes"] / (row[f"{name}_ms"] * 1e-3) / 1e12
                except Exception as err:  # noqa: BLE001 - record it, keep going
                    row[f"{name}_error"] = short_error(err)
                    traceback.print_exc()
                    results.pop(name, None)
            if "ours" in results and "fla" in results:
                (o1, s1), (o2, s2) = results["ours"], results["fla"]
                row["o_maxdiff"], row["o_rms"] = compare(torch, o1, o2)
                row["state_maxdiff"], row["state_rms"] = compare(torch, s1, s2)
            if not args.no_ref and results:
                o_ref, s_ref = reference(torch, inp, scale)
                for name, (o, s) in results.items():
                    row[f"{name}_ref_o_rms"] = compare(torch, o, o_ref)[1]
                    row[f"{name}_ref_state_rms"] = compare(torch, s, s_ref)[1] if s is not None else None
                del o_ref, s_ref
            rows.append(row)
            del inp, results
            if not on_cpu:
                torch.cuda.empty_cache()

    # ---- report ----
    device_name = get_device_name(torch, on_cpu)
    commit = git_commit()
    meta = dict(
        device=device_name,
        torch=torch.__version__,
        triton=triton.__version__,
        fla=fla_version,
        fla_error=fla_error,
        fla_import_note=fla_note,
        python=sys.version.split()[0],
        module=str(module_path),
        module_sha256=hashlib.sha256(source).hexdigest(),
        git_commit=commit,
        timing="cpu perf_counter median" if on_cpu else f"triton.testing.do_bench median, warmup {args.warmup} ms, rep {args.rep} ms",
        graph_timing=None if (on_cpu or args.no_graph) else f"triton.testing.do_bench_cudagraph median, rep {args.rep} ms (no L2 flush)",
        dtypes="q,k,v,beta bf16 (q,k L2-normalised), g fp32 logsigmoid clamped at -5, state fp32",
        bytes_definition="2*B*HV*K*V*4 (state read+write) + q,k,v,g,beta bytes + o bytes (bf16)",
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    if not args.no_fla:
        meta["fla_import_s"] = fla_import_s

    us = lambda ms: None if ms is None or isinstance(ms, str) else ms * 1e3  # noqa: E731
    lines = [
        f"# recurrent decode: `{args.module}` (k3compile) vs fla fused_recurrent_kda",
        "",
        f"device {device_name}; torch {torch.__version__}, triton {triton.__version__}, fla-core {fla_version or 'unavailable'}",
        f"H={H}, HV={HV}, K={K}, V={V}; {meta['dtypes']}; output_final_state=True.",
        f"Timing: {meta['timing']}." + (f" Graph columns: {meta['graph_timing']}." if meta["graph_timing"] else ""),
        f"TB/s: {meta['bytes_definition']}, over the median time. Δ columns: ours vs fla; rms = ‖ours − fla‖/‖fla‖.",
        "ref columns: ‖x − ref‖/‖ref‖ against an fp32 torch token loop.",
    ]
    if fla_error:
        lines.append(f"fla: unavailable ({fla_error})")
    if fla_note:
        lines.append(f"fla: {fla_note}")
    lines.append("")
    header = ["B", "T", "ours µs", "fla µs", "fla/ours", "ours TB/s", "fla TB/s"]
    if meta["graph_timing"]:
        header += ["ours graph µs", "fla graph µs"]
    header += ["max|Δo|", "rms Δo", "max|ΔS|", "rms ΔS", "ours ref o", "ours ref S", "fla ref o", "first call ours/fla s"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        ours_t = fmt(us(r["ours_ms"]), 1) if "ours_ms" in r else "error"
        fla_t = fmt(us(r["fla_ms"]), 1) if "fla_ms" in r else ("unavailable" if fla_fn is None else "error")
        ratio = r["fla_ms"] / r["ours_ms"] if "fla_ms" in r and "ours_ms" in r else None
        cells = [str(r["B"]), str(r["T"]), ours_t, fla_t, fmt(ratio, 2, "×") if ratio else "-",
                 fmt(r.get("ours_TBps"), 2), fmt(r.get("fla_TBps"), 2)]
        if meta["graph_timing"]:
            for name in ("ours", "fla"):
                gm = r.get(f"{name}_graph_ms")
                cells.append(gm if isinstance(gm, str) else fmt(us(gm), 1))
        cells += [fmt(r.get("o_maxdiff"), 4), fmt(r.get("o_rms"), 5), fmt(r.get("state_maxdiff"), 4), fmt(r.get("state_rms"), 5),
                  fmt(r.get("ours_ref_o_rms"), 5), fmt(r.get("ours_ref_state_rms"), 5), fmt(r.get("fla_ref_o_rms"), 5),
                  f"{fmt(r.get('ours_first_call_s'), 2)} / {fmt(r.get('fla_first_call_s'), 2)}"]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [(r["B"], r["T"], n, r[f"{n}_error"]) for r in rows for n in ("ours", "fla")
              if r.get(f"{n}_error") and not (n == "fla" and r[f"{n}_error"] == fla_error)]
    if errors:
        lines += ["", "Errors:"] + [f"- B={b} T={t} {n}: {e}" for b, t, n, e in errors]
    table = "\n".join(lines) + "\n"
    print(table)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recurrent_bench.md").write_text(table)
    (out / "recurrent_bench.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str) + "\n")
    print(f"wrote {out / 'recurrent_bench.md'} and {out / 'recurrent_bench.json'}")
    bad = any(r.get("ours_error") for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
