"""Prefill benchmark of k3compile-generated `chunk` entries against fla's chunk kernels, every
case under each gate pairing it has, the gate semantics of both sides in every row.

Standalone: needs torch and triton (and fla-core for the comparison), NOT k3compile or xDSL
(except `--smoke`, which compiles its own tiny modules). The cases and their pairings are in
bench/chunk_cases.py: a case is one spec of bench/specs/ (heads are baked into a module), and
each pairing times the variant `<case>_<gate_input>` of it against the fla call that assumes the
same of g (bounded: ours gate_input = "clamped" vs fla safe_gate=True, lower_bound=-5 on gates
clamped at -5; unbounded: ours gate_input = "log" vs fla's default on gates not clamped). The
modules come from `--modules DIR`:

    python3 bench/chunk_cases.py specs bench/generated/specs | while read variant rest; do
        k3c compile bench/generated/specs/$variant.toml -o bench/generated
    done
    python3 bench/chunk_gpu.py --out DIR                  # on the GPU machine, from the repo root
    python bench/chunk_gpu.py --smoke --out /tmp/cb      # CPU smoke test (Triton's interpreter)

(`PHASES=chunk OUT=DIR bash bench/device_run.sh` does both on the device machine.) Each module
`<variant>.py` exposes
    chunk(q, k, v, g=None, beta=None, scale=None, initial_state=None,
          output_final_state=False, cu_seqlens=None) -> (o, final_state)
with fla's layouts: q, k [B,T,H,K]; v [B,T,HV,V]; g [B,T,HV,K] (kda, gla) or [B,T,HV]
(gated_deltanet), natural-log decay; beta [B,T,HV] (None for gla); state [N,HV,K,V] fp32.
A module whose gate_input is not its pairing's is refused (the row says so).

Both sides get the same inputs (q/k L2-normalised outside, post-sigmoid beta, log-space g, an
initial state, the final state out, the same dtypes); ours is checked against an fp32 token
loop (and fla too in --smoke) and a check over its tolerance fails the run (exit 1). The
bandwidth floor of a case is its minimal HBM traffic (inputs read once, o written, initial state
read, final state written) over the copy bandwidth measured in the same run.

Writes DIR/chunk_bench.md (one table per pairing; also printed) and DIR/chunk_bench.json,
rewritten after every row so that a run cut short still leaves the rows it finished.
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
from chunk_cases import (  # noqa: E402
    CASES,
    FLA_CHUNK,
    GATE_INPUT,
    PAIRING_TITLES,
    PAIRINGS,
    fla_gate_options,
    fla_semantics,
    gate_floor,
    names,
    ours_semantics,
    pairings_of,
    read_layer,
    variant_table,
)
from common import (  # noqa: E402
    compare,
    copy_bandwidth,
    device_name as get_device_name,
    fmt,
    git_commit,
    import_file,
    import_fla,
    io_bytes,
    make_inputs,
    recurrence_options,
    reference,
    short_error,
    tensor_bytes,
)

# --smoke: tiny layers (grouped value heads, head dims not powers of two) at T not a multiple of
# the chunk, compiled here; one member with both pairings, one with a single pairing
SMOKE_CASES = {
    "kda_smoke": (dict(name="kda_smoke", kind="kda", num_heads=1, num_v_heads=2, head_k_dim=12, head_v_dim=10), (2, 21)),
    "gdn_smoke": (dict(name="gdn_smoke", kind="gated_deltanet", num_heads=1, head_k_dim=12, head_v_dim=10), (1, 21)),
}
# rms ratios of ours (and fla's) o and final state against the fp32 token loop: fla's bf16
# tolerance, and fp32 rounding over a few hundred tokens
TOLERANCE = {"bf16": 5e-3, "fp32": 1e-5}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Time generated `chunk` entries (prefill shapes) side by side with fla's chunk kernels, per gate pairing.",
    )
    p.add_argument("--out", required=True, help="folder for chunk_bench.md and chunk_bench.json")
    p.add_argument("--modules", default="bench/generated", help="folder of generated <variant>.py (default: bench/generated)")
    p.add_argument("--cases", help=f"comma-separated cases (default: all: {','.join(CASES)})")
    p.add_argument("--pairings", default=",".join(PAIRINGS),
                   help="comma-separated gate pairings (default: bounded,unbounded; a case runs those it has)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU smoke test: compile tiny modules with k3compile into OUT/modules, Triton's interpreter, "
                        "fp32, one timed call")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp32"),
                   help="q, k, v, beta and o (default bf16; fp32 with --smoke: Triton's interpreter computes bf16 "
                        "tl.dot wrongly, triton 3.9 multiplies the raw uint16 bits)")
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms (default 25)")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench rep, ms (default 100)")
    p.add_argument("--copy-mib", type=int, default=None,
                   help="buffer for the copy-bandwidth measurement, MiB (default 2048; 4 with --smoke)")
    p.add_argument("--no-fla", action="store_true", help="do not import or time fla")
    p.add_argument("--no-ref", action="store_true", help="skip the fp32 torch token-loop check")
    p.add_argument("--ref-tokens", type=int, default=300,
                   help="T of the extra B=1 shape checked against the fp32 token loop (ours only; default 300, "
                        "not a multiple of the chunk). With --smoke the main shape is checked instead, ours and fla")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gate-scale", type=float, default=1.0,
                   help="gates drawn as SCALE * logsigmoid(randn) on both sides (default 1; 10: decays steep enough "
                        "that every chunk of an unbounded gate takes the elementwise Gram diagonal blocks)")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("fp32" if args.smoke else "bf16")
    if args.smoke and args.cases:
        p.error("--cases: --smoke runs its own tiny cases")
    try:
        args.pairings = names(args.pairings, PAIRINGS, "--pairings")
        # name -> (layer table, (B, T)): the smoke layers, or the specs of bench/specs/
        args.cases = dict(SMOKE_CASES) if args.smoke else {
            name: (read_layer(name), CASES[name]) for name in names(args.cases or ",".join(CASES), CASES, "--cases")}
    except ValueError as err:
        p.error(str(err))
    if not any(set(pairings_of(layer["kind"])) & set(args.pairings) for layer, _ in args.cases.values()):
        p.error(f"--pairings: none of the cases {', '.join(args.cases)} runs {', '.join(args.pairings)}")
    return args


def compile_smoke_modules(cases, pairings, out: Path) -> Path:
    """The tiny variant modules of --smoke (the only use of k3compile here)."""
    from k3compile.driver import compile as k3_compile
    from k3compile.spec import spec_from_table

    for layer, _ in cases.values():
        for pairing in pairings_of(layer["kind"]):
            if pairing in pairings:
                k3_compile(spec_from_table(variant_table(layer, pairing), source="<chunk_gpu --smoke>"), out_dir=out)
    return out


def fla_call_text(kind, pairing):
    module, name = FLA_CHUNK[kind]
    kwargs = {**base_fla_kwargs(kind), **fla_gate_options(kind, pairing)}
    return (f"{module}.{name}(q, k, v, g" + (", beta" if kind != "gla" else "")
            + ", scale=K**-0.5, initial_state=h0, output_final_state=True"
            + "".join(f", {key}={value}" for key, value in kwargs.items()) + ")")


def base_fla_kwargs(kind):
    """fla's options for pre-normalised q/k, post-sigmoid beta and log-space g: every in-kernel
    norm / gate / sigmoid off (chunk_gla has none)."""
    if kind == "kda":
        return dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False)
    if kind == "gated_deltanet":
        return dict(use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False)
    return {}


def main(argv=None):
    args = parse_args(argv)
    on_cpu = args.smoke
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        os.environ["K3C_POISON_OUTPUTS"] = "1"  # outputs NaN-filled: an element never written fails the check
    cases = args.cases
    copy_mib = args.copy_mib or (4 if on_cpu else 2048)

    import torch
    import triton
    import triton.testing

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --smoke for a CPU smoke test")
    device = torch.device("cpu" if on_cpu else "cuda")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    modules = compile_smoke_modules(cases, args.pairings, Path(args.out) / "modules") if on_cpu else Path(args.modules)

    def sync():
        if not on_cpu:
            torch.cuda.synchronize()

    def bench(fn):
        if on_cpu:  # the interpreter: one call after the first, for a smoke test of the timing path
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

    # ---- copy bandwidth: bytes read + written by a device copy, over its median time ----
    copy_Bps, copy_error = None, None
    try:
        copy_Bps = copy_bandwidth(torch, bench, copy_mib, device)
    except Exception as err:  # noqa: BLE001 - the floor columns stay empty
        copy_error = short_error(err)
        traceback.print_exc()
    print(f"copy bandwidth ({copy_mib} MiB): {fmt(copy_Bps and copy_Bps / 1e12, 3)} TB/s", flush=True)

    # ---- fla, one chunk function per member used ----
    kinds = sorted({layer["kind"] for layer, _ in cases.values()})
    fla_fns, fla_errors, fla_version, fla_notes, fla_import_s = {}, {}, None, set(), 0.0
    for kind in kinds:
        if args.no_fla:
            fla_errors[kind] = "disabled (--no-fla)"
            continue
        start = time.perf_counter()
        try:
            fn, fla_version, note = import_fla(*FLA_CHUNK[kind])
            fla_fns[kind] = fn
            if note:
                fla_notes.add(note)
        except Exception as err:  # noqa: BLE001 - any import failure: still time ours
            fla_errors[kind] = short_error(err)
        fla_import_s += time.perf_counter() - start

    meta = dict(
        device=get_device_name(torch, on_cpu),
        torch=torch.__version__,
        triton=triton.__version__,
        fla=fla_version,
        fla_errors=fla_errors or None,
        fla_import_notes=sorted(fla_notes) or None,
        fla_import_s=None if args.no_fla else fla_import_s,
        fla_backend_packages={p: importlib.util.find_spec(p) is not None for p in ("flash_kda", "flash_qla")},
        fla_calls={f"{kind} {pairing}": fla_call_text(kind, pairing)
                   for kind in kinds for pairing in pairings_of(kind) if pairing in args.pairings},
        python=sys.version.split()[0],
        modules=str(modules),
        git_commit=git_commit(),
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        timing="cpu perf_counter, one call (smoke test)" if on_cpu else
               f"triton.testing.do_bench median, warmup {args.warmup} ms, rep {args.rep} ms",
        copy_mib=copy_mib,
        copy_TBps=copy_Bps and copy_Bps / 1e12,
        copy_error=copy_error,
        dtypes=f"q,k,v,beta {args.dtype} (q,k L2-normalised over K), g fp32 {args.gate_scale:g} * logsigmoid(randn) (bounded pairing: "
               f"clamped at -5), initial_state randn*0.1 fp32, o {args.dtype}, output_final_state=True; "
               "autograd on, no input requires grad",
        bytes_definition=f"q,k,v,g,beta bytes read + o bytes written ({args.dtype}) + 2*B*HV*K*V*4 (fp32 state read + write)",
        tolerance=f"rms ratio vs the fp32 token loop <= {TOLERANCE[args.dtype]:g} (o and final state)",
    )

    rows = []
    for name, (layer, (B, T)) in cases.items():
        kind = layer["kind"]
        for pairing in pairings_of(kind):
            if pairing not in args.pairings:
                continue
            row = run_pairing(args, torch, device, dtype, bench, sync, modules, name, layer, B, T, pairing,
                              fla_fns.get(kind), fla_errors.get(kind), copy_Bps)
            rows.append(row)
            if not on_cpu:
                torch.cuda.empty_cache()
            print("   " + summary(row), flush=True)
            table = write_report(args.out, meta, rows)

    print(table)
    out = Path(args.out)
    print(f"wrote {out / 'chunk_bench.md'} and {out / 'chunk_bench.json'}")
    return 1 if any(r.get("ours_error") or r["failed"] for r in rows) else 0


def import_variant(path: Path, pairing: str):
    """The generated module at `path`, refused unless it was compiled with the pairing's gate_input."""
    module = import_file(path, path.stem)
    compiled = recurrence_options(module)["gate_input"]
    if compiled != GATE_INPUT[pairing]:
        raise ValueError(f"{path}: compiled with gate_input {compiled}, the {pairing} pairing times {GATE_INPUT[pairing]}")
    return module


def run_pairing(args, torch, device, dtype, bench, sync, modules, name, layer, B, T, pairing, fla_fn, fla_error, copy_Bps):
    """One row: case `name` under `pairing`, ours and fla timed on the same inputs and checked."""
    kind = layer["kind"]
    H, K, V = layer["num_heads"], layer["head_k_dim"], layer["head_v_dim"]
    HV = layer.get("num_v_heads", H)
    gate, beta = ("scalar" if kind == "gated_deltanet" else "channel"), kind != "gla"
    scale = K**-0.5
    variant = variant_table(layer, pairing)["name"]
    row = dict(case=name, pairing=pairing, variant=variant, kind=kind, B=B, T=T, H=H, HV=HV, K=K, V=V,
               ours_gate=ours_semantics(pairing), fla_gate=fla_semantics(kind, pairing), failed=[])
    print(f"== {name} [{pairing}]: {kind} B={B} T={T} H={H} HV={HV} K={K} V={V}; ours {row['ours_gate']}, "
          f"fla {row['fla_gate']}", flush=True)

    module_path = modules / f"{variant}.py"
    row["module"] = str(module_path)
    ours = None
    try:
        row["module_sha256"] = hashlib.sha256(module_path.read_bytes()).hexdigest()
        ours = import_variant(module_path, pairing).chunk
    except Exception as err:  # noqa: BLE001 - no module: still time fla
        row["ours_error"] = short_error(err)
        traceback.print_exc()
    fla_kwargs = {**base_fla_kwargs(kind), **fla_gate_options(kind, pairing)}

    def call_ours(inp):
        return ours(inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"], scale=scale,
                    initial_state=inp["initial_state"], output_final_state=True)

    def call_fla(inp):
        positional = [inp["q"], inp["k"], inp["v"], inp["g"]] + ([inp["beta"]] if beta else [])
        return fla_fn(*positional, scale=scale, initial_state=inp["initial_state"], output_final_state=True, **fla_kwargs)

    def draw(batch, tokens, seed):
        return make_inputs(torch, batch, tokens, H, HV, K, V, device, seed, gate=gate, beta=beta, dtype=dtype,
                           gate_floor=gate_floor(pairing), gate_scale=args.gate_scale)

    inp = draw(B, T, args.seed + hash_case(name))
    row["bytes"] = io_bytes(inp, B, T, HV, V, out_elem=inp["v"].element_size())
    row["bytes_inputs"] = tensor_bytes(inp)
    row["floor_ms"] = row["bytes"] / copy_Bps * 1e3 if copy_Bps else None
    results = {}
    for who, fn in (("ours", call_ours if ours else None), ("fla", call_fla if fla_fn else None)):
        if fn is None:
            if who == "fla":
                row["fla_unavailable"] = fla_error
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

    # fp32 token loop: on the main shape with --smoke (ours and fla), else on an extra B=1 shape (ours only)
    if not args.no_ref:
        try:
            if args.smoke:
                ref_inp, ref_results = inp, results
            else:
                ref_inp = draw(1, args.ref_tokens, args.seed + 7 + hash_case(name))
                ref_results = {"ours": call_ours(ref_inp)} if ours else {}
            row["ref_shape"] = f"B{ref_inp['q'].shape[0]} T{ref_inp['q'].shape[1]}"
            o_ref, s_ref = reference(torch, ref_inp, scale)
            tolerance = TOLERANCE[args.dtype]
            for who, (o, s) in ref_results.items():
                for what, got, want in (("o", o, o_ref), ("state", s, s_ref)):
                    row[f"{who}_ref_{what}_rms"] = rms = compare(torch, got, want)[1]
                    if not rms <= tolerance:  # NaN fails too
                        row["failed"].append(f"{who} {what} vs fp32 loop: rms {rms:.2e} > {tolerance:g}")
        except Exception as err:  # noqa: BLE001
            row["ref_error"] = short_error(err)
            row["failed"].append(f"reference check: {row['ref_error']}")
            traceback.print_exc()
    return row


def hash_case(name):
    """A seed offset per case that does not depend on PYTHONHASHSEED (the same for both pairings)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:6], 16)


def summary(r):
    parts = [f"ours {fmt(r.get('ours_ms'), 3)} ms", f"fla {fmt(r.get('fla_ms'), 3)} ms",
             f"floor {fmt(r.get('floor_ms'), 3)} ms", f"rms o {fmt(r.get('o_rms'), 5)}", f"rms S {fmt(r.get('state_rms'), 5)}",
             "check " + ("FAILED: " + "; ".join(r["failed"]) if r["failed"] else "ok")]
    parts += [f"{who} error: {r[who + '_error']}" for who in ("ours", "fla") if r.get(who + "_error")]
    return "; ".join(parts)


HEADER = ["case", "B", "T", "H", "K=V", "ours", "fla", "ours ms", "fla ms", "fla/ours", "IO GB", "floor ms", "floor/ours",
          "floor/fla", "first call ours s", "first call fla s", "rms Δo", "rms ΔS", "ref shape", "ours ref o", "ours ref S"]


def table_row(r):
    ratio = r["fla_ms"] / r["ours_ms"] if "fla_ms" in r and "ours_ms" in r else None
    cells = [r["case"], str(r["B"]), str(r["T"]), str(r["H"]) if r["HV"] == r["H"] else f"{r['H']}/{r['HV']}",
             str(r["K"]) if r["K"] == r["V"] else f"{r['K']}/{r['V']}", r["ours_gate"], r["fla_gate"],
             fmt(r["ours_ms"], 3) if "ours_ms" in r else "error",
             fmt(r["fla_ms"], 3) if "fla_ms" in r else ("unavailable" if r.get("fla_unavailable") else "error"),
             fmt(ratio, 2, "×") if ratio else "-", fmt(r["bytes"] / 1e9, 3), fmt(r.get("floor_ms"), 3),
             fmt(r.get("ours_floor_fraction"), 3), fmt(r.get("fla_floor_fraction"), 3),
             fmt(r.get("ours_first_call_s"), 2), fmt(r.get("fla_first_call_s"), 2),
             fmt(r.get("o_rms"), 5), fmt(r.get("state_rms"), 5), r.get("ref_shape", "-"),
             fmt(r.get("ours_ref_o_rms"), 5), fmt(r.get("ours_ref_state_rms"), 5)]
    return cells


def write_report(out_dir, meta, rows):
    """Markdown (a table per pairing) + JSON of the rows so far; returns the markdown."""
    lines = [
        "# chunk (prefill): k3compile-generated `chunk` vs fla's chunk kernels, per gate pairing",
        "",
        f"device {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, fla-core {meta['fla'] or 'unavailable'}; "
        f"commit {meta['git_commit'] or 'unknown'}",
        f"Command: `{meta['command']}`",
        f"{meta['dtypes']}.",
        f"Timing: {meta['timing']}. first call: wall time of the first call at the shape (ours: Triton compile; fla: "
        "compile + autotune).",
        f"floor: minimal IO ({meta['bytes_definition']}) over the copy bandwidth measured in this run, "
        f"{fmt(meta['copy_TBps'], 3)} TB/s ({meta['copy_mib']} MiB buffer, read + write); floor/x = fraction of the floor reached.",
        "rms Δ: ‖ours − fla‖/‖fla‖ on the case's shape. ref: ‖x − ref‖/‖ref‖ against an fp32 torch token loop on the ref "
        f"shape; check: {meta['tolerance']}.",
    ]
    for what, call in meta["fla_calls"].items():
        lines.append(f"fla {what}: `{call}`")
    lines += [f"fla: {note}" for note in meta["fla_import_notes"] or []]
    lines += [f"fla {kind}: unavailable ({error})" for kind, error in (meta["fla_errors"] or {}).items()]
    if meta["copy_error"]:
        lines.append(f"copy bandwidth: failed ({meta['copy_error']})")
    with_fla_ref = any("fla_ref_o_rms" in r for r in rows)
    header = HEADER + (["fla ref o", "fla ref S"] if with_fla_ref else []) + ["check"]
    for pairing in PAIRINGS:
        chosen = [r for r in rows if r["pairing"] == pairing]
        if not chosen:
            continue
        lines += ["", f"## {pairing}: {PAIRING_TITLES[pairing]}", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in chosen:
            cells = table_row(r)
            if with_fla_ref:
                cells += [fmt(r.get("fla_ref_o_rms"), 5), fmt(r.get("fla_ref_state_rms"), 5)]
            cells.append("FAILED: " + "; ".join(r["failed"]) if r["failed"] else "ok")
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    errors = [(r["case"], r["pairing"], what, r[f"{what}_error"]) for r in rows for what in ("ours", "fla", "compare", "ref")
              if r.get(f"{what}_error")]
    if errors:
        lines += ["", "Errors:"] + [f"- {case} [{pairing}] {what}: {e}" for case, pairing, what, e in errors]
    table = "\n".join(lines) + "\n"

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chunk_bench.md").write_text(table)
    (out / "chunk_bench.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str) + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
