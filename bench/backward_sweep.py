"""Sweep the backward schedule's choices on the GPU in one run: compile one layer with several
derive-backward / lower-backward options, check each one's gradients against float64 autograd of
the reference semantics at a short length (bf16 inputs, fla's tolerances), then time its chunk_backward entry at the training
shape with per-kernel times and peak memory, next to fla-core's backward on the same inputs.

    python3 -P bench/backward_sweep.py --out DIR [--member kda] [--pairings bounded,unbounded]
        [--batch 4 --tokens 4096 --heads 32] [--backward 'derive-backward{chunk-size=64}|lower-backward;...']

A variant is `<derive-backward options>|<lower-backward options>`, optionally `|<passes run
after the default pipeline>` (e.g. `derive-backward|lower-backward|overlap-launches`); the rest of
the pipeline is the default one. The Triton compiles (a minute or two for a gradients kernel) run first, all
variants side by side in worker processes; the checks and timings after them, one at a time.
Writes DIR/backward_sweep.md and DIR/backward_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backward_gpu import TOLERANCE, rms_ratio  # noqa: E402
from common import kernel_times  # noqa: E402

VARIANTS = [
    "derive-backward|lower-backward",
    "derive-backward{chunk-size=32}|lower-backward",
    "derive-backward{chunk-size=64}|lower-backward",
    "derive-backward|lower-backward{num-warps=2}",
]
# the members whose fla call takes the same inputs (fla's chunk_gla has no in-kernel l2norm)
KINDS = {"kda": "kda", "gdn": "gated_deltanet", "deltanet": "deltanet"}
CHECK_TOKENS = 333  # the float64 check's length: odd, several chunks of every size swept
GRADIENTS = ("q", "k", "v", "g", "beta", "h0")


def layer_table(member: str, pairing: str, heads: int) -> dict:
    table = {"name": f"{member}_{pairing}", "kind": KINDS[member], "num_heads": heads, "head_k_dim": 128,
             "head_v_dim": 128, "qk_l2norm": True}
    if member == "kda" and pairing == "bounded":
        table.update(gate_input="clamped", gate_lower_bound=-5.0)
    return table


def pipeline_of(variant: str) -> str:
    from k3compile.pipeline import RECURRENCE_PIPELINE

    derive, lower, *after = variant.split("|")
    return ",".join([RECURRENCE_PIPELINE.replace("derive-backward", derive).replace("lower-backward", lower), *after])


def compiled(member: str, pairing: str, heads: int, variant: str, root: Path):
    import k3compile
    from k3compile.spec import spec_from_table

    spec = spec_from_table(layer_table(member, pairing, heads))
    name = "".join(c if c.isalnum() else "_" for c in variant)
    return k3compile.compile(spec, out_dir=root / f"{member}_{pairing}_{name}", pipeline=pipeline_of(variant))


def inputs(member: str, pairing: str, B: int, T: int, H: int, dtype, seed: int = 0) -> dict:
    """The entry's tensors: q, k, v, g, beta, initial_state, do, dht (gates clamped at -5 when bounded)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    x = {"q": randn(B, T, H, 128).to(dtype), "k": randn(B, T, H, 128).to(dtype), "v": randn(B, T, H, 128).to(dtype)}
    if member != "deltanet":
        g = torch.nn.functional.logsigmoid(randn(B, T, H, 128) if member == "kda" else randn(B, T, H))
        x["g"] = (g.clamp(min=-5.0) if pairing == "bounded" else g).float()
    x["beta"] = torch.rand(B, T, H, device="cuda", generator=gen).to(dtype)
    x["initial_state"] = 0.1 * randn(B, H, 128, 128)
    x["do"], x["dht"] = randn(B, T, H, 128).to(dtype), randn(B, H, 128, 128)
    return x


def run_backward(layer, x: dict) -> dict:
    *grads, dh0 = layer.chunk_backward(x["q"], x["k"], x["v"], x.get("g"), x["beta"], initial_state=x["initial_state"],
                                       do=x["do"], dht=x["dht"], output_dh0=True)
    names = [n for n in ("q", "k", "v", "g", "beta") if x.get(n) is not None]
    return {**dict(zip(names, grads)), "h0": dh0}


def reference_gradients(spec, x: dict) -> dict:
    """float64 autograd of the reference semantics of the spec's op."""
    from k3compile.frontend import spec_to_module
    from k3compile.ir import reference

    op = next(iter(spec_to_module(spec).ops))
    leaves = {n: t.detach().double().requires_grad_() for n, t in x.items()
              if t is not None and n not in ("do", "dht")}
    o, ht = reference.recurrence(op, leaves["q"], leaves["k"], leaves["v"], leaves.get("g"), leaves.get("beta"),
                                 initial_state=leaves["initial_state"], output_final_state=True)
    device = x["do"].device  # the reference runs where it runs (the CPU); the loss where the cotangents are
    ((o.to(device) * x["do"].double()).sum() + (ht.to(device) * x["dht"].double()).sum()).backward()
    return {("h0" if n == "initial_state" else n): t.grad for n, t in leaves.items()}


def warm(job) -> str:
    """One variant's first launches at the check shape (same constexprs as the timed shape): the
    Triton compiles, into the shared cache."""
    member, pairing, heads, variant, root = job
    # synchronous launches (this worker only times nothing): a fault names the kernel that made it
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    try:
        layer = compiled(member, pairing, heads, variant, Path(root))
        x = inputs(member, pairing, 1, 64, heads, torch.bfloat16)
        layer.chunk(x["q"], x["k"], x["v"], x.get("g"), x["beta"], initial_state=x["initial_state"], output_final_state=True)
        run_backward(layer, x)
        torch.cuda.synchronize()
        return "ok"
    except Exception:
        return traceback.format_exc(limit=-3)[-600:]  # the innermost frames: the launch that failed


def kernel_resources(module) -> dict[str, str]:
    """Registers and spilled bytes per thread of each backward kernel the module launched (what
    ptxas gave the Triton compile: a [K, V] tile too many shows as spills)."""
    found = {}
    for name in dir(module):
        if name.endswith("_kernel") and "backward" in name:
            for cache in getattr(getattr(module, name), "device_caches", {}).values():
                for compiled in cache[0].values():
                    compiled._init_handles()
                    found[name.split("backward_")[-1].removesuffix("_kernel")] = f"{compiled.n_regs}r/{compiled.n_spills}s"
    return found


def peak_mib(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure_variant(member, pairing, heads, variant, root, B, T) -> dict:
    from triton.testing import do_bench

    layer = compiled(member, pairing, heads, variant, root)
    row = {"member": member, "gates": pairing, "variant": variant}
    small = inputs(member, pairing, 1, CHECK_TOKENS, heads, torch.bfloat16, seed=1)
    got, want = run_backward(layer, small), reference_gradients(layer.spec, small)
    row["check"] = {n: rms_ratio(got[n], want[n]) for n in got}
    row["passed"] = all(ratio <= TOLERANCE[n] for n, ratio in row["check"].items())
    x = inputs(member, pairing, B, T, heads, torch.bfloat16)
    backward = lambda: run_backward(layer, x)  # noqa: E731
    row["grads"] = {n: t.float() for n, t in backward().items()}
    row["bwd_ms"] = do_bench(backward, rep=300)
    row["fwd_ms"] = do_bench(lambda: layer.chunk(x["q"], x["k"], x["v"], x.get("g"), x["beta"],
                                                 initial_state=x["initial_state"], output_final_state=True), rep=200)
    row["bwd_peak_mib"] = peak_mib(backward)

    def training():  # what autograd runs: the forward (nothing saved but the inputs), then the backward
        layer.chunk(x["q"], x["k"], x["v"], x.get("g"), x["beta"], initial_state=x["initial_state"], output_final_state=True)
        return backward()

    row["fwdbwd_peak_mib"] = peak_mib(training)
    row["kernels"] = kernel_times(torch, backward, short=lambda n: n.removesuffix("_kernel")[:48])
    row["resources"] = kernel_resources(layer.module)
    row["roof_ms"] = roofs(layer.spec, pipeline_of(variant), B, T)
    return row


def roofs(spec, pipeline: str, B: int, T: int) -> dict[str, float]:
    """Each backward kernel's roofline time at this shape on this GPU's measured ceilings (k3c cost)."""
    from k3compile.checking.cost import CEILINGS, entry_costs
    from k3compile.driver import schedule_for_triton

    ceiling = CEILINGS["h200" if "H200" in torch.cuda.get_device_name() else "h100"]
    module = schedule_for_triton(spec, pipeline, verify="off").scheduled
    return {c.kernel: c.roof_seconds(ceiling) * 1e3 for c in entry_costs(module, "chunk_backward", B, T)}


def fla_training(member: str, pairing: str, x: dict):
    """fla-core's call on the entry's tensors with the same gate semantics: (forward, forward +
    backward, the leaves whose .grad the backward fills)."""
    import fla.ops

    function = {"kda": fla.ops.kda.chunk_kda, "gdn": fla.ops.gated_delta_rule.chunk_gated_delta_rule,
                "deltanet": fla.ops.delta_rule.chunk_delta_rule}[member]
    leaves = {n: x[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "g", "beta", "initial_state")
              if x.get(n) is not None}
    kwargs = {"use_qk_l2norm_in_kernel": True}
    if pairing == "bounded" and member == "kda":
        kwargs.update(safe_gate=True, lower_bound=-5.0)
    positional = [leaves[n] for n in ("q", "k", "v", "g", "beta") if n in leaves]

    def forward():
        return function(*positional, initial_state=leaves["initial_state"], output_final_state=True, **kwargs)

    def training():
        o, ht = forward()
        torch.autograd.backward([o, ht], [x["do"], x["dht"]])

    return forward, training, leaves


def fla_gradients(member: str, pairing: str, x: dict) -> dict:
    _, training, leaves = fla_training(member, pairing, x)
    training()
    return {("h0" if n == "initial_state" else n): t.grad.float() for n, t in leaves.items()}


def fla_row(member, pairing, B, T, heads) -> dict:
    """fla-core's forward and forward + backward at the timed shape."""
    from triton.testing import do_bench

    x = inputs(member, pairing, B, T, heads, torch.bfloat16)
    forward, training, leaves = fla_training(member, pairing, x)
    grads = fla_gradients(member, pairing, x)
    with torch.no_grad():
        fwd_ms = do_bench(forward, rep=200)
    fwdbwd_ms = do_bench(training, grad_to_none=list(leaves.values()), rep=300)
    return {"member": member, "gates": pairing, "variant": "fla-core", "fwd_ms": fwd_ms, "bwd_ms": fwdbwd_ms - fwd_ms,
            "fwdbwd_peak_mib": peak_mib(training), "kernels": kernel_times(torch, training, short=lambda n: n.removesuffix("_kernel")[:48]), "grads": grads}


def long_check(layer, member: str, pairing: str, T: int, heads: int) -> dict:
    """At the timed length (B1): ours and fla's bf16 gradients of two heads against float64
    autograd of the reference on those heads (heads are independent; all of them in float64
    would not fit)."""
    x = inputs(member, pairing, 1, T, heads, torch.bfloat16, seed=2)
    ours, theirs = run_backward(layer, x), fla_gradients(member, pairing, x)
    two = {n: (t[:, :2] if n in ("initial_state", "dht") else t[:, :, :2]) if t is not None else None for n, t in x.items()}
    from k3compile.spec import spec_from_table

    want = reference_gradients(spec_from_table(layer_table(member, pairing, 2)), two)
    head = lambda n, t: t[:, :2] if n == "h0" else t[:, :, :2]  # noqa: E731
    return {side: {n: rms_ratio(head(n, grads[n]), want[n]) for n in want}
            for side, grads in (("ours", ours), ("fla", theirs))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--member", default="kda", choices=KINDS)
    parser.add_argument("--pairings", default="bounded,unbounded")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--backward", default=";".join(VARIANTS), help="';'-separated variants")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--phase", default="all", choices=("all", "compile", "measure"),
                        help="compile: only the Triton compiles (side by side); measure: only the checks and "
                             "timings, the compiles cached (another process may use the GPU meanwhile for compile)")
    parser.add_argument("--no-fla", action="store_true", help="ours only: no fla row (its autotuning takes minutes)")
    parser.add_argument("--long-check", action="store_true",
                        help="also check ours and fla's gradients against float64 at the timed length (two heads)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = out / "generated"
    variants = args.backward.split(";")
    pairings = args.pairings.split(",")
    jobs = [(args.member, p, args.heads, v, str(root)) for p in pairings for v in variants]
    if args.phase == "measure":
        warmed = dict.fromkeys(jobs, "ok")
    else:
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
            warmed = dict(zip(jobs, pool.map(warm, jobs)))
        failed = {job[1:4:2]: result for job, result in warmed.items() if result != "ok"}
        print("compiled:", "all" if not failed else failed, flush=True)
        if args.phase == "compile":
            return 1 if failed else 0
    rows = []
    for pairing in pairings:
        # ours first, fla after (its autotuning may take minutes: a run cut short keeps ours' rows)
        baseline, ours_grads = None, {}
        for variant in variants:
            job = (args.member, pairing, args.heads, variant, str(root))
            if warmed[job] != "ok":
                rows.append({"member": args.member, "gates": pairing, "variant": variant, "error": warmed[job]})
                print(rows[-1], flush=True)
                continue
            try:
                row = measure_variant(args.member, pairing, args.heads, variant, root, args.batch, args.tokens)
            except Exception:
                row = {"member": args.member, "gates": pairing, "variant": variant, "error": traceback.format_exc(limit=3)[-400:]}
                rows.append(row)
                print(row, flush=True)
                continue
            grads = {n: g.cpu() for n, g in row.pop("grads").items()}
            baseline = baseline or grads
            row["vs_first_variant"] = {n: rms_ratio(grads[n], baseline[n].double()) for n in grads}
            ours_grads[id(row)] = grads
            rows.append(row)
            print({k: v for k, v in row.items() if k != "kernels"}, flush=True)
            write_table(out, args, rows)  # a cut run keeps them
        try:
            if args.no_fla:
                raise RuntimeError("not run (--no-fla)")
            fla = fla_row(args.member, pairing, args.batch, args.tokens, args.heads)
        except Exception:  # fla refuses some members on some GPUs: the row says so, ours still run
            fla = {"member": args.member, "gates": pairing, "variant": "fla-core", "grads": {},
                   "error": traceback.format_exc(limit=3)[-400:]}
        fla_grads = {n: g.cpu() for n, g in fla.pop("grads").items()}
        for row in rows:
            if id(row) in ours_grads:
                grads = ours_grads.pop(id(row))
                row["vs_fla"] = {n: rms_ratio(grads[n], fla_grads[n].double()) for n in grads if n in fla_grads}
        if args.long_check and "error" not in fla and variants[0] in {r["variant"] for r in rows if "error" not in r}:
            first = next(r for r in rows if r["variant"] == variants[0] and r["gates"] == pairing)
            first["long_check"] = long_check(compiled(args.member, pairing, args.heads, variants[0], root),
                                             args.member, pairing, args.tokens, args.heads)
        rows.append(fla)
        print(fla, flush=True)
        write_table(out, args, rows)
    return 0 if all(r.get("passed", True) and "error" not in r for r in rows) else 1


def write_table(out: Path, args, rows: list[dict]) -> None:
    """DIR/backward_sweep.json and .md of the rows so far."""
    (out / "backward_sweep.json").write_text(json.dumps(rows, indent=1, default=str))
    header = ("| gates | variant | bf16 check T333 (largest RMS ratio vs float64) | fwd ms | bwd ms | fwd+bwd ms "
              "| fwd+bwd peak MiB | kernels of the backward (ms) | grad RMS vs fla (bf16, T) |")
    text = [f"# Backward sweep: {args.member}, B{args.batch} T{args.tokens} H{args.heads} K=V=128, bf16 "
            f"({torch.cuda.get_device_name()}, torch {torch.__version__})", "", header, "|" + "---|" * 9]
    for r in rows:
        if "error" in r:
            text.append(f"| {r['gates']} | {r['variant'].replace('|', ' + ')} | error: {r['error'].strip().splitlines()[-1]} |" + " |" * 6)
            continue
        check = "-" if "check" not in r else (f"{max(r['check'].values()):.1e} "
                                              f"({'pass' if r['passed'] else 'FAIL'})")
        roof = r.get("roof_ms", {})
        kernels = ", ".join(f"{n.split('backward_')[-1]} {t:.3f}" + (f" ({roof[n] / t:.0%} of roof)" if roof.get(n) else "")
                            for n, t in list(r["kernels"].items())[:8])
        if r.get("resources"):
            kernels += " (registers/spills: " + ", ".join(f"{n} {v}" for n, v in r["resources"].items()) + ")"
        vs_fla = ", ".join(f"d{n} {v:.1e}" for n, v in r.get("vs_fla", {}).items())
        text.append(f"| {r['gates']} | {r['variant'].replace('|', ' + ')} | {check} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} "
                    f"| {r['fwd_ms'] + r['bwd_ms']:.3f} | {r['fwdbwd_peak_mib']:.0f} | {kernels} | {vs_fla} |")
    for r in rows:
        if "long_check" in r:
            text += ["", f"{r['gates']}: B1 T{args.tokens}, two heads, RMS ratio vs float64 autograd of the reference:",
                     "", "| side | " + " | ".join(f"d{n}" for n in r["long_check"]["ours"]) + " |",
                     "|---|" + "---|" * len(r["long_check"]["ours"])]
            text += [f"| {side} | " + " | ".join(f"{v:.1e}" for v in ratios.values()) + " |"
                     for side, ratios in r["long_check"].items()]
    (out / "backward_sweep.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    sys.exit(main())
