"""A million tokens on one GPU (issue 35, item 7): KDA forward + backward of one sequence through
our compiled layer's `chunk(..., segments="auto")` (context parallelism inside the device, whose
backward is chunk_backward with the same segments; docs/context-parallel.md) and the plain path
(segments=None), against fla-core's `fla.ops.kda.chunk_kda` on the same call.

    python3 -P bench/million_tokens_gpu.py --out DIR [--tokens 1048576] [--heads 16] [--no-fla]
    TRITON_INTERPRET=1 python bench/million_tokens_gpu.py --smoke --out /tmp/mt    # CPU smoke test

(`PHASES=million OUT=DIR bash bench/device_run.sh` on the device machine, $MILLION_ARGS for more
options.) Needs k3compile (the layer compiles on first use: k3compile.ops' module of the same
key, K3C_CACHE_DIR) and, for the comparison, fla-core 0.6.0.

The call: B1 T=--tokens H=HV=--heads K=V=128, bf16 q, k, v, beta (post-sigmoid), fp32 g and
initial state, the final state out; q and k drawn from randn and L2-normalised in the kernel on
both sides (ours: qk_l2norm = true; fla: use_qk_l2norm_in_kernel=True). Two gate pairings
(bench/chunk_cases.py), the same draw g = logsigmoid(randn):
  unbounded  g as drawn; ours gate_input = "log", fla's default
  bounded    g clamped at -5; ours gate_input = "clamped", gate_lower_bound = -5; fla
             safe_gate=True, lower_bound=-5
Per row (ours segments="auto", ours plain, fla): the forward alone (under torch.no_grad), forward
+ backward (torch.autograd.backward of (o, final state) with random cotangents), both the median
of --reps warm calls timed with CUDA events; the peak memory of one forward + backward
(torch.cuda.max_memory_allocated above what the inputs and cotangents hold, the gradients
included); the wall time of the first call (compiles, fla's autotuning: not in the timings); and
fla / ours ratios. A side that runs out of memory is "OOM" and the run goes on.

The check (no float64 at this length): ||ours - fla|| / ||fla|| of o, the final state and every
gradient, against twice fla's tolerances of float64 (bench/backward_gpu.py; o and the final state
twice chunk_gpu.py's bf16 tolerance): each side within its tolerance of the truth puts the two
within their sum. And ||auto - plain|| / ||plain||, the same quantities (with these gates a state
decays to nothing within a segment, so this checks the split's plumbing, every token and gradient
written, not its combine: tests/test_context_parallel_backward.py does that). The first side's results
wait on the host and come back to the GPU in slices, so no side's memory holds another's.

--smoke: a tiny layer (H2, K = V = 16, 100 tokens, fp32) compiled here, Triton's interpreter,
segments=3 (auto picks 1 on the CPU), no fla, one timed call.

Writes DIR/million_tokens.md and DIR/million_tokens.json (GPU, versions, commit, date, command),
rewritten after every side so that a run cut short keeps what it measured. Exit status 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from chunk_cases import (  # noqa: E402
    GATE_FLOOR,
    GATE_INPUT,
    fla_gate_options,
    fla_semantics,
    gate_floor,
    names,
    ours_semantics,
)
from common import device_name, fmt, git_commit, import_fla, short_error  # noqa: E402

PAIRING_ORDER = ("unbounded", "bounded")  # the bounded gates are the unbounded draw clamped in place
GRADIENTS = ("q", "k", "v", "g", "beta", "h0")
COMPARED = ("o", "final_state", *GRADIENTS)
FIRST_CALL_SLOW_S = 10.0  # a first call slower than this is said to be (compiles, autotuning)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for million_tokens.md and million_tokens.json")
    p.add_argument("--tokens", type=int, default=None, help="T of the one sequence (default 1048576; --smoke 100)")
    p.add_argument("--heads", type=int, default=None, help="H = HV (default 16; --smoke 2)")
    p.add_argument("--gates", default=",".join(PAIRING_ORDER), help="comma-separated gate pairings (default both)")
    p.add_argument("--segments", default=None,
                   help="ours' split path: auto or an int P (default auto; --smoke 3: auto is 1 on the CPU)")
    p.add_argument("--reps", type=int, default=None, help="timed warm calls per measure, median (default 3; --smoke 1)")
    p.add_argument("--no-fla", action="store_true", help="do not import or run fla")
    p.add_argument("--smoke", action="store_true", help="CPU smoke test: tiny fp32 layer, Triton's interpreter, no fla")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.tokens = args.tokens or (100 if args.smoke else 1 << 20)
    args.heads = args.heads or (2 if args.smoke else 16)
    args.dim = 16 if args.smoke else 128
    args.reps = args.reps or (1 if args.smoke else 3)
    segments = args.segments or ("3" if args.smoke else "auto")
    try:
        args.segments = segments if segments == "auto" else int(segments)
    except ValueError:
        p.error(f"--segments: expected auto or an int, got {segments!r}")
    try:
        chosen = names(args.gates, PAIRING_ORDER, "--gates")
    except ValueError as err:
        p.error(str(err))
    args.gates = [g for g in PAIRING_ORDER if g in chosen]
    return args


class Bench:
    """The run's state: device, timers, the results kept for the checks, the report."""

    def __init__(self, torch, args, on_cpu):
        self.torch, self.args, self.on_cpu = torch, args, on_cpu
        self.device = torch.device("cpu" if on_cpu else "cuda")
        self.dtype = torch.float32 if on_cpu else torch.bfloat16

    def sync(self):
        if not self.on_cpu:
            self.torch.cuda.synchronize()

    def median_ms(self, fn, before=lambda: None):
        """Median of --reps calls of fn (before() outside the timed span), CUDA events on the GPU."""
        times = []
        for _ in range(self.args.reps):
            before()
            if self.on_cpu:
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
                continue
            start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.sync()
            start.record()
            fn()
            end.record()
            self.sync()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def free(self):
        gc.collect()
        if not self.on_cpu:
            self.torch.cuda.empty_cache()

    def rms_ratio(self, got, ref, step=1 << 15):
        """||got - ref|| / ||ref||, fp32 slices of dim 1 (tokens, or heads of a state) on the device,
        sums in float64: either side may wait on the host."""
        torch = self.torch
        num = torch.zeros((), dtype=torch.float64, device=self.device)
        den = torch.zeros((), dtype=torch.float64, device=self.device)
        for s in range(0, ref.shape[1], step):
            a = got[:, s:s + step].to(self.device, torch.float32)
            b = ref[:, s:s + step].to(self.device, torch.float32)
            num += (a - b).pow(2).sum(dtype=torch.float64)
            den += b.pow(2).sum(dtype=torch.float64)
        return float((num / den.clamp_min(1e-300)).sqrt())


def make_inputs(torch, args, device, dtype):
    """The leaves (requires grad), drawn on the device; g unbounded (clamped later, in place, for
    the bounded pairing); the cotangents of o and the final state."""
    import torch.nn.functional as F

    B, T, H, K, V = 1, args.tokens, args.heads, args.dim, args.dim
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    leaves = dict(q=randn(B, T, H, K).to(dtype), k=randn(B, T, H, K).to(dtype), v=randn(B, T, H, V).to(dtype),
                  g=F.logsigmoid(randn(B, T, H, K)), beta=torch.sigmoid(randn(B, T, H)).to(dtype),
                  h0=randn(B, H, K, V) * 0.1)
    for x in leaves.values():
        x.requires_grad_()
    cotangents = (randn(B, T, H, V).to(dtype), randn(B, H, K, V))
    return leaves, cotangents


def measure(bench, row, call, leaves, cotangents, keep):
    """One side: the first forward + backward (wall s), its results (keep(results) -> the kept
    ones); peak memory; forward and forward + backward times. Raises what the side raises."""
    torch = bench.torch

    def clear():
        for x in leaves.values():
            x.grad = None

    def forward():
        with torch.no_grad():
            call()

    def training():
        o, ht = call()
        torch.autograd.backward([o, ht], list(cotangents))

    row["step"] = "first call"
    clear()
    bench.sync()
    start = time.perf_counter()
    o, ht = call()
    torch.autograd.backward([o, ht], list(cotangents))
    bench.sync()
    row["first_call_s"] = time.perf_counter() - start
    results = dict(o=o.detach(), final_state=ht.detach(), **{n: x.grad for n, x in leaves.items()})
    del o, ht
    clear()
    row["step"] = "checks"
    keep(results)
    del results
    bench.free()
    if not bench.on_cpu:
        row["step"] = "peak memory"
        bench.sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        training()
        bench.sync()
        row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        clear()
        bench.free()
    row["step"] = "forward"
    forward()  # warm: the inference path may launch kernels the training call did not
    row["fwd_ms"] = bench.median_ms(forward)
    row["step"] = "forward + backward"
    row["fwdbwd_ms"] = bench.median_ms(training, before=clear)
    clear()
    del row["step"]


def run_side(bench, row, call, leaves, cotangents, keep):
    """measure() with a side's failure recorded in the row ("OOM" for out of memory) and its
    memory given back, so the next side runs."""
    torch = bench.torch
    try:
        measure(bench, row, call, leaves, cotangents, keep)
    except torch.cuda.OutOfMemoryError:
        row["error"] = f"OOM ({row.pop('step', '?')})"
    except Exception as err:  # noqa: BLE001 - the other sides still run
        traceback.print_exc()
        row["error"] = f"{short_error(err)} ({row.pop('step', '?')})"
    for x in leaves.values():
        x.grad = None
    bench.free()
    slow = row.get("first_call_s", 0) > FIRST_CALL_SLOW_S
    print(f"   {row['side']}: " + ", ".join(f"{k} {fmt(row.get(k), 3)}" for k in ("fwd_ms", "fwdbwd_ms", "peak_mib",
                                                                                    "first_call_s") if k in row)
          + (" (first call slow: compiles / autotuning, not in the timings)" if slow else "")
          + (f"; {row['error']}" if "error" in row else ""), flush=True)


def check_row(bench, gates, comparison, got, ref, tolerance):
    """A check table row: rms ratios of every compared quantity, ok where all are within tolerance."""
    row = dict(gates=gates, comparison=comparison)
    for name in COMPARED:
        row[name] = bench.rms_ratio(got[name], ref[name])
    failed = [n for n in COMPARED if not row[n] <= tolerance[n]]  # NaN fails
    row["check"] = "FAILED: " + ", ".join(failed) if failed else "ok"
    print(f"   check {comparison}: " + ", ".join(f"{n} {row[n]:.2e}" for n in COMPARED) + f" -> {row['check']}",
          flush=True)
    return row


TIMING_COLUMNS = [("gates", "gates"), ("side", "side"), ("P", "segments P"), ("fwd_ms", "fwd ms"),
                  ("fwdbwd_ms", "fwd+bwd ms"), ("peak_mib", "peak MiB above inputs"), ("first_call_s", "first call s"),
                  ("fla_over_ours_fwd", "fla / ours fwd"), ("fla_over_ours_fwdbwd", "fla / ours fwd+bwd"),
                  ("fla_over_ours_peak", "fla / ours peak"), ("error", "error")]


def report(args, meta, rows, checks):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "million_tokens.json").write_text(json.dumps(dict(meta=meta, rows=rows, checks=checks), indent=1,
                                                        default=str))

    def cell(value):
        return str(value) if isinstance(value, (int, str)) else fmt(value, 3)

    lines = ["# A million tokens on one GPU: KDA forward + backward, ours (chunk segments) vs fla chunk_kda", ""]
    lines += [f"- {key}: {value}" for key, value in meta.items() if value is not None]
    lines += ["", "| " + " | ".join(title for _, title in TIMING_COLUMNS) + " |", "|" + "---|" * len(TIMING_COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(key, "-")) for key, _ in TIMING_COLUMNS) + " |" for r in rows]
    slow = [f"{r['gates']} {r['side']} {r['first_call_s']:.0f} s" for r in rows
            if r.get("first_call_s", 0) > FIRST_CALL_SLOW_S]
    if slow:
        lines += ["", f"Slow first calls (compiles, fla's autotuning; not in the timings): {'; '.join(slow)}."]
    lines += ["", "Checks: ||got - ref|| / ||ref|| (o, final state, each gradient)", "",
              "| gates | comparison | " + " | ".join(COMPARED) + " | check |", "|" + "---|" * (len(COMPARED) + 3)]
    lines += ["| " + " | ".join([r["gates"], r["comparison"], *(f"{r[n]:.2e}" for n in COMPARED), r["check"]]) + " |"
              for r in checks]
    text = "\n".join(lines) + "\n"
    (out / "million_tokens.md").write_text(text)
    return text


def main(argv=None):
    args = parse_args(argv)
    on_cpu = args.smoke
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        os.environ["K3C_POISON_OUTPUTS"] = "1"  # outputs NaN-filled: an element never written fails the checks
    import torch
    import triton

    import k3compile
    from backward_gpu import TOLERANCE as FLOAT64_TOLERANCE  # fla's tolerances of float64 autograd
    from chunk_gpu import TOLERANCE as OUTPUT_TOLERANCE  # o and final state against an fp32 token loop
    from k3compile.ops.layers import LayerKey, layer_module

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --smoke for a CPU smoke test")
    bench = Bench(torch, args, on_cpu)
    B, T, H, K, V = 1, args.tokens, args.heads, args.dim, args.dim
    precision = "fp32" if on_cpu else "bf16"
    # each side within its tolerance of the truth: the two within the sum; auto vs plain: one compiler,
    # two schedules, each within the tolerance of the output
    vs_fla = {"o": 2 * OUTPUT_TOLERANCE[precision], "final_state": 2 * OUTPUT_TOLERANCE[precision],
              **{n: 2 * FLOAT64_TOLERANCE[n] for n in GRADIENTS}}
    vs_plain = {n: OUTPUT_TOLERANCE[precision] if on_cpu else 2 * OUTPUT_TOLERANCE[precision] for n in COMPARED}

    fla, fla_version, fla_note = None, None, "disabled (--no-fla)" if args.no_fla else "not on the CPU (--smoke)"
    if not args.no_fla and not on_cpu:
        try:
            fla, fla_version, fla_note = import_fla("fla.ops.kda", "chunk_kda")
        except Exception as err:  # noqa: BLE001 - ours still runs
            fla_note = short_error(err)
    meta = dict(
        device=device_name(torch, on_cpu), torch=torch.__version__, triton=triton.__version__,
        k3compile=k3compile.__version__, fla=fla_version, fla_note=fla_note,
        git_commit=git_commit(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        command=" ".join(["python3", *sys.argv]),
        shape=f"B{B} T{T} H{H} HV{H} K{K} V{V}, {precision} q k v beta and o, fp32 g and states",
        inputs="q, k = randn (L2-normalised in the kernel, both sides), v = randn, beta = sigmoid(randn), "
               "g = logsigmoid(randn) (bounded: clamped at -5), h0 = 0.1 randn; cotangents randn",
        ours_call=f"k3compile.ops.layers.layer_module(LayerKey(kda, qk_l2norm, gate_input per pairing)).chunk(q, k, v, g, "
                  f"beta, scale=K**-0.5, initial_state=h0, output_final_state=True, segments={args.segments!r} / None)",
        fla_call="fla.ops.kda.chunk_kda(q, k, v, g, beta, scale=K**-0.5, initial_state=h0, output_final_state=True, "
                 "use_qk_l2norm_in_kernel=True, <gate options of the pairing>)",
        gates={p: f"ours {ours_semantics(p)}, fla {fla_semantics('kda', p)}" for p in args.gates},
        timing=("cpu perf_counter, one call (smoke test)" if on_cpu else
                f"median of {args.reps} warm calls, CUDA events; fwd under torch.no_grad; fwd+bwd = "
                "torch.autograd.backward((o, final state), random cotangents), gradients set to None between calls"),
        peak="torch.cuda.max_memory_allocated during one fwd+bwd minus what the inputs and cotangents hold "
             "(gradients, o and everything saved included)",
        first_call="wall time of the first fwd+bwd of each side (ours: Triton compiles; fla: its autotuning, a minute "
                   "or two per new shape unless Triton's autotune cache is seeded); not in the timings",
        tolerances=f"vs fla: {vs_fla}; auto vs plain: {vs_plain}",
    )
    rows, checks, started = [], [], time.perf_counter()
    print(f"== {meta['shape']} on {meta['device']}; fla: {fla_version or fla_note}", flush=True)
    leaves, cotangents = make_inputs(torch, args, bench.device, bench.dtype)
    if not on_cpu:
        meta["inputs_gib"] = torch.cuda.memory_allocated() / 2**30
    for pairing in args.gates:
        floor = gate_floor(pairing)
        if floor is not None:
            with torch.no_grad():
                leaves["g"].clamp_(min=floor)
        key = LayerKey("kda", H, H, K, V, "kv", True, GATE_INPUT[pairing], GATE_FLOOR, "probability")
        compile_start = time.perf_counter()
        module = layer_module(key)
        compile_s = time.perf_counter() - compile_start
        inputs = [leaves[n] for n in ("q", "k", "v", "g", "beta")]
        auto_P = args.segments
        if auto_P == "auto":
            auto_P = module._CHUNK_CP.auto_segments([T] * B, bench.device, bench.dtype)
        print(f"== gates {pairing}: module {key.module_name()} ({compile_s:.1f} s to compile or load); "
              f"segments={args.segments!r} -> P = {auto_P}", flush=True)
        kept = {}

        def ours(segments):
            return lambda: module.chunk(*inputs, scale=K**-0.5, initial_state=leaves["h0"], output_final_state=True,
                                        segments=segments)

        def keeper(label, side):
            def keep(results):
                ref = kept.get("ours")
                if ref is None and label != "fla":  # the first of ours: waits on the host for the later sides' checks
                    kept["ours"] = {n: x.cpu() if not on_cpu else x.clone() for n, x in results.items()}
                    kept["side"] = side.split(" (")[0]
                elif label == "plain":
                    checks.append(check_row(bench, pairing, f"{kept['side']} vs ours plain", ref, results,
                                            vs_plain))
                if label == "fla" and ref is not None:
                    checks.append(check_row(bench, pairing, f"{kept['side']} vs fla", ref, results, vs_fla))
            return keep

        sides = [(f"ours segments={args.segments}", "auto", ours(args.segments), auto_P),
                 ("ours plain (segments=None)", "plain", ours(None), 1)]
        if fla is not None:
            options = dict(use_qk_l2norm_in_kernel=True, **fla_gate_options("kda", pairing))
            sides.append(("fla chunk_kda", "fla", lambda: fla(*inputs, scale=K**-0.5, initial_state=leaves["h0"],
                                                             output_final_state=True, **options), None))
        pairing_rows = {}
        for side, label, call, P in sides:
            row = pairing_rows[label] = dict(gates=pairing, side=side, P=P if P is not None else "-")
            if label == "auto":
                row["compile_or_load_s"] = compile_s
            rows.append(row)
            run_side(bench, row, call, leaves, cotangents, keeper(label, side))
            report(args, meta, rows, checks)
        fla_row = pairing_rows.get("fla")
        for label in ("auto", "plain"):
            ours_row = pairing_rows[label]
            if fla_row is None:
                continue
            for key_, measure_ in (("fwd", "fwd_ms"), ("fwdbwd", "fwdbwd_ms"), ("peak", "peak_mib")):
                if measure_ in fla_row and measure_ in ours_row:
                    ours_row[f"fla_over_ours_{key_}"] = fla_row[measure_] / ours_row[measure_]
        report(args, meta, rows, checks)
        del kept, module
        bench.free()
    meta["wall_s"] = time.perf_counter() - started
    print(report(args, meta, rows, checks))
    return 1 if any(c["check"] != "ok" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
