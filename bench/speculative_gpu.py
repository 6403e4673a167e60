"""Serving benchmark of k3compile's decode and speculative-decoding entries against fla's
fused_recurrent_kda, side by side in one process (issue 4).

Standalone: needs torch and triton (and fla-core for the comparison), NOT k3compile or xDSL
(except `--smoke`, which compiles its own tiny modules). It imports modules that k3compile
already generated from bench/kda_bench.toml (H = 32, K = V = 128):

    k3c compile bench/kda_bench.toml -o bench/generated/speculative \\
        -p 'lower-decode,derive-replay{draft-tokens=16},lower-speculative'
    k3c compile bench/kda_bench.toml -o bench/generated/snapshot \\
        -p 'derive-replay{draft-tokens=16},lower-speculative{mode=snapshot}'
    k3c compile bench/kda_bench.toml -o bench/generated/chunked \\
        -p 'derive-replay{draft-tokens=16},lower-speculative{verify=chunked}'
    python3 bench/speculative_gpu.py --out DIR        # on the GPU machine, from the repo root
    python bench/speculative_gpu.py --smoke --out /tmp/sb    # CPU smoke test (Triton's interpreter)

(`PHASES=spec OUT=DIR bash bench/device_run.sh` does all of them on the device machine; without the
chunked module the two chunked methods are reported as not compiled.)

(a) decode, T = 1, over an fp32 state pool with a permuted slot table: ours `decode` (in place)
    vs fla's fused_recurrent_kda (initial_state -> final_state) and fla's in-place pool path
    (fused_recurrent_kda_fwd with ssm_state_indices, vLLM's decode), by do_bench and
    do_bench_cudagraph; state traffic (2 B HV K V 4 bytes) over the time, next to the copy
    bandwidth measured in the same run.
(b) one round of speculative decoding with n tokens (bonus + drafts), the accepted counts of
    the previous round committed (`--accept all`: n, the replay's worst case):
    - replay:    verify + commit (two launches, no snapshots);
    - spec_step: the fused launch (commit of the previous round, then verify);
    - snapshot:  verify writing a state per token + commit copying one (mode=snapshot);
    - chunked:   verify=chunked (the round as one chunk of the chunkwise schedule: a prepare and a
                 scan kernel, issue 4's sub-linear target) + the same commit;
    - chunked_step: spec_step with the chunked verify half (prepare, then replay + one chunk);
    - fla:       fused_recurrent_kda over the n tokens (initial -> final state: no rollback);
    - fla-spec:  fused_recurrent_kda_fwd in vLLM's spec-decoding mode (reads the state of the
                 accepted token, writes one state per token to the slot table [B, n]).
    Bytes moved per round are computed from the shapes (see BYTES below).

Every method is checked against the others (and an fp32 torch token loop) on the same inputs
before it is timed; first calls (Triton compilation) happen there, outside the timings.
Writes DIR/speculative_bench.md (also printed) and DIR/speculative_bench.json.
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
    argument_shapes,
    compare,
    copy_bandwidth,
    cpu_time_ms,
    device_name as get_device_name,
    fmt,
    git_commit,
    import_file,
    import_fla,
    ints,
    make_inputs,
    reference,
    short_error,
    tensor_bytes,
)

METHODS = ("replay", "spec_step", "chunked", "chunked_step", "snapshot", "fla", "fla_spec")
OURS = ("replay", "spec_step", "chunked", "chunked_step")
LAUNCHES = dict(replay=2, spec_step=1, chunked=3, chunked_step=2, snapshot=2, fla=1, fla_spec=1)
# per sequence and round: S the fp32 state of all value heads, c one token's cache (k, log-decay, u),
# n tokens verified, m accepted (committed by the round); inputs and outputs come on top
BYTES = dict(
    replay="3 S + (n + m) c: verify reads S, writes n c; commit reads S and m c, writes S",
    spec_step="2 S + (n + m) c: reads S and the previous round's m c, writes S and n c",
    chunked="3 S + (n + m) c + 2 n w: replay's, plus the prepare's workspaces (w = HV (2K + V + C) 4 bytes "
            "per token of W, QG, U, P in fp32) written once and read once",
    chunked_step="2 S + (n + m) c + 2 n w: spec_step's, plus the workspaces",
    snapshot="(3 + n) S + S [m > 0]: verify reads S, writes n S; commit reads S and the snapshot, writes S",
    fla="2 S: reads the initial state, writes the final one (no rollback possible)",
    fla_spec="(1 + n) S: reads the accepted token's state, writes one state per token",
)
TOLERANCES = dict(o=5e-3, state=1e-5, fla_state=1e-4)  # rms ratios: bf16 outputs, fp32 states
SMOKE = dict(num_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, depth=2)
PIPELINES = dict(speculative="lower-decode,derive-replay{{draft-tokens={depth}}},lower-speculative",
                 snapshot="derive-replay{{draft-tokens={depth}}},lower-speculative{{mode=snapshot}}",
                 chunked="derive-replay{{draft-tokens={depth}}},lower-speculative{{verify=chunked}}")
CHUNK = 16  # the chunked verify's chunk at depth 16 (n rounded up to 16, 32 or 64)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Time k3compile's decode and speculative entries against fla's "
                                            "fused_recurrent_kda (issue 4).")
    p.add_argument("--out", required=True, help="folder for speculative_bench.md and speculative_bench.json")
    p.add_argument("--modules", default="bench/generated",
                   help="folder with speculative/, snapshot/ and (optional) chunked/<module>.py (default: bench/generated)")
    p.add_argument("--module", default="kda_bench", help="module name (default: kda_bench)")
    p.add_argument("--batches", default="1,64,256", help="comma-separated B (default 1,64,256)")
    p.add_argument("--drafts", default="1,2,4,8,16", help="comma-separated n, tokens per round (default 1,2,4,8,16)")
    p.add_argument("--accept", default="all", choices=("all", "random"),
                   help="accepted counts committed per round: all n (default) or random in 1..n")
    p.add_argument("--smoke", action="store_true",
                   help="CPU smoke test: compile tiny modules with k3compile into OUT/modules, B and n in (1, 2), "
                        "Triton's interpreter, one timing rep")
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms (default 25)")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench rep, ms (default 100)")
    p.add_argument("--copy-mib", type=int, default=512, help="copy-bandwidth buffer, MiB (default 512: the B=256 pool)")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timings (do_bench_cudagraph)")
    p.add_argument("--no-fla", action="store_true", help="do not import or time fla")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def compile_smoke_modules(out: Path) -> Path:
    """The tiny modules of --smoke (the only use of k3compile here)."""
    from k3compile.driver import compile as k3_compile
    from k3compile.spec import spec_from_table

    spec = spec_from_table(dict(name="kda_bench", kind="kda", dtype="bfloat16",
                                **{k: v for k, v in SMOKE.items() if k != "depth"}))
    for mode, pipeline in PIPELINES.items():
        k3_compile(spec, out_dir=out / mode, pipeline=pipeline.format(depth=SMOKE["depth"]))
    return out


def main(argv=None):
    args = parse_args(argv)
    on_cpu = args.smoke
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch
    import triton
    import triton.testing

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --smoke for a CPU smoke test")
    device = torch.device("cpu" if on_cpu else "cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modules = compile_smoke_modules(out / "modules") if args.smoke else Path(args.modules)
    batches, drafts = ([1, 2], [1, 2]) if args.smoke else (ints(args.batches), ints(args.drafts))

    paths = {mode: modules / mode / f"{args.module}.py" for mode in PIPELINES}
    ours = import_file(paths["speculative"], f"{args.module}_speculative")
    snap = import_file(paths["snapshot"], f"{args.module}_snapshot")
    chunked, chunked_error = None, None
    if paths["chunked"].exists():
        chunked = import_file(paths["chunked"], f"{args.module}_chunked")
        if int(argument_shapes(chunked.verify)["cache"][1]) < max(drafts):
            chunked, chunked_error = None, "chunked module's cache depth below n"
    else:
        chunked_error = f"not compiled ({paths['chunked']} missing)"
    shapes = argument_shapes(ours.spec_step)
    H, K = int(shapes["q"][2]), int(shapes["q"][3])
    HV, V = int(shapes["v"][2]), int(shapes["v"][3])
    depth = int(shapes["cache"][1])
    snapshot_depth = int(argument_shapes(snap.verify)["snapshots"][1])
    if max(drafts) > min(depth, snapshot_depth):
        sys.exit(f"n = {max(drafts)} tokens exceeds the modules' cache depth {depth} / snapshot depth {snapshot_depth}")
    scale = K**-0.5

    fla_fn = fla_fwd = fla_version = fla_note = None
    fla_error = "disabled (--no-fla)" if args.no_fla else None
    if not args.no_fla:
        try:
            fla_fn, fla_version, fla_note = import_fla("fla.ops.kda", "fused_recurrent_kda")
            fla_fwd = import_fla("fla.ops.kda.fused_recurrent", "fused_recurrent_kda_fwd")[0]
        except Exception as err:  # noqa: BLE001 - no fla: still time ours
            fla_fn, fla_fwd, fla_error = None, None, short_error(err)
    FLA_FLAGS = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False)

    def sync():
        if not on_cpu:
            torch.cuda.synchronize()

    def bench(fn):
        if on_cpu:
            return cpu_time_ms(fn, reps=1)
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

    def bench_graph(fn):
        if on_cpu or args.no_graph:
            return None
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=args.rep, return_mode="median")
        except Exception as err:  # noqa: BLE001
            return "graph failed: " + short_error(err)[:60]

    def time_methods(row, methods):
        """Median ms (and graph ms) of every method that passed its first call."""
        for name, fn in methods.items():
            if fn is None or row.get(f"{name}_error"):
                continue
            try:
                row[f"{name}_ms"] = bench(fn)
                row[f"{name}_graph_ms"] = bench_graph(fn)
            except Exception as err:  # noqa: BLE001 - record it, keep going
                row[f"{name}_error"] = short_error(err)
                traceback.print_exc()

    def first_call(row, name, fn):
        """Run fn once (compiling it) and return its result, or record the error."""
        try:
            result = fn()
            sync()
            return result
        except Exception as err:  # noqa: BLE001
            row[f"{name}_error"] = short_error(err)
            traceback.print_exc()
            return None

    def check(row, name, got, want, tol):
        if got is None or want is None:
            return
        row.setdefault("checks", {})[name] = rms = compare(torch, got, want)[1]
        if not rms <= tol:
            row.setdefault("failed", []).append(f"{name}: rms {rms:.2e} > {tol:.0e}")

    gen = torch.Generator().manual_seed(args.seed)

    def pool_of(initial):
        """A pool of B rows holding the B initial states under a permuted slot table."""
        slots = torch.randperm(initial.shape[0], generator=gen).to(device)
        pool = torch.empty_like(initial)
        pool[slots] = initial
        return pool, slots

    # ---- copy bandwidth: bytes read + written by a device copy, over its median time ----
    copy_Bps, copy_error = None, None
    try:
        copy_Bps = copy_bandwidth(torch, bench, 1 if on_cpu else args.copy_mib, device)
    except Exception as err:  # noqa: BLE001
        copy_error = short_error(err)
    print(f"copy bandwidth: {fmt(copy_Bps and copy_Bps / 1e12, 3)} TB/s", flush=True)

    # ---- (a) decode, T = 1 ----
    decode_rows = []
    for B in batches:
        row = dict(B=B)
        inp = make_inputs(torch, B, 1, H, HV, K, V, device, args.seed + B)
        tok = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        h0 = inp["initial_state"]
        pool, slots = pool_of(h0)
        row["state_bytes"] = 2 * B * HV * K * V * 4
        row["bytes"] = row["state_bytes"] + sum(tensor_bytes(inp).values()) + B * HV * V * 2
        first = pool.clone()
        (o,) = first_call(row, "ours", lambda: ours.decode(**tok, scale=scale, state=first, state_indices=slots, check_indices=False)) or (None,)
        o_ref, s_ref = reference(torch, inp, scale)
        check(row, "ours o vs fp32 loop", o, o_ref, TOLERANCES["o"])
        check(row, "ours state vs fp32 loop", first[slots], s_ref, TOLERANCES["state"])
        methods = {"ours": lambda: ours.decode(**tok, scale=scale, state=pool, state_indices=slots, check_indices=False)}
        if fla_fn is not None:
            result = first_call(row, "fla", lambda: fla_fn(**tok, scale=scale, initial_state=h0,
                                                             output_final_state=True, **FLA_FLAGS))
            if result is not None:
                check(row, "fla o vs ours", result[0], o, TOLERANCES["o"])
                check(row, "fla state vs ours", result[1], first[slots], TOLERANCES["fla_state"])
            fla_pool = pool.clone()
            result = first_call(row, "fla_pool", lambda: fla_fwd(**tok, scale=scale, initial_state=fla_pool,
                                                                  inplace_final_state=True, ssm_state_indices=slots,
                                                                  **FLA_FLAGS))
            if result is not None:
                check(row, "fla-pool o vs ours", result[0], o, TOLERANCES["o"])
                check(row, "fla-pool state vs ours", fla_pool, first, TOLERANCES["fla_state"])
            methods["fla"] = lambda: fla_fn(**tok, scale=scale, initial_state=h0, output_final_state=True, **FLA_FLAGS)
            methods["fla_pool"] = lambda: fla_fwd(**tok, scale=scale, initial_state=pool, inplace_final_state=True,
                                                  ssm_state_indices=slots, **FLA_FLAGS)
        time_methods(row, methods)
        for name in methods:
            for kind in ("", "graph_"):
                ms = row.get(f"{name}_{kind}ms")
                if isinstance(ms, float):
                    row[f"{name}_{kind}state_TBps"] = row["state_bytes"] / (ms * 1e-3) / 1e12
        decode_rows.append(row)
        print(f"decode B={B}: " + ", ".join(f"{n} {fmt(row.get(f'{n}_ms'), 4)} ms" for n in methods), flush=True)
        del inp, tok, h0, pool, first, o_ref, s_ref
        if not on_cpu:
            torch.cuda.empty_cache()

    # ---- (b) one speculative round of n tokens ----
    spec_rows = []
    for B in batches:
        for n in drafts:
            row = dict(B=B, n=n)
            inp = make_inputs(torch, B, n, H, HV, K, V, device, args.seed + 1000 * B + n)
            tok = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
            h0 = inp["initial_state"]
            pool0, slots = pool_of(h0)
            counts = [n] * B if args.accept == "all" else torch.randint(1, n + 1, (B,), generator=gen).tolist()
            accepted = torch.tensor(counts, device=device)
            zeros = torch.zeros_like(accepted)
            m = sum(counts) / B
            S, c = HV * K * V * 4, HV * (2 * K + V) * 4
            io = sum(tensor_bytes(inp).values()) + B * n * HV * V * 2
            row["m"] = m
            w = HV * (2 * K + V + CHUNK) * 4
            row["bytes"] = dict(replay=B * (3 * S + (n + m) * c) + io, spec_step=B * (2 * S + (n + m) * c) + io,
                                chunked=B * (3 * S + (n + m) * c + 2 * n * w) + io,
                                chunked_step=B * (2 * S + (n + m) * c + 2 * n * w) + io,
                                snapshot=B * ((3 + n) * S + S) + io, fla=B * 2 * S + io, fla_spec=B * (1 + n) * S + io)

            # correctness: every method from the same pool, against ours replay and the fp32 loop
            pool_r, cache_r = pool0.clone(), torch.zeros(B, depth, HV, 2 * K + V, device=device)
            (o_r,) = first_call(row, "replay", lambda: ours.verify(**tok, scale=scale, state=pool_r,
                                                                   state_indices=slots, check_indices=False, cache=cache_r)) or (None,)
            first_call(row, "replay", lambda: ours.commit(state=pool_r, state_indices=slots, check_indices=False, cache=cache_r,
                                                          accepted=accepted))
            cache_r0 = cache_r[slots, :n].clone()  # the token verify's cache, for the chunked one
            o_ref, s_ref = reference(torch, inp, scale)
            check(row, "replay o vs fp32 loop", o_r, o_ref, TOLERANCES["o"])
            if args.accept == "all":
                check(row, "replay state vs fp32 loop", pool_r[slots], s_ref, TOLERANCES["state"])
            pool_s = pool0.clone()
            snaps = torch.empty(B, snapshot_depth, HV, K, V, device=device)
            (o_s,) = first_call(row, "snapshot", lambda: snap.verify(**tok, scale=scale, state=pool_s,
                                                                     state_indices=slots, check_indices=False, snapshots=snaps)) or (None,)
            first_call(row, "snapshot", lambda: snap.commit(state=pool_s, state_indices=slots, check_indices=False, snapshots=snaps,
                                                            accepted=accepted))
            check(row, "snapshot o vs replay", o_s, o_r, TOLERANCES["o"])
            check(row, "snapshot state vs replay", pool_s, pool_r, TOLERANCES["state"])
            # spec_step twice on the same tokens: the first (nothing to commit) verifies like
            # verify; the second commits them (like commit) and verifies again from there
            pool_f, caches = pool0.clone(), torch.zeros(2, B, depth, HV, 2 * K + V, device=device)
            step = lambda cache, count, next_cache: ours.spec_step(  # noqa: E731
                **tok, scale=scale, state=pool_f, state_indices=slots, check_indices=False, cache=cache, accepted=count,
                next_cache=next_cache)
            (o_f,) = first_call(row, "spec_step", lambda: step(caches[0], zeros, caches[1])) or (None,)
            (o_f2,) = first_call(row, "spec_step", lambda: step(caches[1], accepted, caches[0])) or (None,)
            check(row, "spec_step o vs replay", o_f, o_r, TOLERANCES["o"])
            check(row, "spec_step state vs replay", pool_f, pool_r, TOLERANCES["state"])
            if o_r is not None:
                (o_again,) = ours.verify(**tok, scale=scale, state=pool_r, state_indices=slots, check_indices=False, cache=cache_r)
                check(row, "spec_step round 2 o vs verify", o_f2, o_again, TOLERANCES["o"])
            # the chunked verify (one chunk of the chunkwise schedule) and spec_step built on it
            pool_c, cache_c = pool0.clone(), torch.zeros(B, depth, HV, 2 * K + V, device=device)
            pool_cf, caches_c = pool0.clone(), torch.zeros(2, B, depth, HV, 2 * K + V, device=device)
            if chunked is None:
                row["chunked_error"] = row["chunked_step_error"] = chunked_error
            else:
                (o_c,) = first_call(row, "chunked", lambda: chunked.verify(
                    **tok, scale=scale, state=pool_c, state_indices=slots, check_indices=False, cache=cache_c)) or (None,)
                first_call(row, "chunked", lambda: chunked.commit(state=pool_c, state_indices=slots, check_indices=False, cache=cache_c,
                                                                  accepted=accepted))
                check(row, "chunked o vs replay", o_c, o_r, TOLERANCES["o"])
                check(row, "chunked cache vs replay", cache_c[slots, :n], cache_r0, TOLERANCES["state"])
                check(row, "chunked state vs replay", pool_c, pool_r, TOLERANCES["state"])
                chunked_step = lambda cache, count, next_cache: chunked.spec_step(  # noqa: E731
                    **tok, scale=scale, state=pool_cf, state_indices=slots, check_indices=False, cache=cache, accepted=count,
                    next_cache=next_cache)
                (o_cf,) = first_call(row, "chunked_step", lambda: chunked_step(caches_c[0], zeros, caches_c[1])) or (None,)
                (o_cf2,) = first_call(row, "chunked_step",
                                      lambda: chunked_step(caches_c[1], accepted, caches_c[0])) or (None,)
                check(row, "chunked_step o vs replay", o_cf, o_r, TOLERANCES["o"])
                check(row, "chunked_step state vs replay", pool_cf, pool_r, TOLERANCES["state"])
                check(row, "chunked_step round 2 o vs spec_step", o_cf2, o_f2, TOLERANCES["o"])
            methods = {
                "replay": lambda: (ours.verify(**tok, scale=scale, state=pool_r, state_indices=slots, check_indices=False, cache=cache_r),
                                   ours.commit(state=pool_r, state_indices=slots, check_indices=False, cache=cache_r, accepted=accepted)),
                "spec_step": lambda: step(caches[0], accepted, caches[1]),
                "chunked": None if chunked is None else lambda: (
                    chunked.verify(**tok, scale=scale, state=pool_c, state_indices=slots, check_indices=False, cache=cache_c),
                    chunked.commit(state=pool_c, state_indices=slots, check_indices=False, cache=cache_c, accepted=accepted)),
                "chunked_step": None if chunked is None else lambda: chunked_step(caches_c[0], accepted, caches_c[1]),
                "snapshot": lambda: (snap.verify(**tok, scale=scale, state=pool_s, state_indices=slots, check_indices=False, snapshots=snaps),
                                     snap.commit(state=pool_s, state_indices=slots, check_indices=False, snapshots=snaps, accepted=accepted)),
            }
            if fla_fn is not None:
                result = first_call(row, "fla", lambda: fla_fn(**tok, scale=scale, initial_state=h0,
                                                                 output_final_state=True, **FLA_FLAGS))
                if result is not None:
                    check(row, "fla o vs replay", result[0], o_r, TOLERANCES["o"])
                    check(row, "fla final state vs fp32 loop", result[1], s_ref, TOLERANCES["fla_state"])
                # vLLM's layout: n state slots per sequence, all holding its committed state, so
                # that any previous accepted count reads it; token t's state goes to slot b n + t
                fla_pool = h0.repeat_interleave(n, dim=0).contiguous()
                table = torch.arange(B * n, device=device, dtype=torch.int32).view(B, n)
                accepted32 = accepted.to(torch.int32)
                result = first_call(row, "fla_spec", lambda: fla_fwd(
                    **tok, scale=scale, initial_state=fla_pool, inplace_final_state=True, ssm_state_indices=table,
                    num_accepted_tokens=accepted32, **FLA_FLAGS))
                if result is not None:
                    check(row, "fla-spec o vs replay", result[0], o_r, TOLERANCES["o"])
                    kept = table[torch.arange(B, device=device), accepted.long() - 1].long()
                    check(row, "fla-spec accepted state vs replay", fla_pool[kept], pool_r[slots],
                          TOLERANCES["fla_state"])
                methods["fla"] = lambda: fla_fn(**tok, scale=scale, initial_state=h0, output_final_state=True,
                                                **FLA_FLAGS)
                methods["fla_spec"] = lambda: fla_fwd(**tok, scale=scale, initial_state=fla_pool,
                                                      inplace_final_state=True, ssm_state_indices=table,
                                                      num_accepted_tokens=accepted32, **FLA_FLAGS)
            time_methods(row, methods)
            spec_rows.append(row)
            print(f"spec B={B} n={n}: " + ", ".join(f"{k} {fmt(row.get(f'{k}_ms'), 4)} ms" for k in methods)
                  + ("; CHECKS FAILED" if row.get("failed") else ""), flush=True)
            del inp, tok, h0, pool0, pool_r, pool_s, pool_f, cache_r, caches, snaps, o_ref, s_ref
            del pool_c, cache_c, pool_cf, caches_c, cache_r0
            if fla_fn is not None:
                del fla_pool
            if not on_cpu:
                torch.cuda.empty_cache()

    meta = dict(
        device=get_device_name(torch, on_cpu), torch=torch.__version__, triton=triton.__version__,
        fla=fla_version, fla_error=fla_error, fla_import_note=fla_note, python=sys.version.split()[0],
        git_commit=git_commit(), modules={mode: str(path) for mode, path in paths.items() if path.exists()},
        module_sha256={mode: hashlib.sha256(path.read_bytes()).hexdigest() for mode, path in paths.items()
                       if path.exists()},
        H=H, HV=HV, K=K, V=V, cache_depth=depth, accept=args.accept,
        timing="cpu perf_counter, one rep (smoke test)" if on_cpu else
        f"triton.testing.do_bench median, warmup {args.warmup} ms, rep {args.rep} ms",
        graph_timing=None if (on_cpu or args.no_graph) else f"triton.testing.do_bench_cudagraph median, rep {args.rep} ms (no L2 flush)",
        dtypes="q, k, v, beta bf16 (q, k L2-normalised), g fp32 logsigmoid clamped at -5, state pool fp32",
        copy_TBps=copy_Bps and copy_Bps / 1e12, copy_error=copy_error, bytes=BYTES, tolerances=TOLERANCES,
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    table = report(meta, decode_rows, spec_rows)
    print(table)
    (out / "speculative_bench.md").write_text(table)
    (out / "speculative_bench.json").write_text(
        json.dumps(dict(meta=meta, decode=decode_rows, spec=spec_rows), indent=1, default=str) + "\n")
    print(f"wrote {out / 'speculative_bench.md'} and {out / 'speculative_bench.json'}")
    failed = [r for r in decode_rows + spec_rows if r.get("failed") or r.get("ours_error") or r.get("replay_error")
              or r.get("spec_step_error") or r.get("snapshot_error")
              or (chunked is not None and (r.get("chunked_error") or r.get("chunked_step_error")))]
    return 1 if failed else 0


def us(ms):
    return ms * 1e3 if isinstance(ms, float) else ms


def report(meta, decode_rows, spec_rows) -> str:
    graphs = meta["graph_timing"] is not None
    lines = [
        "# Decode and speculative decoding: k3compile vs fla fused_recurrent_kda",
        "",
        f"device {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, "
        f"fla-core {meta['fla'] or 'unavailable'}; commit {meta['git_commit']}",
        f"H={meta['H']}, HV={meta['HV']}, K={meta['K']}, V={meta['V']}; {meta['dtypes']}.",
        f"Timing: {meta['timing']}." + (f" Graph columns: {meta['graph_timing']}." if graphs else ""),
        f"Copy bandwidth in this run: {fmt(meta['copy_TBps'], 3)} TB/s (read + write).",
    ]
    if meta["fla_error"]:
        lines.append(f"fla: unavailable ({meta['fla_error']})")
    if meta["fla_import_note"]:
        lines.append(f"fla: {meta['fla_import_note']}")

    lines += ["", "## (a) decode, T = 1", "",
              "state TB/s: 2 B HV K V 4 bytes (the pool rows read and written) over the time; copy = the "
              "fraction of the copy bandwidth. fla-pool: fused_recurrent_kda_fwd in place over the slot table.", ""]
    names = ("ours", "fla", "fla_pool")
    header = ["B"] + [f"{n} µs" for n in names] + (["ours graph µs", "fla graph µs", "fla-pool graph µs"] if graphs else [])
    header += ["ours state TB/s", "ours copy", "fla state TB/s", "checks"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in decode_rows:
        cells = [str(r["B"])] + [fmt(us(r.get(f"{n}_ms")), 1) if f"{n}_ms" in r else r.get(f"{n}_error", "-")
                                 for n in names]
        if graphs:
            cells += [fmt(us(r.get(f"{n}_graph_ms")), 1) for n in names]
        tbps = r.get("ours_state_TBps")
        cells += [fmt(tbps, 2), fmt(tbps / meta["copy_TBps"] * 100, 0, "%") if tbps and meta["copy_TBps"] else "-",
                  fmt(r.get("fla_state_TBps"), 2), "FAILED" if r.get("failed") else "ok"]
        lines.append("| " + " | ".join(cells) + " |")

    lines += ["", f"## (b) one speculative round: n tokens verified, the previous round's accepted "
                  f"({meta['accept']}) committed", "",
              "µs per round (launches: " + ", ".join(f"{k} {v}" for k, v in LAUNCHES.items()) + "). "
              "/snap: time over the snapshot baseline's; ×n=1: time over the same method's at n = 1.", ""]
    header = ["B", "n"] + [f"{n} µs" for n in METHODS]
    if graphs:
        header += [f"{n} graph µs" for n in METHODS]
    header += ["replay /snap", "spec_step /snap"] + [f"{n} ×n=1" for n in (*OURS, "snapshot")] + ["checks"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    at_n1 = {(r["B"], name): r.get(f"{name}_ms") for r in spec_rows if r["n"] == 1 for name in METHODS}

    def ratio(a, b):
        return fmt(a / b, 2, "×") if isinstance(a, float) and isinstance(b, float) else "-"

    for r in spec_rows:
        cells = [str(r["B"]), str(r["n"])]
        cells += [fmt(us(r.get(f"{n}_ms")), 1) if f"{n}_ms" in r else r.get(f"{n}_error", "-") for n in METHODS]
        if graphs:
            cells += [fmt(us(r.get(f"{n}_graph_ms")), 1) for n in METHODS]
        cells += [ratio(r.get("replay_ms"), r.get("snapshot_ms")), ratio(r.get("spec_step_ms"), r.get("snapshot_ms"))]
        cells += [ratio(r.get(f"{n}_ms"), at_n1.get((r["B"], n))) for n in (*OURS, "snapshot")]
        cells.append("FAILED" if r.get("failed") else "ok")
        lines.append("| " + " | ".join(cells) + " |")

    lines += ["", "### bytes moved per round (MB, from the shapes)", "",
              "Per sequence: S = HV K V 4 bytes of state, c = HV (2K + V) 4 bytes of cache per token; inputs "
              "(q, k, v, g, beta of n tokens) and outputs (o, bf16) are added to every method."]
    lines += [f"- {name}: {text}" for name, text in BYTES.items()]
    header = ["B", "n", "m"] + [f"{n} MB" for n in METHODS] + [f"{n} TB/s" for n in (*OURS, "snapshot")]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in spec_rows:
        cells = [str(r["B"]), str(r["n"]), fmt(r["m"], 1)] + [fmt(r["bytes"][n] / 1e6, 2) for n in METHODS]
        for n in (*OURS, "snapshot"):
            ms = r.get(f"{n}_ms")
            cells.append(fmt(r["bytes"][n] / (ms * 1e-3) / 1e12, 2) if isinstance(ms, float) else "-")
        lines.append("| " + " | ".join(cells) + " |")

    lines += ["", "## Targets (issue 4)", ""] + targets(meta, decode_rows, spec_rows)
    failures = [(r, f) for r in decode_rows + spec_rows for f in r.get("failed", [])]
    errors = [(r, k, v) for r in decode_rows + spec_rows for k, v in r.items() if k.endswith("_error")]
    if failures or errors:
        lines += ["", "## Check failures and errors", ""]
        lines += [f"- B={r['B']}{' n=%d' % r['n'] if 'n' in r else ''}: {f}" for r, f in failures]
        lines += [f"- B={r['B']}{' n=%d' % r['n'] if 'n' in r else ''} {k}: {v}" for r, k, v in errors]
    return "\n".join(lines) + "\n"


def targets(meta, decode_rows, spec_rows) -> list[str]:
    out = []
    decode = {r["B"]: r for r in decode_rows}
    if 256 in decode and decode[256].get("ours_state_TBps") and meta["copy_TBps"]:
        share = decode[256]["ours_state_TBps"] / meta["copy_TBps"]
        out.append(f"- decode B=256: state traffic at {share:.0%} of the copy bandwidth (target >= 90%)")
    if 1 in decode and isinstance(decode[1].get("ours_graph_ms"), float):
        out.append(f"- decode B=1 in a CUDA graph: {decode[1]['ours_graph_ms'] * 1e3:.1f} µs (target < 20 µs)")
    slower = [f"B={r['B']} n={r['n']}" for r in spec_rows
              if isinstance(r.get("replay_ms"), float) and isinstance(r.get("snapshot_ms"), float)
              and r["replay_ms"] >= r["snapshot_ms"]]
    if any("replay_ms" in r and "snapshot_ms" in r for r in spec_rows):
        out.append("- replay below the snapshot baseline at every n and B: "
                   + ("yes" if not slower else "no (" + ", ".join(slower) + ")"))
    by = {(r["B"], r["n"]): r for r in spec_rows}
    if (256, 1) in by and (256, 8) in by:
        for name in OURS:
            a, b = by[(256, 8)].get(f"{name}_ms"), by[(256, 1)].get(f"{name}_ms")
            if isinstance(a, float) and isinstance(b, float):
                out.append(f"- {name} B=256: n=8 costs {a / b:.2f}× n=1 (target <= 1.3×)")
    return out or ["- (not measured at these shapes)"]


if __name__ == "__main__":
    sys.exit(main())
