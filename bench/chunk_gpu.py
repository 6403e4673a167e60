"""Prefill benchmark of k3compile-generated `chunk` entries against fla's chunk kernels.

Standalone: needs torch and triton (and fla-core for the comparison), NOT k3compile or xDSL.
It imports modules that k3compile already generated, one per spec of bench/specs/ (heads are
baked into a module, hence one spec per head count), from `--modules DIR`:

    for s in bench/specs/*.toml; do
        k3c compile $s -o bench/generated -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise'
    done
    python3 bench/chunk_gpu.py --out DIR                      # on the GPU machine, from the repo root
    python bench/chunk_gpu.py --device cpu --tiny --out /tmp/cb   # CPU smoke test (Triton interpreter)

Each module `<name>.py` exposes
    chunk(q, k, v, g=None, beta=None, scale=None, initial_state=None,
          output_final_state=False, cu_seqlens=None) -> (o, final_state)
with fla's layouts: q, k [B,T,H,K]; v [B,T,HV,V]; g [B,T,HV,K] (kda, gla) or [B,T,HV]
(gated_deltanet), natural-log decay; beta [B,T,HV] (None for gla); state [N,HV,K,V] fp32.

Compared in the same run with fla.ops.kda.chunk_kda, fla.ops.gated_delta_rule.chunk_gated_delta_rule
and fla.ops.gla.chunk_gla. The bandwidth floor of a case is its minimal HBM traffic (inputs read
once, o written, initial state read, final state written) over the copy bandwidth measured in
the same run.

Writes DIR/chunk_bench.md (the table also goes to stdout) and DIR/chunk_bench.json, rewritten
after every case so that a run cut short still leaves the cases it finished.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
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
    io_bytes,
    make_inputs,
    reference,
    short_error,
    tensor_bytes,
)

# Each member: the gate's shape ("channel" [B,T,HV,K], "scalar" [B,T,HV]), whether it has the
# delta rule (beta), and fla's chunk function.
KINDS = {
    "kda": dict(gate="channel", beta=True, fla=("fla.ops.kda", "chunk_kda")),
    "gated_deltanet": dict(gate="scalar", beta=True, fla=("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")),
    "gla": dict(gate="channel", beta=False, fla=("fla.ops.gla", "chunk_gla")),
}

# case name = module name (bench/specs/<name>.toml compiles to <modules>/<name>.py)
CASES = {
    "kda_h96": dict(kind="kda", B=1, T=8192, H=96, K=128, V=128),
    "kda_h64": dict(kind="kda", B=4, T=4096, H=64, K=128, V=128),
    "kda_h16": dict(kind="kda", B=2, T=16384, H=16, K=128, V=128),
    "kda_h32_d64": dict(kind="kda", B=8, T=2048, H=32, K=64, V=64),
    "gdn_h32": dict(kind="gated_deltanet", B=4, T=4096, H=32, K=128, V=128),
    "gla_h32": dict(kind="gla", B=4, T=4096, H=32, K=128, V=128),
    "gla_h32_log": dict(kind="gla", B=4, T=4096, H=32, K=128, V=128),  # unbounded gate: elementwise diagonal
}
TINY_CASES = {"kda_h16": dict(CASES["kda_h16"], B=1, T=128)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Time generated `chunk` entries (prefill shapes) side by side with fla's chunk kernels.",
    )
    p.add_argument("--out", required=True, help="folder for chunk_bench.md and chunk_bench.json")
    p.add_argument("--modules", default="bench/generated", help="folder of generated modules (default: bench/generated)")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated cases, each also the module name (default: all: {','.join(CASES)})")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu (Triton interpreter)")
    p.add_argument("--tiny", action="store_true",
                   help="smoke test: only kda_h16 at B1 T128, few reps; with --device cpu sets TRITON_INTERPRET=1")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"),
                   help="q, k, v, beta and o (default bf16). Triton's interpreter computes bf16 tl.dot wrongly "
                        "(triton 3.9 multiplies the raw uint16 bits), so on the CPU only fp32 gives meaningful accuracy")
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms (default 25)")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench rep, ms (default 100)")
    p.add_argument("--copy-mib", type=int, default=None,
                   help="buffer for the copy-bandwidth measurement, MiB (default 2048; 16 with --tiny)")
    p.add_argument("--no-fla", action="store_true", help="do not import or time fla")
    p.add_argument("--fla-safe-gate", action="store_true",
                   help="chunk_kda with safe_gate=True, lower_bound=-5 (valid: g is clamped at -5); default off, as in the anchors")
    p.add_argument("--no-ref", action="store_true", help="skip the fp32 torch token-loop reference check")
    p.add_argument("--ref-tokens", type=int, default=300,
                   help="T of the extra B=1 shape checked against the fp32 token loop (ours only; default 300, "
                        "not a multiple of the chunk). With --tiny the main shape is checked instead, ours and fla")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def fla_kwargs(kind, safe_gate):
    """Keyword arguments for fla's chunk function: pre-normalised q/k, post-sigmoid beta, log-space g,
    so every in-kernel norm / gate / sigmoid is off."""
    if kind == "kda":
        kw = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False)
        if safe_gate:
            kw.update(safe_gate=True, lower_bound=-5.0)
        return kw
    if kind == "gated_deltanet":
        return dict(use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False)
    return {}  # chunk_gla(q, k, v, g, scale, initial_state, output_final_state, ...): no beta, no options


def main(argv=None):
    args = parse_args(argv)
    on_cpu = args.device == "cpu"
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    if args.tiny:
        cases = dict(TINY_CASES)
    else:
        names = [n for n in args.cases.split(",") if n.strip()]
        unknown = [n for n in names if n not in CASES]
        if unknown:
            sys.exit(f"unknown case(s) {unknown}; known: {list(CASES)}")
        cases = {n: CASES[n] for n in names}
        if not cases:
            sys.exit("no cases selected")
    copy_mib = args.copy_mib or (16 if args.tiny else 2048)

    import torch
    import triton
    import triton.testing

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --device cpu --tiny for a smoke test")
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]

    def sync():
        if not on_cpu:
            torch.cuda.synchronize()

    def bench(fn):
        if on_cpu:
            return cpu_time_ms(fn, reps=2 if args.tiny else 5)
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

    # ---- copy bandwidth: bytes read + written by a device copy, over its median time ----
    copy_Bps, copy_error = None, None
    try:
        n = copy_mib * 2**20 // 4
        src = torch.ones(n, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        copy_ms = bench(lambda: dst.copy_(src))
        copy_Bps = 2 * n * 4 / (copy_ms * 1e-3)
        del src, dst
        if not on_cpu:
            torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001 - the floor columns stay empty
        copy_error = short_error(err)
        traceback.print_exc()
    print(f"copy bandwidth ({copy_mib} MiB): {fmt(copy_Bps and copy_Bps / 1e12, 3)} TB/s", flush=True)

    # ---- fla, one chunk function per member used ----
    fla_fns, fla_errors, fla_version, fla_notes, fla_import_s = {}, {}, None, set(), 0.0
    for kind in sorted({c["kind"] for c in cases.values()}):
        if args.no_fla:
            fla_errors[kind] = "disabled (--no-fla)"
            continue
        start = time.perf_counter()
        try:
            fn, fla_version, note = import_fla(*KINDS[kind]["fla"])
            fla_fns[kind] = fn
            if note:
                fla_notes.add(note)
        except Exception as err:  # noqa: BLE001 - any import failure: still time ours
            fla_errors[kind] = short_error(err)
        fla_import_s += time.perf_counter() - start
    fla_backends = {p: importlib.util.find_spec(p) is not None for p in ("flash_kda", "flash_qla")}

    device_name = get_device_name(torch, on_cpu)
    meta = dict(
        device=device_name,
        torch=torch.__version__,
        triton=triton.__version__,
        fla=fla_version,
        fla_errors=fla_errors or None,
        fla_import_notes=sorted(fla_notes) or None,
        fla_import_s=None if args.no_fla else fla_import_s,
        fla_backend_packages=fla_backends,
        fla_calls={kind: f"{KINDS[kind]['fla'][0]}.{KINDS[kind]['fla'][1]}(q, k, v, g"
                   + (", beta" if KINDS[kind]["beta"] else "")
                   + ", scale=K**-0.5, initial_state=h0, output_final_state=True"
                   + "".join(f", {key}={value}" for key, value in fla_kwargs(kind, args.fla_safe_gate).items()) + ")"
                   for kind in sorted({c["kind"] for c in cases.values()})},
        python=sys.version.split()[0],
        modules=str(args.modules),
        git_commit=git_commit(),
        timing="cpu perf_counter median" if on_cpu else f"triton.testing.do_bench median, warmup {args.warmup} ms, rep {args.rep} ms",
        copy_mib=copy_mib,
        copy_TBps=copy_Bps and copy_Bps / 1e12,
        copy_error=copy_error,
        dtypes=f"q,k,v,beta {args.dtype} (q,k L2-normalised over K), g fp32 logsigmoid(randn) clamped at -5, "
               f"initial_state randn*0.1 fp32, o {args.dtype}, output_final_state=True; autograd on, no input requires grad",
        bytes_definition=f"q,k,v,g,beta bytes read + o bytes written ({args.dtype}) + 2*B*HV*K*V*4 (fp32 state read + write)",
        note=("TRITON_INTERPRET computes bf16 tl.dot on the raw uint16 bits (triton 3.9 interpreter): "
              "the accuracy columns of bf16 runs on the CPU are meaningless; use --dtype fp32")
        if on_cpu and args.dtype == "bf16" else None,
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
    )

    rows = []
    for name, case in cases.items():
        kind, B, T, H, K, V = case["kind"], case["B"], case["T"], case["H"], case["K"], case["V"]
        HV = case.get("HV", H)
        spec = KINDS[kind]
        scale = K**-0.5
        row = dict(case=name, kind=kind, B=B, T=T, H=H, HV=HV, K=K, V=V)
        print(f"== {name}: {kind} B={B} T={T} H={H} HV={HV} K={K} V={V}", flush=True)

        module_path = Path(args.modules) / f"{name}.py"
        row["module"] = str(module_path)
        ours = None
        try:
            row["module_sha256"] = hashlib.sha256(module_path.read_bytes()).hexdigest()
            ours = import_file(module_path, name).chunk
        except Exception as err:  # noqa: BLE001 - no module: still time fla
            row["ours_error"] = short_error(err)
            traceback.print_exc()
        fla_fn = fla_fns.get(kind)
        extra = fla_kwargs(kind, args.fla_safe_gate)

        def call_ours(inp):
            return ours(
                inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"], scale=scale,
                initial_state=inp["initial_state"], output_final_state=True,
            )

        def call_fla(inp):
            if spec["beta"]:
                return fla_fn(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], scale=scale,
                              initial_state=inp["initial_state"], output_final_state=True, **extra)
            return fla_fn(inp["q"], inp["k"], inp["v"], inp["g"], scale=scale,
                          initial_state=inp["initial_state"], output_final_state=True, **extra)

        inp = make_inputs(torch, B, T, H, HV, K, V, device, args.seed + hash_case(name),
                          gate=spec["gate"], beta=spec["beta"], dtype=dtype)
        row["bytes"] = io_bytes(inp, B, T, HV, V, out_elem=inp["v"].element_size())
        row["bytes_inputs"] = tensor_bytes(inp)
        row["floor_ms"] = row["bytes"] / copy_Bps * 1e3 if copy_Bps else None
        results = {}
        for who, fn in (("ours", call_ours if ours else None), ("fla", call_fla if fla_fn else None)):
            if fn is None:
                if who == "fla":
                    row["fla_error"] = fla_errors.get(kind)
                continue
            try:
                sync()
                start = time.perf_counter()
                results[who] = fn(inp)
                sync()
                row[f"{who}_first_call_s"] = time.perf_counter() - start
                row[f"{who}_ms"] = bench(lambda: fn(inp))
                if row["floor_ms"]:
                    row[f"{who}_floor_fraction"] = row["floor_ms"] / row[f"{who}_ms"]
            except Exception as err:  # noqa: BLE001 - record it, keep going
                row[f"{who}_error"] = short_error(err)
                traceback.print_exc()
                results.pop(who, None)
        if "ours" in results and "fla" in results:
            try:
                (o1, s1), (o2, s2) = results["ours"], results["fla"]
                row["o_maxdiff"], row["o_rms"] = compare(torch, o1, o2)
                row["state_maxdiff"], row["state_rms"] = compare(torch, s1, s2)
            except Exception as err:  # noqa: BLE001
                row["compare_error"] = short_error(err)

        # fp32 token loop: on the main shape in --tiny (ours and fla), else on an extra B=1 shape (ours only)
        if not args.no_ref:
            try:
                if args.tiny:
                    ref_inp, ref_results = inp, results
                else:
                    del results
                    ref_inp = make_inputs(torch, 1, args.ref_tokens, H, HV, K, V, device, args.seed + 7 + hash_case(name),
                                          gate=spec["gate"], beta=spec["beta"], dtype=dtype)
                    ref_results = {"ours": call_ours(ref_inp)} if ours else {}
                row["ref_shape"] = f"B1 T{ref_inp['q'].shape[1]}"
                o_ref, s_ref = reference(torch, ref_inp, scale)
                for who, (o, s) in ref_results.items():
                    row[f"{who}_ref_o_rms"] = compare(torch, o, o_ref)[1]
                    row[f"{who}_ref_state_rms"] = compare(torch, s, s_ref)[1] if s is not None else None
                del o_ref, s_ref, ref_inp, ref_results
            except Exception as err:  # noqa: BLE001
                row["ref_error"] = short_error(err)
                traceback.print_exc()
        rows.append(row)
        inp = results = None
        if not on_cpu:
            torch.cuda.empty_cache()
        print("   " + summary(row), flush=True)
        table = write_report(args.out, meta, rows, fla_fns)

    print(table)
    out = Path(args.out)
    print(f"wrote {out / 'chunk_bench.md'} and {out / 'chunk_bench.json'}")
    bad = any(r.get("ours_error") for r in rows)
    return 1 if bad else 0


def hash_case(name):
    """A seed offset per case that does not depend on PYTHONHASHSEED."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:6], 16)


def summary(r):
    parts = [f"ours {fmt(r.get('ours_ms'), 3)} ms", f"fla {fmt(r.get('fla_ms'), 3)} ms",
             f"floor {fmt(r.get('floor_ms'), 3)} ms", f"rms o {fmt(r.get('o_rms'), 5)}", f"rms S {fmt(r.get('state_rms'), 5)}"]
    parts += [f"{who} error: {r[who + '_error']}" for who in ("ours", "fla") if r.get(who + "_error")]
    return "; ".join(parts)


def write_report(out_dir, meta, rows, fla_fns):
    """Markdown table + JSON of the rows so far; returns the markdown."""
    copy = meta["copy_TBps"]
    lines = [
        "# chunk (prefill): k3compile-generated `chunk` vs fla's chunk kernels",
        "",
        f"device {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, fla-core {meta['fla'] or 'unavailable'}",
        f"{meta['dtypes']}.",
        f"Timing: {meta['timing']}. first call: wall time of the first call at the shape (ours: Triton compile; fla: compile + autotune).",
        f"floor: minimal IO ({meta['bytes_definition']}) over the copy bandwidth measured in this run, "
        f"{fmt(copy, 3)} TB/s ({meta['copy_mib']} MiB buffer, read + write); floor/x = fraction of the floor reached.",
        "rms Δ: ‖ours − fla‖/‖fla‖ on the case's shape. ref: ‖x − ref‖/‖ref‖ against an fp32 torch token loop on the ref shape.",
    ]
    for kind, call in meta["fla_calls"].items():
        lines.append(f"fla {kind}: `{call}`" + (f" (unavailable: {meta['fla_errors'][kind]})" if kind not in fla_fns else ""))
    for note in meta["fla_import_notes"] or []:
        lines.append(f"fla: {note}")
    if meta["note"]:
        lines.append(f"Note: {meta['note']}")
    if meta["copy_error"]:
        lines.append(f"copy bandwidth: failed ({meta['copy_error']})")
    lines.append("")
    header = ["case", "B", "T", "H", "K=V", "ours ms", "fla ms", "fla/ours", "IO GB", "floor ms", "floor/ours", "floor/fla",
              "first call ours s", "first call fla s", "rms Δo", "rms ΔS", "ref shape", "ours ref o", "ours ref S"]
    if any("fla_ref_o_rms" in r for r in rows):
        header += ["fla ref o", "fla ref S"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        ours_t = fmt(r["ours_ms"], 3) if "ours_ms" in r else "error"
        fla_t = fmt(r["fla_ms"], 3) if "fla_ms" in r else ("unavailable" if r["kind"] not in fla_fns else "error")
        ratio = r["fla_ms"] / r["ours_ms"] if "fla_ms" in r and "ours_ms" in r else None
        cells = [r["case"], str(r["B"]), str(r["T"]), str(r["H"]) if r["HV"] == r["H"] else f"{r['H']}/{r['HV']}",
                 str(r["K"]) if r["K"] == r["V"] else f"{r['K']}/{r['V']}", ours_t, fla_t,
                 fmt(ratio, 2, "×") if ratio else "-", fmt(r["bytes"] / 1e9, 3), fmt(r.get("floor_ms"), 3),
                 fmt(r.get("ours_floor_fraction"), 3), fmt(r.get("fla_floor_fraction"), 3),
                 fmt(r.get("ours_first_call_s"), 2), fmt(r.get("fla_first_call_s"), 2),
                 fmt(r.get("o_rms"), 5), fmt(r.get("state_rms"), 5), r.get("ref_shape", "-"),
                 fmt(r.get("ours_ref_o_rms"), 5), fmt(r.get("ours_ref_state_rms"), 5)]
        if "fla ref o" in header:
            cells += [fmt(r.get("fla_ref_o_rms"), 5), fmt(r.get("fla_ref_state_rms"), 5)]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [(r["case"], what, r[f"{what}_error"]) for r in rows for what in ("ours", "fla", "compare", "ref")
              if r.get(f"{what}_error") and not (what == "fla" and r["kind"] not in fla_fns)]
    if errors:
        lines += ["", "Errors:"] + [f"- {case} {what}: {e}" for case, what, e in errors]
    table = "\n".join(lines) + "\n"

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chunk_bench.md").write_text(table)
    (out / "chunk_bench.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str) + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
