"""A million tokens on one GPU (issue 35, item 7): KDA forward + backward of one sequence through
our compiled layer's `chunk(..., segments="auto")` (context parallelism inside the device, whose
backward is chunk_backward with the same segments; docs/context-parallel.md) and the plain path
(segments=None), against fla-core's `fla.ops.kda.chunk_kda` on the same call.

    python3 -P bench/million_tokens_gpu.py --out DIR [--tokens 1048576 | --tokens-list 262144,524288,1048576]
                                           [--heads 16] [--gates bounded] [--no-fla]
    TRITON_INTERPRET=1 python bench/million_tokens_gpu.py --smoke --out /tmp/mt    # CPU smoke test

(`PHASES=million OUT=DIR bash bench/device_run.sh` on the device machine, $MILLION_ARGS for more
options.) Needs k3compile (the layer compiles on first use: k3compile.ops' module of the same
key, K3C_CACHE_DIR) and, for the comparison, fla-core 0.6.0.

Every side (ours segments="auto", ours plain, ours through k3compile.ops' chunk_kda, whose
backward runs in windows of tokens where its workspaces would not fit (k3compile/ops/windows.py),
fla) of every gate pairing and length runs in a
fresh Python subprocess of its own (this script with the internal option --side), so that one
side's out-of-memory or CUDA fault, the memory its exception's traceback holds or the caching
allocator's blocks cannot touch another's measurement: each starts from an empty GPU, draws the
same inputs from --seed on the device, writes its row (JSON, rewritten after every step, so a
process that dies keeps what it measured) and a .pt file of its results' slices, and exits; the
parent (which never touches the GPU) collects the rows, compares the slices and writes the
report. A side that dies without a row is reported with its exit status and last line of output.

The call: B1 T=--tokens H=HV=--heads K=V=128, bf16 q, k, v, beta (post-sigmoid), fp32 g and
initial state, the final state out; q and k drawn from randn and L2-normalised in the kernel on
both sides (ours: qk_l2norm = true; fla: use_qk_l2norm_in_kernel=True). Two gate pairings
(bench/chunk_cases.py), the same draw g = logsigmoid(randn):
  unbounded  g as drawn; ours gate_input = "log", fla's default
  bounded    g clamped at -5; ours gate_input = "clamped", gate_lower_bound = -5; fla
             safe_gate=True, lower_bound=-5
Per row (length, pairing, side): the forward alone (under torch.no_grad), forward + backward
(torch.autograd.backward of (o, final state) with random cotangents), both the median of --reps
warm calls timed with CUDA events; the peak memory of one forward + backward
(torch.cuda.max_memory_allocated above what the inputs and cotangents hold, the gradients
included); the wall time of the first call (compiles, fla's autotuning: not in the timings); and
fla / ours ratios. A side that runs out of memory is "OOM (step)" and the run goes on.
--tokens-list runs every length, shortest first, to find the longest each side fits: a side
(pairing, side) that ran out of memory at one length is not run at the longer ones ("not run").

The check (no float64 at this length), on what each side saved after its first call: o, the final
state and every gradient, sliced (the first and the last SLICE_TOKENS tokens, or all of them
when T is at most twice that, of the first SLICE_HEADS heads; the final state and h0's gradient:
the first SLICE_HEADS heads) plus the global norm of each whole tensor (float64 sums on the
device; a NaN anywhere, e.g. an element never written under --smoke's K3C_POISON_OUTPUTS, makes
it NaN). Per quantity ||got - ref|| / ||ref|| over the slice and | ||got|| / ||ref|| - 1 | of the
whole tensors (a lower bound of the whole tensors' relative error), both against twice fla's
tolerances of float64 (bench/backward_gpu.py; o and the final state twice chunk_gpu.py's bf16
tolerance): each side within its tolerance of the truth puts the two within their sum. Ours
auto vs fla, ours plain vs fla, and auto vs plain, the same quantities (with these gates a state
decays to nothing within a segment, so this checks the split's plumbing, every token and gradient
written, not its combine: tests/test_context_parallel_backward.py does that).

--smoke: a tiny layer (H2, K = V = 16, 100 tokens, fp32) compiled here, Triton's interpreter,
segments=3 (auto picks 1 on the CPU), no fla, one timed call.

Writes DIR/million_tokens.md and DIR/million_tokens.json (GPU, versions, commit, date, command),
rewritten after every side so that a run cut short keeps what it measured. Exit status 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
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
from common import device_name, fmt, git_commit, import_fla, ints, short_error  # noqa: E402

PAIRING_ORDER = ("unbounded", "bounded")  # the bounded gates are the unbounded draw clamped
SIDES = ("auto", "plain", "ops", "fla")
GRADIENTS = ("q", "k", "v", "g", "beta", "h0")
COMPARED = ("o", "final_state", *GRADIENTS)
PER_HEAD = ("final_state", "h0")  # [B, H, K, V]: sliced by heads only; the rest [B, T, H, ...]
SLICE_TOKENS = 4096  # the first and the last this many tokens saved for the checks
SLICE_HEADS = 2
FIRST_CALL_SLOW_S = 10.0  # a first call slower than this is said to be (compiles, autotuning)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for million_tokens.md and million_tokens.json (required)")
    p.add_argument("--tokens", type=int, default=None, help="T of the one sequence (default 1048576; --smoke 100)")
    p.add_argument("--tokens-list", default=None,
                   help="comma-separated lengths, each run (shortest first) instead of --tokens, e.g. "
                        "262144,524288,1048576: the longest each side fits")
    p.add_argument("--heads", type=int, default=None, help="H = HV (default 16; --smoke 2)")
    p.add_argument("--gates", default=",".join(PAIRING_ORDER), help="comma-separated gate pairings (default both)")
    p.add_argument("--segments", default=None,
                   help="ours' split path: auto or an int P (default auto; --smoke 3: auto is 1 on the CPU)")
    p.add_argument("--reps", type=int, default=None, help="timed warm calls per measure, median (default 3; --smoke 1)")
    p.add_argument("--no-fla", action="store_true", help="do not import or run fla")
    p.add_argument("--smoke", action="store_true", help="CPU smoke test: tiny fp32 layer, Triton's interpreter, no fla")
    p.add_argument("--seed", type=int, default=0)
    # one side in this process (the parent runs each side so): its row and slices to these files
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--row-out", help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side is None and not args.out:
        p.error("--out is required")
    if args.side is not None and not (args.row_out and args.save):
        p.error("--side needs --row-out and --save")
    if args.tokens_list is not None:
        if args.tokens is not None:
            p.error("--tokens and --tokens-list: give one")
        try:
            args.tokens_list = sorted(set(ints(args.tokens_list)))
        except ValueError:
            p.error(f"--tokens-list: expected comma-separated ints, got {args.tokens_list!r}")
        if not args.tokens_list or min(args.tokens_list) < 1:
            p.error("--tokens-list: expected positive lengths")
    else:
        args.tokens_list = [args.tokens or (100 if args.smoke else 1 << 20)]
    args.tokens = args.tokens_list[-1]
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
    if args.side is not None and len(args.gates) != 1:
        p.error("--side runs one gate pairing")
    return args


# ---- one side, in its own process --------------------------------------------------------------


class Bench:
    """A side's device and timers."""

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

    def norm(self, x, step=1 << 15):
        """||x|| of a whole tensor: fp32 slices of dim 1 (tokens, or heads of a state), sums in float64."""
        torch = self.torch
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        for s in range(0, x.shape[1], step):
            total += x[:, s:s + step].float().pow(2).sum(dtype=torch.float64)
        return float(total.sqrt())


def make_inputs(torch, args, device, dtype):
    """The leaves (requires grad), drawn on the device from --seed (the same in every side's
    process); g unbounded (clamped, in place, for the bounded pairing); the cotangents of o and
    the final state."""
    import torch.nn.functional as F

    B, T, H, K, V = 1, args.tokens, args.heads, args.dim, args.dim
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    leaves = dict(q=randn(B, T, H, K).to(dtype), k=randn(B, T, H, K).to(dtype), v=randn(B, T, H, V).to(dtype),
                  g=F.logsigmoid(randn(B, T, H, K)), beta=torch.sigmoid(randn(B, T, H)).to(dtype),
                  h0=randn(B, H, K, V) * 0.1)
    floor = gate_floor(args.gates[0])
    if floor is not None:
        leaves["g"].clamp_(min=floor)
    for x in leaves.values():
        x.requires_grad_()
    cotangents = (randn(B, T, H, V).to(dtype), randn(B, H, K, V))
    return leaves, cotangents


def save_slices(bench, results, path):
    """What the parent compares: each result's slice (fp32, on the host) and its whole norm."""
    torch = bench.torch
    slices, norms = {}, {}
    for name, x in results.items():
        if x is None:  # no gradient: fails the checks
            slices[name], norms[name] = None, math.nan
            continue
        if name not in PER_HEAD and x.shape[1] > 2 * SLICE_TOKENS:
            x_slice = torch.cat([x[:, :SLICE_TOKENS], x[:, -SLICE_TOKENS:]], 1)
        else:
            x_slice = x
        x_slice = x_slice[:, :SLICE_HEADS] if name in PER_HEAD else x_slice[:, :, :SLICE_HEADS]
        slices[name] = x_slice.detach().float().cpu().clone()
        norms[name] = bench.norm(x.detach())
    torch.save(dict(slices=slices, norms=norms), path)


def measure(bench, row, step, call, leaves, cotangents, keep):
    """One side: the first forward + backward (wall s), its results to keep(results); peak
    memory; forward and forward + backward times. step(name) records where it is. Raises what
    the side raises."""
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

    step("first call")
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
    step("saving the slices")
    keep(results)
    del results
    bench.free()
    if not bench.on_cpu:
        step("peak memory")
        bench.sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        training()
        bench.sync()
        row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        clear()
        bench.free()
    step("forward")
    forward()  # warm: the inference path may launch kernels the training call did not
    row["fwd_ms"] = bench.median_ms(forward)
    step("forward + backward")
    row["fwdbwd_ms"] = bench.median_ms(training, before=clear)
    clear()


def side_main(args):
    """--side: one side of one pairing and length; its row and meta to --row-out (rewritten after
    every step), its slices to --save. Exit status 0 whenever the row says how it ended."""
    on_cpu = args.smoke
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        os.environ["K3C_POISON_OUTPUTS"] = "1"  # outputs NaN-filled: an element never written fails the checks
    import torch
    import triton

    import k3compile

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --smoke for a CPU smoke test")
    bench = Bench(torch, args, on_cpu)
    pairing, T, H, K = args.gates[0], args.tokens, args.heads, args.dim
    meta = dict(device=device_name(torch, on_cpu), torch=torch.__version__, triton=triton.__version__,
                k3compile=k3compile.__version__)
    if not on_cpu:
        meta["gpu_memory_gib"] = torch.cuda.mem_get_info()[1] / 2**30
    row = {}
    out = Path(args.row_out)

    def write():
        out.write_text(json.dumps(dict(meta=meta, row=row), default=str))

    def step(name):
        row["step"] = name
        write()

    try:
        step("inputs")
        leaves, cotangents = make_inputs(torch, args, bench.device, bench.dtype)
        if not on_cpu:
            row["inputs_gib"] = torch.cuda.memory_allocated() / 2**30
        inputs = [leaves[n] for n in ("q", "k", "v", "g", "beta")]
        if args.side == "fla":
            step("import fla")
            try:
                fla, meta["fla"], meta["fla_note"] = import_fla("fla.ops.kda", "chunk_kda")
            except Exception as err:  # noqa: BLE001 - reported, the parent runs no more fla
                meta["fla_note"] = short_error(err)
                raise
            options = dict(use_qk_l2norm_in_kernel=True, **fla_gate_options("kda", pairing))

            def call():
                return fla(*inputs, scale=K**-0.5, initial_state=leaves["h0"], output_final_state=True, **options)
        elif args.side == "ops":  # fla's call through k3compile.ops: the backward in windows where it would not fit
            from k3compile.ops.kda import chunk_kda

            options = dict(use_qk_l2norm_in_kernel=True, **fla_gate_options("kda", pairing))

            def call():
                return chunk_kda(*inputs, scale=K**-0.5, initial_state=leaves["h0"], output_final_state=True,
                                 **options)
        else:
            from k3compile.ops.layers import LayerKey, layer_module

            step("compile")
            key = LayerKey("kda", H, H, K, K, "kv", True, GATE_INPUT[pairing], GATE_FLOOR, "probability")
            start = time.perf_counter()
            module = layer_module(key)
            row["compile_or_load_s"] = time.perf_counter() - start
            meta["module"] = key.module_name()
            segments = args.segments if args.side == "auto" else None
            P = segments
            if P == "auto":
                P = module._CHUNK_CP.auto_segments([T], bench.device, bench.dtype)
            row["P"] = P if P is not None else 1

            def call():
                return module.chunk(*inputs, scale=K**-0.5, initial_state=leaves["h0"], output_final_state=True,
                                    segments=segments)
        measure(bench, row, step, call, leaves, cotangents, lambda results: save_slices(bench, results, args.save))
        del row["step"]
    except torch.cuda.OutOfMemoryError:
        row["error"] = f"OOM ({row.pop('step', '?')})"
    except Exception as err:  # noqa: BLE001 - the row says how the side ended
        traceback.print_exc()
        row["error"] = f"{short_error(err)} ({row.pop('step', '?')})"
    write()
    return 0


# ---- the parent: every side in a process of its own, the checks, the report ---------------------


def run_side(args, side, pairing, T, folder):
    """One side's process: its output relayed as it comes; (row, meta, slices or None). A process
    that dies leaves the row it last wrote, with the exit status and last output line added."""
    row_path, save_path = folder / f"{side}_{pairing}_{T}.json", folder / f"{side}_{pairing}_{T}.pt"
    command = [sys.executable, "-P", str(Path(__file__).resolve()), "--side", side, "--gates", pairing,
               "--tokens", str(T), "--heads", str(args.heads), "--segments", str(args.segments),
               "--reps", str(args.reps), "--seed", str(args.seed), "--row-out", str(row_path), "--save", str(save_path)]
    if args.smoke:
        command.append("--smoke")
    tail = collections.deque(maxlen=20)
    sys.stdout.flush()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        for line in proc.stdout:
            print(f"      | {line}", end="", flush=True)
            if line.strip():
                tail.append(line.strip())
    written = json.loads(row_path.read_text()) if row_path.exists() else dict(meta={}, row={})
    row, meta = written["row"], written["meta"]
    if proc.returncode != 0 and "error" not in row:
        last = (tail[-1] if tail else "no output").replace("|", "/")
        row["error"] = (f"exit status {proc.returncode} ({row.pop('step', 'start')}): "
                        f"{last if len(last) <= 160 else last[:157] + '...'}")
    slices = None
    if save_path.exists():
        import torch

        slices = torch.load(save_path, map_location="cpu")
        save_path.unlink()
    return row, meta, slices


def check_row(T, gates, comparison, got, ref, tolerance):
    """A check table row: per compared quantity the slices' rms ratio and the whole tensors'
    norm ratio less one, ok where all are within tolerance."""
    import torch

    row = dict(tokens=T, gates=gates, comparison=comparison)
    for name in COMPARED:
        a, b = got["slices"][name], ref["slices"][name]
        if a is None or b is None or a.shape != b.shape:
            row[name] = math.nan
        else:
            a, b = a.double(), b.double()
            row[name] = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300))
        row[f"{name}_norm"] = abs(got["norms"][name] / ref["norms"][name] - 1) if ref["norms"][name] else math.nan
    failed = [n for n in COMPARED if not (row[n] <= tolerance[n] and row[f"{n}_norm"] <= tolerance[n])]  # NaN fails
    row["check"] = "FAILED: " + ", ".join(failed) if failed else "ok"
    print(f"   check T={T} {gates} {comparison}: "
          + ", ".join(f"{n} {row[n]:.2e} / {row[f'{n}_norm']:.2e}" for n in COMPARED) + f" -> {row['check']}",
          flush=True)
    return row


SIDE_NAMES = {"fla": "fla chunk_kda", "plain": "ours plain (segments=None)",
              "ops": "ours k3compile.ops.chunk_kda (windowed backward)"}
TIMING_COLUMNS = [("tokens", "T"), ("gates", "gates"), ("side", "side"), ("P", "segments P"), ("fwd_ms", "fwd ms"),
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
    slow = [f"T={r['tokens']} {r['gates']} {r['side']} {r['first_call_s']:.0f} s" for r in rows
            if r.get("first_call_s", 0) > FIRST_CALL_SLOW_S]
    if slow:
        lines += ["", f"Slow first calls (compiles, fla's autotuning; not in the timings): {'; '.join(slow)}."]
    if len(args.tokens_list) > 1:
        longest = []
        for pairing in args.gates:
            for side in dict.fromkeys(r["side"] for r in rows if r["gates"] == pairing):
                ran = [r["tokens"] for r in rows if r["gates"] == pairing and r["side"] == side and "error" not in r]
                oom = [r["tokens"] for r in rows if r["gates"] == pairing and r["side"] == side
                       and r.get("error", "").startswith("OOM")]
                longest.append(f"{pairing} {side}: {max(ran) if ran else 'none'}"
                               + (f" (OOM at {min(oom)})" if oom else ""))
        lines += ["", f"Longest length run per side: {'; '.join(longest)}."]
    lines += ["", f"Checks: ||got - ref|| / ||ref|| of the saved slices (o and the gradients of q, k, v, g, beta: "
                  f"the first and the last {SLICE_TOKENS} tokens, all where T <= {2 * SLICE_TOKENS}, of the first "
                  f"{SLICE_HEADS} heads; the final state and h0's gradient: the first {SLICE_HEADS} heads) / "
                  "| ||got|| / ||ref|| - 1 | of the whole tensors", "",
              "| T | gates | comparison | " + " | ".join(COMPARED) + " | check |", "|" + "---|" * (len(COMPARED) + 4)]
    lines += ["| " + " | ".join([str(r["tokens"]), r["gates"], r["comparison"],
                                 *(f"{r[n]:.2e} / {r[f'{n}_norm']:.2e}" for n in COMPARED), r["check"]]) + " |"
              for r in checks]
    text = "\n".join(lines) + "\n"
    (out / "million_tokens.md").write_text(text)
    return text


def main(argv=None):
    args = parse_args(argv)
    if args.side is not None:
        return side_main(args)
    on_cpu = args.smoke
    if on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # the sides' processes inherit these
        os.environ["K3C_POISON_OUTPUTS"] = "1"
    import torch  # never on the GPU here: the sides' slices, compared on the host

    from backward_gpu import TOLERANCE as FLOAT64_TOLERANCE  # fla's tolerances of float64 autograd
    from chunk_gpu import TOLERANCE as OUTPUT_TOLERANCE  # o and final state against an fp32 token loop

    if not on_cpu and not torch.cuda.is_available():  # the runtime's device count, no context
        sys.exit("no CUDA device; use --smoke for a CPU smoke test")
    H, K = args.heads, args.dim
    precision = "fp32" if on_cpu else "bf16"
    # each side within its tolerance of the truth: the two within the sum; auto vs plain: one compiler,
    # two schedules, each within the tolerance of the output
    vs_fla = {"o": 2 * OUTPUT_TOLERANCE[precision], "final_state": 2 * OUTPUT_TOLERANCE[precision],
              **{n: 2 * FLOAT64_TOLERANCE[n] for n in GRADIENTS}}
    vs_plain = {n: OUTPUT_TOLERANCE[precision] if on_cpu else 2 * OUTPUT_TOLERANCE[precision] for n in COMPARED}
    run_fla = not args.no_fla and not on_cpu
    meta = dict(
        device=None, gpu_memory_gib=None, torch=torch.__version__, triton=None, k3compile=None, fla=None,
        fla_note="disabled (--no-fla)" if args.no_fla else "not on the CPU (--smoke)" if on_cpu else None,
        git_commit=git_commit(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        command=" ".join(["python3", *sys.argv]),
        shape=f"B1 T{'/'.join(map(str, args.tokens_list))} H{H} HV{H} K{K} V{K}, {precision} q k v beta and o, "
              "fp32 g and states",
        inputs="q, k = randn (L2-normalised in the kernel, both sides), v = randn, beta = sigmoid(randn), "
               f"g = logsigmoid(randn) (bounded: clamped at -5), h0 = 0.1 randn; cotangents randn; seed {args.seed}",
        processes="each side of each pairing and length in a fresh Python process of its own (this script --side), "
                  "the same inputs drawn from the seed on the device; the parent never touches the GPU",
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
        first_call="wall time of the first fwd+bwd of each side (ours: Triton compiles or Triton's disk cache; fla: "
                   "its autotuning, a minute or two per new shape unless Triton's autotune cache holds it); not in "
                   "the timings",
        tolerances=f"vs fla: {vs_fla}; auto vs plain: {vs_plain}",
    )
    rows, checks, started = [], [], time.perf_counter()
    oom_at = {}  # (pairing, side) -> the length it ran out of memory at
    print(f"== {meta['shape']}; lengths {args.tokens_list}, gates {args.gates}, fla {'on' if run_fla else 'off'}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="million_tokens_") as scratch:
        for T in args.tokens_list:
            for pairing in args.gates:
                sides = ["auto", "plain", "ops", *(["fla"] if run_fla else [])]
                pairing_rows, saved = {}, {}
                for side in sides:
                    name = SIDE_NAMES.get(side, f"ours segments={args.segments}")
                    row = pairing_rows[side] = dict(tokens=T, gates=pairing, side=name, P="-")
                    rows.append(row)
                    if (pairing, side) in oom_at:
                        row["error"] = f"not run (OOM at T={oom_at[pairing, side]})"
                    elif side == "fla" and not run_fla:
                        row["error"] = f"not run (fla: {meta['fla_note']})"
                    else:
                        print(f"== T={T} gates {pairing}: {name}", flush=True)
                        got, side_meta, slices = run_side(args, side, pairing, T, Path(scratch))
                        row.update(got)
                        for k_, v_ in side_meta.items():
                            if k_ == "module":
                                meta.setdefault("modules", {})[pairing] = v_
                            elif meta.get(k_) is None:
                                meta[k_] = v_
                        if "inputs_gib" in row:
                            meta.setdefault("inputs_gib", {})[T] = row.pop("inputs_gib")
                        if slices is not None:
                            saved[side] = slices
                        if row.get("error", "").startswith("OOM"):
                            oom_at[pairing, side] = T
                        if side == "fla" and side_meta.get("fla") is None and "fla_note" in side_meta:
                            run_fla = False  # not importable: the same in every later process
                    slow = row.get("first_call_s", 0) > FIRST_CALL_SLOW_S
                    print(f"   {name}: " + ", ".join(f"{k} {fmt(row.get(k), 3)}" for k in (
                              "fwd_ms", "fwdbwd_ms", "peak_mib", "first_call_s") if k in row)
                          + (" (first call slow: compiles / autotuning, not in the timings)" if slow else "")
                          + (f"; {row['error']}" if "error" in row else ""), flush=True)
                    report(args, meta, rows, checks)
                if "auto" in saved and "plain" in saved:
                    checks.append(check_row(T, pairing, f"ours segments={args.segments} vs ours plain",
                                            saved["auto"], saved["plain"], vs_plain))
                if "ops" in saved and "plain" in saved:
                    checks.append(check_row(T, pairing, "ours k3compile.ops vs ours plain", saved["ops"], saved["plain"],
                                            vs_plain))
                for side in ("auto", "plain", "ops"):
                    if side in saved and "fla" in saved:
                        checks.append(check_row(T, pairing, f"{pairing_rows[side]['side'].split(' (')[0]} vs fla",
                                                saved[side], saved["fla"], vs_fla))
                fla_row = pairing_rows.get("fla")
                for side in ("auto", "plain", "ops"):
                    ours_row = pairing_rows[side]
                    if fla_row is None:
                        continue
                    for key_, measure_ in (("fwd", "fwd_ms"), ("fwdbwd", "fwdbwd_ms"), ("peak", "peak_mib")):
                        if measure_ in fla_row and measure_ in ours_row:
                            ours_row[f"fla_over_ours_{key_}"] = fla_row[measure_] / ours_row[measure_]
                report(args, meta, rows, checks)
    meta["wall_s"] = time.perf_counter() - started
    print(report(args, meta, rows, checks))
    return 1 if any(c["check"] != "ok" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
