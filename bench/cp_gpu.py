"""Context-parallel benchmark (issue 5 §2-§3) of a k3compile-generated module, against fla.

Standalone: needs torch and triton (fla-core for the comparison), NOT k3compile or xDSL. The
module is generated with the default pipeline (it then has `chunk_segments` and its `chunk`
takes `segments=` and `cp_group=`; docs/context-parallel.md) from a gate variant of
bench/specs/kda_h16.toml (bench/chunk_cases.py):

    python3 bench/chunk_cases.py specs bench/generated/specs --cases kda_h16 --pairings bounded
    k3c compile bench/generated/specs/kda_h16_clamped.toml -o bench/generated

fla is called with the gate contract of the module's gate_input (clamped: chunk_kda(...,
safe_gate=True, lower_bound=-5); log: its default), and both are stated in the report; the
gates are logsigmoid(randn) clamped at -5, valid for both.

Two modes, run from the repo root on the GPU machine:

    # §2 one GPU: B1 T131072 H16 and B2 T16384 H16 (bf16, K = V = 128), every P of --segments
    # against the plain entry (P = 1) and fla's chunk_kda; B8 T8192 (a shape that fills the GPU)
    # checks that the best P is never slower than P = 1
    python bench/cp_gpu.py intra --module bench/generated/kda_h16_clamped.py --out OUT

    # §3 ranks: T = 1M tokens (B1 H16) over the ranks of a NCCL group, one sequence, an initial
    # state on rank 0 and the final state on the last rank; rank 0 also times the 1-GPU plain
    # entry on all T tokens (scaling efficiency), the all_gather alone (bytes and time) and fla's CP
    # (fla.ops.cp.build_cp_context + chunk_kda(cp_context=...), which has no initial/final state)
    torchrun --nproc-per-node 2 bench/cp_gpu.py multi --module bench/generated/kda_h16_clamped.py --out OUT

    # CPU smoke tests (Triton interpreter, a small module, e.g. H=2 K=V=16 float32):
    python bench/cp_gpu.py intra --device cpu --tiny --module /tmp/m/kda_small.py --out /tmp/cpb
    torchrun --nproc-per-node 2 bench/cp_gpu.py multi --device cpu --tiny --module /tmp/m/kda_small.py --out /tmp/cpb

Before any timing every result is checked: each P against P = 1 (RMS of o and the final state),
ours against fla where both run, and in `multi` each rank's slice against the 1-GPU run of the
whole stream at --check-tokens (the multi-rank result must equal the single-device one). Writes
OUT/cp_intra.{md,json} or OUT/cp_multi_w<world>.{md,json}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
from chunk_cases import GATE_INPUT, fla_gate_options, fla_semantics, ours_semantics  # noqa: E402
from common import (  # noqa: E402
    compare,
    cpu_time_ms,
    device_name,
    fmt,
    git_commit,
    import_file,
    import_fla,
    ints,
    recurrence_options,
    short_error,
)

INTRA_CASES = {  # name -> (B, T); H from --heads
    "B1_T131072": (1, 131072),
    "B2_T16384": (2, 16384),
    "B8_T8192_fills": (8, 8192),
}
TINY_INTRA = {"B1_T96": (1, 96), "B2_T48": (2, 48)}
FLA_KDA = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False)
PAIRING_OF_GATE = {gate_input: pairing for pairing, gate_input in GATE_INPUT.items()}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["intra", "multi"])
    p.add_argument("--module", required=True, help="the generated module (.py) of a KDA spec")
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="CPU smoke shapes")
    p.add_argument("--heads", type=int, default=None, help="query/key heads H (default: HV, read from the module)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default bf16 (cpu: fp32)")
    p.add_argument("--segments", type=ints, default=None, help="P values of `intra` (default 2,4,8,16,32,64)")
    p.add_argument("--cases", default=None, help=f"comma-separated `intra` cases of {list(INTRA_CASES)}")
    p.add_argument("--tokens", type=int, default=None, help="`multi`: tokens of the stream (default 1048576)")
    p.add_argument("--check-tokens", type=int, default=None, help="`multi`: stream length of the check (default 65536)")
    p.add_argument("--rank-segments", type=lambda x: x if x == "auto" else int(x), default="auto",
                   help="`multi`: segments per rank's piece (an int, or auto)")
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--rep", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_slice(torch, seed, B, T, H, HV, K, V, device, dtype, gate_scale=1.0):
    """Random KDA inputs (fla layouts) drawn on the device: q, k L2-normalised; g fp32
    logsigmoid(randn) clamped at -5, times gate_scale; beta sigmoid(randn); initial_state
    randn * 0.1 fp32. A stream drawn as slices with seeds seed, seed + 1, ... is the same
    whatever the ranks."""
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    return dict(
        q=F.normalize(randn(B, T, H, K), dim=-1).to(dtype),
        k=F.normalize(randn(B, T, H, K), dim=-1).to(dtype),
        v=randn(B, T, HV, V).to(dtype),
        g=(F.logsigmoid(randn(B, T, HV, K)).clamp(min=-5.0) * gate_scale).float(),
        beta=torch.sigmoid(randn(B, T, HV)).to(dtype),
        initial_state=(randn(B, HV, K, V) * 0.1).float(),
    )


def stream(torch, seed, slices, T_slice, H, HV, K, V, device, dtype, gate_scale=1.0):
    """The B = 1 stream of `slices` slices of T_slice tokens; initial_state of slice 0."""
    parts = [make_slice(torch, seed + r, 1, T_slice, H, HV, K, V, device, dtype, gate_scale) for r in range(slices)]
    out = {n: torch.cat([p[n] for p in parts], dim=1) for n in ("q", "k", "v", "g", "beta")}
    out["initial_state"] = parts[0]["initial_state"]
    return out


class Timer:
    def __init__(self, torch, on_cpu, args):
        self.torch, self.on_cpu, self.args = torch, on_cpu, args

    def __call__(self, fn):
        if self.on_cpu:
            return cpu_time_ms(fn, reps=2)
        import triton.testing

        return triton.testing.do_bench(fn, warmup=self.args.warmup, rep=self.args.rep, return_mode="median")


@contextlib.contextmanager
def errors_into(row, key):
    """A failure of the block is recorded in row[key] (and its traceback printed): the run goes on."""
    try:
        yield
    except Exception as err:  # noqa: BLE001
        row[key] = short_error(err)
        traceback.print_exc()


def write(out_dir, name, meta, rows, columns):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2, default=str))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) if isinstance(r.get(c), (int, str)) else fmt(r.get(c), 3) for c in columns)
              + " |" for r in rows]
    text = "\n".join([f"# {name}", "", *(f"- {k}: {v}" for k, v in meta.items() if v is not None), "", *lines, ""])
    (out / f"{name}.md").write_text(text)
    return text


def gate_pairing(module_path, module):
    """The gate pairing of bench/chunk_cases.py that the module's gate_input belongs to: fla is
    called with the same contract (bounded: safe_gate; unbounded: its default)."""
    gate_input = recurrence_options(module)["gate_input"]
    if gate_input not in PAIRING_OF_GATE:
        sys.exit(f"{module_path}: gate_input {gate_input} takes raw gate inputs; compile the spec with gate_input "
                 f"{' or '.join(PAIRING_OF_GATE)} (fla gets the log-space g)")
    return PAIRING_OF_GATE[gate_input]


def meta_of(torch, args, on_cpu, module, pairing, **extra):
    return dict(module=args.module, device=device_name(torch, on_cpu), torch=torch.__version__,
                triton=__import__("triton").__version__, git_commit=git_commit(), command=" ".join(["python3", *sys.argv]),
                transition=module._CHUNK_CP.transition, chunk_size=module._CHUNK_CP.chunk_size,
                gates="g fp32 logsigmoid(randn) clamped at -5 (multi's check: times a small scale)",
                ours_gate=ours_semantics(pairing), fla_gate=fla_semantics("kda", pairing),
                time=time.strftime("%Y-%m-%d %H:%M:%S"), **extra)


def fla_chunk(args, on_cpu):
    if args.no_fla or on_cpu:
        return None, "disabled" if args.no_fla else "not on the CPU"
    try:
        return import_fla("fla.ops.kda", "chunk_kda")[0], None
    except Exception as err:  # noqa: BLE001
        return None, short_error(err)


def intra(torch, args, module, pairing, on_cpu, device, dtype, H, HV, K, V):
    timer = Timer(torch, on_cpu, args)
    fla_kwargs = {**FLA_KDA, **fla_gate_options("kda", pairing)}
    cases = TINY_INTRA if args.tiny else {n: INTRA_CASES[n] for n in (args.cases or ",".join(INTRA_CASES)).split(",")}
    P_values = args.segments or ([2, 3, 5] if args.tiny else [2, 4, 8, 16, 32, 64])
    fla, fla_error = fla_chunk(args, on_cpu)
    meta = meta_of(torch, args, on_cpu, module, pairing, dtype=str(dtype), H=H, HV=HV, K=K, V=V, segments=P_values,
                   fla_error=fla_error,
                   timing="cpu median" if on_cpu else f"do_bench median, warmup {args.warmup} ms, rep {args.rep} ms")
    rows = []
    for name, (B, T) in cases.items():
        print(f"== {name}: B={B} T={T} H={H} K={K} V={V}", flush=True)
        inp = make_slice(torch, args.seed, B, T, H, HV, K, V, device, dtype)
        row = dict(case=name, B=B, T=T)

        def ours(P):
            return module.chunk(**inp, output_final_state=True, segments=P)

        plain = ours(1)
        row["plain_ms"] = timer(lambda: ours(1))
        per_P = {}
        for P in P_values:
            per_P[P] = {}
            with errors_into(per_P[P], "error"):
                o, s = ours(P)
                o_rms, s_rms = compare(torch, o, plain[0])[1], compare(torch, s, plain[1])[1]
                per_P[P].update(ms=timer(lambda: ours(P)), o_rms_vs_plain=o_rms, state_rms_vs_plain=s_rms)
                print(f"   P={P}: {per_P[P]['ms']:.3f} ms, rms vs P=1 o {o_rms:.2e} S {s_rms:.2e}", flush=True)
        row["per_P"] = per_P
        # segments="auto" (the runtime's heuristic): its P and time
        row["auto_P"] = module._CHUNK_CP.auto_segments([T] * B, torch.device(device))
        row["auto_ms"] = timer(lambda: ours("auto"))
        row["auto_vs_plain"] = row["plain_ms"] / row["auto_ms"]
        timed = {P: r["ms"] for P, r in per_P.items() if "ms" in r}
        if timed:
            best = min(timed, key=timed.get)
            row.update(best_P=best, best_ms=timed[best], best_vs_plain=row["plain_ms"] / timed[best],
                       best_o_rms_vs_plain=per_P[best]["o_rms_vs_plain"])
        if fla is not None:
            with errors_into(row, "fla_error"):
                fo, fs = fla(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], scale=K**-0.5,
                             initial_state=inp["initial_state"], output_final_state=True, **fla_kwargs)
                row["fla_o_rms_vs_plain"] = compare(torch, fo, plain[0])[1]
                row["fla_ms"] = timer(lambda: fla(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], scale=K**-0.5,
                                                  initial_state=inp["initial_state"], output_final_state=True, **fla_kwargs))
                row["fla_over_best"] = row["fla_ms"] / row["best_ms"] if "best_ms" in row else None
                row["fla_over_auto"] = row["fla_ms"] / row["auto_ms"]
        rows.append(row)
        del inp, plain
        if not on_cpu:
            torch.cuda.empty_cache()
        text = write(args.out, "cp_intra", meta, rows,
                     ["case", "plain_ms", "best_P", "best_ms", "best_vs_plain", "auto_P", "auto_ms", "auto_vs_plain",
                      "fla_ms", "fla_over_best", "fla_over_auto",
                      "best_o_rms_vs_plain", "fla_o_rms_vs_plain"])
    print(text)
    return 0


def multi(torch, args, module, pairing, on_cpu, device, dtype, H, HV, K, V):
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if not on_cpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("gloo" if on_cpu else "nccl")
    group = dist.group.WORLD
    timer = Timer(torch, on_cpu, args)
    total = args.tokens or (96 if args.tiny else 1 << 20)
    check_total = args.check_tokens or (48 if args.tiny else 1 << 16)
    if total % world or check_total % world:
        sys.exit(f"--tokens {total} and --check-tokens {check_total} must split evenly over {world} ranks")

    started = time.perf_counter()

    def log(message):  # where the call's minutes go
        if rank == 0:
            print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)

    def sync():
        if not on_cpu:
            torch.cuda.synchronize()
        dist.barrier()

    def median_ms(fn):  # a first call, then the median of calls between barriers: the same count on every rank
        sync()
        fn()
        sync()
        times = []
        for _ in range(3 if on_cpu else 10):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[len(times) // 2]

    def mine(full, T):  # this rank's slice and states (one sequence: its initial state on rank 0)
        out = {n: full[n][:, rank * T:(rank + 1) * T].contiguous() for n in ("q", "k", "v", "g", "beta")}
        out["initial_state"] = full["initial_state"] if rank == 0 else full["initial_state"][:0].contiguous()
        return out

    def ours(inp):
        return module.chunk(**inp, output_final_state=True, cp_group=group, segments=args.rank_segments)

    row = dict(world=world, T=total, T_per_rank=total // world, rank_segments=args.rank_segments)
    # the check: every rank's slice of the CP result against the plain entry on the whole stream,
    # with gates slow enough (a decay of about e^-1.6 over a rank's tokens) that the state entering
    # a rank still holds the stream's initial state: with the timed inputs' gates it has decayed to
    # zero there, and the check could not see the transition M of the combine
    full = stream(torch, args.seed, world, check_total // world, H, HV, K, V, device, dtype,
                  gate_scale=2.0 * world / check_total)
    o, s = ours(mine(full, check_total // world))
    ref_o, ref_s = module._chunk_single(**full, output_final_state=True)
    T = check_total // world
    check = [compare(torch, o, ref_o[:, rank * T:(rank + 1) * T])[1],
             compare(torch, s, ref_s)[1] if rank == world - 1 else 0.0]
    checks = [None] * world
    dist.all_gather_object(checks, check)
    row["check_T"] = check_total
    row["check_o_rms_max"] = max(c[0] for c in checks)
    row["check_state_rms"] = checks[-1][1]
    log(f"checked at T = {check_total}")
    del full, o, s, ref_o, ref_s
    # the timing at T tokens
    T = total // world
    inp = make_slice(torch, args.seed + 1000 + rank, 1, T, H, HV, K, V, device, dtype)
    if rank:
        inp["initial_state"] = inp["initial_state"][:0].contiguous()
    row["cp_ms"] = median_ms(lambda: ours(inp))
    # the all_gather alone: its bytes and time
    cp = module._CHUNK_CP
    M_numel, N_numel = cp.summary_numel()
    payload = torch.zeros(4 + M_numel + N_numel, dtype=torch.float32, device=device)
    bucket = [torch.empty_like(payload) for _ in range(world)]
    row["all_gather_bytes_per_rank"] = payload.numel() * 4
    # a fixed count on every rank: do_bench sizes its loop from a per-rank estimate, and ranks
    # that issue different numbers of collectives hang
    sync()
    start = time.perf_counter()
    for _ in range(20):
        dist.all_gather(bucket, payload, group=group)
    sync()
    row["all_gather_ms"] = (time.perf_counter() - start) * 1e3 / 20
    log(f"ours timed: {row['cp_ms']:.3f} ms")

    def report():  # rank 0 writes what is measured so far: fla's first call autotunes for minutes
        dist.barrier()
        if rank == 0:
            meta = meta_of(torch, args, on_cpu, module, pairing, dtype=str(dtype), H=H, HV=HV, K=K, V=V,
                           backend=dist.get_backend(group),
                           timing="median wall time of the call between barriers (all ranks synchronised)",
                           fla_call="fla.ops.kda.chunk_kda(..., cp_context=fla.ops.cp.build_cp_context(cu_seqlens, group))")
            print(write(args.out, f"cp_multi_w{world}", meta, [row],
                        ["world", "T", "rank_segments", "cp_ms", "one_device_ms", "speedup", "scaling_efficiency",
                         "one_device_auto_ms", "speedup_vs_auto", "all_gather_bytes_per_rank",
                         "all_gather_ms", "fla_cp_ms", "check_o_rms_max", "check_state_rms"]), flush=True)

    del inp
    # the 1-device run of the whole stream, on rank 0 while the others wait
    if rank == 0:
        whole = make_slice(torch, args.seed + 2000, 1, total, H, HV, K, V, device, dtype)
        with errors_into(row, "one_device_error"):
            row["one_device_ms"] = timer(lambda: module._chunk_single(**whole, output_final_state=True))
            row["scaling_efficiency"] = row["one_device_ms"] / (world * row["cp_ms"])
            row["speedup"] = row["one_device_ms"] / row["cp_ms"]
            # the best one device does: its own segments
            row["one_device_auto_ms"] = timer(lambda: module.chunk(**whole, output_final_state=True, segments="auto"))
            row["speedup_vs_auto"] = row["one_device_auto_ms"] / row["cp_ms"]
        del whole
        log("one device timed")
    report()
    # fla's CP (no initial or final state there)
    fla, fla_error = fla_chunk(args, on_cpu)
    row["fla_error"] = fla_error
    inp = make_slice(torch, args.seed + 1000 + rank, 1, T, H, HV, K, V, device, dtype)
    if fla is not None:
        with errors_into(row, "fla_error"):
            from fla.ops.cp import build_cp_context

            ctx = build_cp_context(torch.tensor([0, total], dtype=torch.long, device=device), group=group)
            row["fla_cp_ms"] = median_ms(lambda: fla(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], scale=K**-0.5,
                                                     cp_context=ctx, **FLA_KDA, **fla_gate_options("kda", pairing)))
    del inp
    log("fla timed")
    report()
    dist.destroy_process_group()
    return 0


def main(argv=None):
    args = parse_args(argv)
    on_cpu = args.device == "cpu"
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --device cpu --tiny for a smoke test")
    module = import_file(Path(args.module), Path(args.module).stem)
    if not hasattr(module, "_CHUNK_CP"):
        sys.exit(f"{args.module}: no context parallelism (compile with the default pipeline: it adds chunk_segments)")
    HV, K, V = module._CHUNK_CP.state_shape if not module._CHUNK_CP.vk else (
        module._CHUNK_CP.state_shape[0], module._CHUNK_CP.state_shape[2], module._CHUNK_CP.state_shape[1])
    pairing = gate_pairing(args.module, module)
    H = args.heads or HV
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("fp32" if on_cpu else "bf16")]
    device = torch.device(args.device)
    return (intra if args.mode == "intra" else multi)(torch, args, module, pairing, on_cpu, device, dtype, H, HV, K, V)


if __name__ == "__main__":
    sys.exit(main())
