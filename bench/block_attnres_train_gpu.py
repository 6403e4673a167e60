"""Block AttnRes in training on the GPU: the two phases' forward and forward + backward
(derive-block-attnres, derive-block-attnres-backward; docs/attnres.md), through
k3compile.ops.attnres's differentiable custom ops, at T = 8192 token rows and n completed blocks.

(a) D = 8192, 16 queries a block (a power of two in both, which flash-attn-res's kernels need):
    phase 1 (attnres_block_partials: the block's 16 queries over n representatives) and phase 2
    (attnres_block_merge: one query's partials merged with the partial sum), each forward and
    forward + backward, ours against flash-attn-res 0.1.12 (`import flash_attn_res`, a comparison
    oracle only: its phase_1_batched_attention_triton_op and phase_2_online_softmax_merge_triton_op,
    which have no RMSNorm gain, so ours runs with gains of 1 there: the same function). Each time
    is also given as a fraction of a same-size copy's: the bytes the op must move (its inputs read
    and outputs written once, the backward's saved tensors, cotangents and gradients likewise)
    against a torch clone moving as many bytes, timed in the same run.
(b) D = 7168 (K3's), 12 queries a block: per block the two phases together (1 block_partials
    call + 12 merges) against the one-phase aggregate (12 attnres_aggregate calls over the n
    representatives and the partial sum, stacked once outside the timing), forward and
    forward + backward (the loss sum_j <dh_j, h_j>, random dh_j).
(c) phase 1's backward alone at both of those configurations: the `block_partials_backward`
    entry of derive-block-attnres-backward{partials-backward=columns} (a fold kernel, a program
    per group of rows with all the queries, its products on the tensor cores: each
    representative row read twice there and its gradient written once; then the queries'
    cotangents over parts of the rows, the representatives read a third time) against
    partials-backward=query-blocks (the default: each block of queries re-reads the
    representatives and adds their gradient by atomics), each layer compiled here with its
    pipeline; bytes per token row from block_attnres_backward_bytes (the rows the kernels' loads
    and stores name), and a same-size copy's time over each form's.
(d) phase 1's forward alone at both configurations: the `block_partials` entry of
    derive-block-attnres{partials-schedule=columns} (a fold kernel, then a program per group of
    rows with all queries: two sweeps over the columns, products on the tensor cores) against
    partials-schedule=query-blocks (the default: a program per row and block of queries, the online softmax),
    each layer compiled here with its pipeline; bytes: the representatives read once, the
    partials written once, and a same-size copy's time over each form's.

Before timing every output and gradient is checked against float32 torch autograd of the
definition on the first CHECK_ROWS token rows (the same ops called on those rows), RMS ratio
below TOLERANCE; a failed check leaves its row untimed and the script exits 1.

    PYTHONPATH=/tmp/site python3 -P bench/block_attnres_train_gpu.py --out DIR [--tokens 8192] [--representatives 1,2,4,8]
    python3 bench/block_attnres_train_gpu.py --out DIR --smoke     # CPU: Triton's interpreter, tiny sizes, fp32

Writes DIR/block_attnres_train.md (also printed) and DIR/block_attnres_train.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import fmt, git_commit, ints  # noqa: E402

from k3compile.passes.derive_block_attnres import PARTIALS_SCHEDULES  # noqa: E402
from k3compile.passes.derive_block_attnres_backward import PARTIALS_BACKWARD, block_attnres_backward_bytes  # noqa: E402

EPS = 1e-6
CHECK_ROWS = 256
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}  # RMS ratio against float32 torch


def rms_ratio(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


# --- float32 torch definitions (the check) ------------------------------------------------------


def reference_partials(torch, representatives, queries, gains):
    x = representatives.float()
    keys = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    scores = torch.einsum("nbtd,qd->qbtn", keys, queries.float() * gains.float())
    return torch.logsumexp(scores, -1), torch.einsum("qbtn,nbtd->qbtd", torch.softmax(scores, -1), x)


def reference_merge(torch, partial_sum, query, gain, block_lse, block_mix):
    x = partial_sum.float()
    score = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)) @ (query.float() * gain.float())
    lse = torch.logaddexp(block_lse.float(), score)
    return torch.exp(block_lse - lse)[..., None] * block_mix.float() + torch.exp(score - lse)[..., None] * x


def reference_aggregate(torch, sources, query, gain):
    x = sources.float()
    keys = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gain.float()
    return (torch.softmax(keys @ query.float(), 0)[..., None] * x).sum(0)


def outputs_and_grads(torch, fn, inputs, cotangents):
    """fn's outputs on leaves made of `inputs`, and the leaves' gradients of sum <cotangent, output>."""
    leaves = [x.detach().contiguous().clone().requires_grad_() for x in inputs]  # the kernels take dense rows
    outputs = fn(*leaves)
    torch.autograd.backward(list(outputs), [c.to(o.dtype) for c, o in zip(cotangents, outputs, strict=True)])
    return [o.detach() for o in outputs], [x.grad for x in leaves]


def check(torch, name, ours, reference, inputs, cotangents, tolerance) -> dict[str, float]:
    """RMS ratios of ours' outputs and gradients against the float32 definition's."""
    got_out, got_grads = outputs_and_grads(torch, ours, inputs, cotangents)
    want_out, want_grads = outputs_and_grads(torch, reference, [x.float() for x in inputs], cotangents)
    errors = {f"{name} out{i}": rms_ratio(g, w) for i, (g, w) in enumerate(zip(got_out, want_out, strict=True))}
    errors.update({f"{name} d{i}": rms_ratio(g, w) for i, (g, w) in enumerate(zip(got_grads, want_grads, strict=True))
                   if w is not None and g is not None})
    bad = {k: v for k, v in errors.items() if not v <= tolerance}
    if bad:
        print(f"CHECK FAILED {name}: {bad}", flush=True)
    return errors


# phase 1's forms, by the stage they choose: the forms and the pipeline that compiles one
PHASE1_FORMS = {
    "forward": (PARTIALS_SCHEDULES, "derive-block-attnres{{partials-schedule={form}}},derive-block-attnres-backward"),
    "backward": (PARTIALS_BACKWARD, "derive-block-attnres,derive-block-attnres-backward{{partials-backward={form}}}"),
}


def phase1_layers(hidden_size: int, out_dir: Path, stage: str) -> dict:
    """The layer of width hidden_size compiled once per form of phase 1's `stage` (forward:
    derive-block-attnres's partials-schedule; backward: derive-block-attnres-backward's
    partials-backward), by form."""
    from k3compile.driver import compile as compile_layer
    from k3compile.ops.attnres import AttnResKey, NUM_BLOCKS
    from k3compile.spec import spec_from_table

    forms, passes = PHASE1_FORMS[stage]
    layers = {}
    for form in forms:
        name = f"bench_attnres_{stage}_{form.replace('-', '_')}"
        table = AttnResKey(hidden_size, EPS, NUM_BLOCKS).table() | {"name": name}
        pipeline = f"fuse-attnres,derive-attnres-backward,{passes.format(form=form)},outline-kernels"
        folder = out_dir / f"d{hidden_size}_{stage}_{form}"
        folder.mkdir(parents=True, exist_ok=True)
        layers[form] = compile_layer(spec_from_table(table, source="<bench>"), out_dir=folder, pipeline=pipeline)
    return layers


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=8192, help="token rows per call, B = 1 (default 8192)")
    p.add_argument("--representatives", default="1,2,4,8", help="completed blocks n (comma-separated)")
    p.add_argument("--peer-hidden", type=int, default=8192, help="(a)'s D (default 8192)")
    p.add_argument("--peer-queries", type=int, default=16, help="(a)'s queries a block (default 16)")
    p.add_argument("--hidden", type=int, default=7168, help="(b)'s D (default 7168: K3's)")
    p.add_argument("--queries", type=int, default=12, help="(b)'s queries a block (default 12)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(TOLERANCE))
    p.add_argument("--parts", default="a,b,c,d", help="which comparisons: any of a, b, c, d (default all)")
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench rep, ms")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: interpreter, fp32, T 5, D 32/24, Q 4/3, n 1,2")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        args.tokens, args.representatives, args.dtype = 5, "1,2", "float32"
        args.peer_hidden, args.peer_queries, args.hidden, args.queries = 32, 4, 24, 3
    import torch
    import triton
    import triton.testing

    from k3compile.ops.attnres import attnres_aggregate, attnres_block_merge, attnres_block_partials

    try:
        if args.smoke:
            raise ImportError("not run in the CPU smoke run")
        import flash_attn_res
        peer, peer_note = flash_attn_res, f"flash-attn-res {getattr(flash_attn_res, '__version__', '0.1.12?')}"
    except Exception as error:  # noqa: BLE001 - absent, or not importable (0.1.12's autotune keys fail on triton 3.9)
        peer, peer_note = None, f"flash-attn-res not run ({type(error).__name__}: {error}): its columns are empty"
    device = "cpu" if args.smoke else "cuda"
    dtype = getattr(torch, args.dtype)
    size = dtype.itemsize
    T, tolerance = args.tokens, TOLERANCE[args.dtype]
    rows = min(T, CHECK_ROWS)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, device=device)).to(dtype)

    def bench(fn) -> float:
        if args.smoke:  # the interpreter: one call's wall time, a smoke figure only
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

    def copy_ms(nbytes: float) -> float:
        """A torch clone moving nbytes (reading and writing nbytes / 2)."""
        buffer = torch.empty(max(1, int(nbytes // 2)), dtype=torch.uint8, device=device)
        return bench(lambda: buffer.clone())

    def train(fn, inputs, cotangents):
        """A forward + backward step: fn on leaves, then the backward of sum <cotangent, output>."""
        def step():
            leaves = [x.requires_grad_() for x in (t.detach() for t in inputs)]
            outputs = fn(*leaves)
            torch.autograd.backward(list(outputs), list(cotangents))
        return step

    results, failed = [], False
    started = time.perf_counter()

    def progress(part: str, D: int, n: int) -> None:
        """A line before each row's first calls (compiles, autotuning): a run cut short shows where."""
        print(f"({part}) D={D} n={n}: starting at {time.perf_counter() - started:.0f} s", flush=True)

    # (a) the phases one at a time, ours against flash-attn-res, and against a copy
    if "a" in args.parts:
        D, Q = args.peer_hidden, args.peer_queries
        ones = torch.ones(Q, D, device=device, dtype=dtype)
        queries = randn(Q, D, scale=2 / D ** 0.5)
        partial_sum = randn(1, T, D)
        for n in ints(args.representatives):
            progress("a", D, n)
            representatives = randn(n, 1, T, D)
            dlse, dmix = torch.randn(Q, 1, T, device=device), randn(Q, 1, T, D)
            dout = randn(1, T, D)
            ours_p1 = lambda r, q: attnres_block_partials(r, q, ones, eps=EPS)  # noqa: E731
            ref_p1 = lambda r, q: reference_partials(torch, r, q, ones)  # noqa: E731
            errors = check(torch, "ours phase 1", ours_p1, ref_p1, [representatives[:, :, :rows], queries],
                           [dlse[:, :, :rows], dmix[:, :, :rows]], tolerance)
            with torch.no_grad():
                block_lse, block_mix = attnres_block_partials(representatives, queries, ones, eps=EPS)
            lse0, mix0 = block_lse[0].contiguous(), block_mix[0].contiguous()
            ours_p2 = lambda x, q, lse, mix: (attnres_block_merge((lse, mix), x, q, ones[0], eps=EPS),)  # noqa: E731
            ref_p2 = lambda x, q, lse, mix: (reference_merge(torch, x, q, ones[0], lse, mix),)  # noqa: E731
            p2_inputs = [partial_sum[:, :rows], queries[0], lse0[:, :rows], mix0[:, :rows]]
            errors |= check(torch, "ours phase 2", ours_p2, ref_p2, p2_inputs, [dout[:, :rows]], tolerance)
            peer_p1 = peer_p2 = None
            if peer is not None:
                def peer_p1(r, q):
                    mix, lse = peer.phase_1_batched_attention_triton_op(r, q, EPS)
                    return lse, mix

                def peer_p2(x, q, lse, mix):
                    return (peer.phase_2_online_softmax_merge_triton_op(x, q, mix, lse, EPS),)

                errors |= check(torch, "peer phase 1", peer_p1, ref_p1, [representatives[:, :, :rows], queries],
                                [dlse[:, :, :rows], dmix[:, :, :rows]], tolerance)
                errors |= check(torch, "peer phase 2", peer_p2, ref_p2, p2_inputs, [dout[:, :rows]], tolerance)
            ok = all(e <= tolerance for e in errors.values())
            failed |= not ok
            # bytes each must move: inputs read and outputs written once (the weights left out)
            p1_fwd = n * T * D * size + Q * T * (D * size + 4)
            p1_bwd = n * T * D * size + 2 * Q * T * (D * size + 4) + n * T * D * size  # + reps' gradient
            p2_fwd = 2 * T * D * size + T * 4 + T * D * size
            p2_bwd = 3 * T * D * size + T * 4 + 2 * T * D * size + T * 4  # x, mix, dh, lse; dx, dmix, dlse
            row = dict(part="a", n=n, T=T, D=D, Q=Q, dtype=args.dtype, errors=errors, check="ok" if ok else "FAILED",
                       bytes=dict(p1_fwd=p1_fwd, p1_fwd_bwd=p1_fwd + p1_bwd, p2_fwd=p2_fwd, p2_fwd_bwd=p2_fwd + p2_bwd),
                       ms={})
            if ok:
                full_p2 = [partial_sum, queries[0], lse0, mix0]
                cases = {"p1_fwd": ("ours", lambda: attnres_block_partials(representatives, queries, ones, eps=EPS)),
                         "p1_fwd_bwd": ("ours", train(ours_p1, [representatives, queries], [dlse, dmix])),
                         "p2_fwd": ("ours", lambda: attnres_block_merge((lse0, mix0), partial_sum, queries[0], ones[0],
                                                                        eps=EPS)),
                         "p2_fwd_bwd": ("ours", train(ours_p2, full_p2, [dout]))}
                with torch.no_grad():
                    row["ms"].update({f"ours {k}": bench(fn) for k, (_, fn) in cases.items()
                                      if not k.endswith("bwd")})
                row["ms"].update({f"ours {k}": bench(fn) for k, (_, fn) in cases.items() if k.endswith("bwd")})
                if peer is not None:
                    with torch.no_grad():
                        row["ms"]["peer p1_fwd"] = bench(lambda: peer_p1(representatives, queries))
                        row["ms"]["peer p2_fwd"] = bench(lambda: peer_p2(*full_p2))
                    row["ms"]["peer p1_fwd_bwd"] = bench(train(peer_p1, [representatives, queries], [dlse, dmix]))
                    row["ms"]["peer p2_fwd_bwd"] = bench(train(peer_p2, full_p2, [dout]))
                row["copy_ms"] = {k: copy_ms(b) for k, b in row["bytes"].items()}
            results.append(row)
            print(f"(a) n={n}: {row['check']}, ms {row['ms']}", flush=True)

    # (b) the two phases together against the one-phase aggregate, per block of Q points
    if "b" in args.parts:
        D, Q = args.hidden, args.queries
        queries, gains = randn(Q, D, scale=2 / D ** 0.5), 1 + randn(Q, D, scale=0.1)
        partial_sum = randn(1, T, D)
        douts = randn(Q, 1, T, D)
        for n in ints(args.representatives):
            progress("b", D, n)
            representatives = randn(n, 1, T, D)
            sources = torch.cat([representatives, partial_sum[None]])

            def two_phases(r, x, q, g):
                partials = attnres_block_partials(r, q, g, eps=EPS)
                return [attnres_block_merge([p[j] for p in partials], x, q[j], g[j], eps=EPS) for j in range(Q)]

            def one_phase(s, q, g):
                return [attnres_aggregate(s, q[j], g[j], eps=EPS) for j in range(Q)]

            def reference(s, q, g):
                return [reference_aggregate(torch, s, q[j], g[j]) for j in range(Q)]

            two_ref = lambda r, x, q, g: reference(torch.cat([r, x[None]]), q, g)  # noqa: E731
            cut = [d[:, :rows] for d in douts]
            errors = check(torch, "two phases", two_phases, two_ref,
                           [representatives[:, :, :rows], partial_sum[:, :rows], queries, gains], cut, tolerance)
            errors |= check(torch, "one phase", one_phase, reference, [sources[:, :, :rows], queries, gains], cut,
                            tolerance)
            ok = all(e <= tolerance for e in errors.values())
            failed |= not ok
            row = dict(part="b", n=n, T=T, D=D, Q=Q, dtype=args.dtype, errors=errors, check="ok" if ok else "FAILED",
                       ms={})
            if ok:
                with torch.no_grad():
                    row["ms"]["two phases fwd"] = bench(lambda: two_phases(representatives, partial_sum, queries,
                                                                           gains))
                    row["ms"]["one phase fwd"] = bench(lambda: one_phase(sources, queries, gains))
                row["ms"]["two phases fwd_bwd"] = bench(train(two_phases, [representatives, partial_sum, queries,
                                                                           gains], list(douts)))
                row["ms"]["one phase fwd_bwd"] = bench(train(one_phase, [sources, queries, gains], list(douts)))
            results.append(row)
            print(f"(b) n={n}: {row['check']}, ms {row['ms']}", flush=True)

    # (c) phase 1's backward entry alone, in both derived forms
    if "c" in args.parts:
        for D, Q in ((args.peer_hidden, args.peer_queries), (args.hidden, args.queries)):
            layers = phase1_layers(D, Path(args.out) / "layers", "backward")
            queries, gains = randn(Q, D, scale=2 / D ** 0.5), 1 + randn(Q, D, scale=0.1)
            for n in ints(args.representatives):
                progress("c", D, n)
                representatives = randn(n, 1, T, D)
                with torch.no_grad():
                    block_lse, block_mix = attnres_block_partials(representatives, queries, gains, eps=EPS)
                dlse, dmix = torch.randn(Q, 1, T, device=device), randn(Q, 1, T, D)
                full = (representatives, queries, gains, block_lse, block_mix, dlse, dmix)
                cut = [x[..., :rows, :] if x.dim() == 4 else x[..., :rows] if x.dim() == 3 else x for x in full]
                cut = [x.contiguous() for x in cut]
                _, want = outputs_and_grads(torch, lambda r, q, g: reference_partials(torch, r, q, g),
                                            [x.float() for x in cut[:3]], cut[5:])
                errors = {f"{form} d{i}": rms_ratio(g, w) for form, layer in layers.items()
                          for i, (g, w) in enumerate(zip(layer.block_partials_backward(*cut), want, strict=True))}
                ok = all(e <= tolerance for e in errors.values())
                failed |= not ok
                row = dict(part="c", n=n, T=T, D=D, Q=Q, dtype=args.dtype, errors=errors,
                           check="ok" if ok else "FAILED", ms={}, copy_ms={},
                           bytes={form: T * block_attnres_backward_bytes(D, n, Q, size, form)["block_partials_backward"]
                                  for form in layers})
                if ok:
                    for form, layer in layers.items():
                        row["ms"][form] = bench(lambda layer=layer: layer.block_partials_backward(*full))
                        row["copy_ms"][form] = copy_ms(row["bytes"][form])
                results.append(row)
                print(f"(c) D={D} n={n}: {row['check']}, ms {row['ms']}", flush=True)

    # (d) phase 1's forward entry alone, in both derived forms
    if "d" in args.parts:
        for D, Q in ((args.peer_hidden, args.peer_queries), (args.hidden, args.queries)):
            layers = phase1_layers(D, Path(args.out) / "layers", "forward")
            queries, gains = randn(Q, D, scale=2 / D ** 0.5), 1 + randn(Q, D, scale=0.1)
            for n in ints(args.representatives):
                progress("d", D, n)
                representatives = randn(n, 1, T, D)
                cut = [representatives[:, :, :rows].contiguous(), queries, gains]
                want = reference_partials(torch, *cut)
                errors = {f"{form} out{i}": rms_ratio(g, w) for form, layer in layers.items()
                          for i, (g, w) in enumerate(zip(layer.block_partials(*cut), want, strict=True))}
                ok = all(e <= tolerance for e in errors.values())
                failed |= not ok
                nbytes = n * T * D * size + Q * T * (D * size + 4)
                row = dict(part="d", n=n, T=T, D=D, Q=Q, dtype=args.dtype, errors=errors,
                           check="ok" if ok else "FAILED", ms={}, bytes=nbytes)
                if ok:
                    for form, layer in layers.items():
                        row["ms"][form] = bench(lambda layer=layer: layer.block_partials(representatives, queries,
                                                                                         gains))
                    row["copy_ms"] = copy_ms(nbytes)
                results.append(row)
                print(f"(d) D={D} n={n}: {row['check']}, ms {row['ms']}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = "CPU (interpreter, smoke: times are not measurements)" if args.smoke else \
        torch.cuda.get_device_name()
    lines = [
        "# Block AttnRes in training: the two phases' forward and forward + backward",
        "",
        f"device {device_name}; torch {torch.__version__}, triton {triton.__version__}; commit {git_commit()}; "
        f"{args.dtype}, B = 1, T = {T}; {peer_note}.",
        f"Command: `python3 -P bench/block_attnres_train_gpu.py --out DIR --tokens {T} --representatives "
        f"{args.representatives} --dtype {args.dtype}`" + (" (--smoke)" if args.smoke else ""),
        f"Times in ms (do_bench median); every output and gradient checked first against float32 torch autograd on "
        f"{rows} rows (RMS ratio <= {tolerance:g}).",
    ]
    part_a = [r for r in results if r["part"] == "a"]
    if part_a:
        lines += ["", f"## (a) D = {part_a[0]['D']}, {part_a[0]['Q']} queries a block: each phase, ours / flash-attn-res",
                  "", "copy %: a torch clone moving the op's bytes (inputs read, outputs written once), its time over "
                  "the op's; x: flash-attn-res's time over ours (> 1: ours faster).", "",
                  "| n | phase | ours ms | copy % | flash-attn-res ms | copy % | x | check |", "|---|---|---|---|---|---|---|---|"]
        for r in part_a:
            for key, label in (("p1_fwd", "1 fwd"), ("p1_fwd_bwd", "1 fwd+bwd"), ("p2_fwd", "2 fwd"),
                               ("p2_fwd_bwd", "2 fwd+bwd")):
                ours, theirs, copy = r["ms"].get(f"ours {key}"), r["ms"].get(f"peer {key}"), r.get("copy_ms", {}).get(key)
                lines.append(f"| {r['n']} | {label} | {fmt(ours, 3)} | {fmt(copy and ours and 100 * copy / ours, 0)} | "
                             f"{fmt(theirs, 3)} | {fmt(copy and theirs and 100 * copy / theirs, 0)} | "
                             f"{fmt(theirs and ours and theirs / ours, 2)} | {r['check']} |")
    part_b = [r for r in results if r["part"] == "b"]
    if part_b:
        lines += ["", f"## (b) D = {part_b[0]['D']}, {part_b[0]['Q']} queries a block: per block, two phases "
                  f"(1 block_partials + {part_b[0]['Q']} merges) / one phase ({part_b[0]['Q']} aggregates)", "",
                  "| n | two phases fwd ms | one phase fwd ms | two / one | two phases fwd+bwd ms | one phase fwd+bwd ms | "
                  "two / one | check |", "|---|---|---|---|---|---|---|---|"]
        for r in part_b:
            t = r["ms"]
            ratio = {k: t.get(f"two phases {k}") and t.get(f"one phase {k}") and t[f"two phases {k}"] /
                     t[f"one phase {k}"] for k in ("fwd", "fwd_bwd")}
            lines.append(f"| {r['n']} | {fmt(t.get('two phases fwd'), 3)} | {fmt(t.get('one phase fwd'), 3)} | "
                         f"{fmt(ratio['fwd'], 2)} | {fmt(t.get('two phases fwd_bwd'), 3)} | "
                         f"{fmt(t.get('one phase fwd_bwd'), 3)} | {fmt(ratio['fwd_bwd'], 2)} | {r['check']} |")
    part_c = [r for r in results if r["part"] == "c"]
    if part_c:
        lines += ["", "## (c) phase 1's backward entry alone: partials-backward=columns / query-blocks (the default)",
                  "", "MB: bytes the kernels' loads and stores of rows name (block_attnres_backward_bytes); copy %: a "
                  "torch clone moving as many bytes, its time over the form's.", "",
                  "| D | Q | n | columns ms | MB | copy % | query-blocks ms | MB | copy % | query-blocks / columns "
                  "| check |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in part_c:
            cells = []
            for form in ("columns", "query-blocks"):  # the header's order (PARTIALS_BACKWARD's is the default first)
                ms, copy = r["ms"].get(form), r["copy_ms"].get(form)
                cells += [fmt(ms, 3), fmt(r["bytes"][form] / 1e6, 1), fmt(copy and ms and 100 * copy / ms, 0)]
            ms = r["ms"]
            speedup = ms.get("columns") and ms.get("query-blocks") and ms["query-blocks"] / ms["columns"]
            lines.append(f"| {r['D']} | {r['Q']} | {r['n']} | {' | '.join(cells)} | {fmt(speedup, 2)} | {r['check']} |")
    part_d = [r for r in results if r["part"] == "d"]
    if part_d:
        lines += ["", "## (d) phase 1's forward entry alone: partials-schedule=columns / query-blocks (the default)",
                  "", "MB: the representatives read once and the partials written once; copy %: a torch clone moving "
                  "as many bytes, its time over the form's.", "",
                  "| D | Q | n | MB | columns ms | copy % | query-blocks ms | copy % | query-blocks / columns | check |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in part_d:
            ms, copy = r["ms"], r.get("copy_ms")
            cells = [c for form in ("columns", "query-blocks")  # the header's order
                     for c in (fmt(ms.get(form), 3), fmt(copy and ms.get(form) and 100 * copy / ms[form], 0))]
            speedup = ms.get("columns") and ms.get("query-blocks") and ms["query-blocks"] / ms["columns"]
            lines.append(f"| {r['D']} | {r['Q']} | {r['n']} | {fmt(r['bytes'] / 1e6, 1)} | {' | '.join(cells)} | "
                         f"{fmt(speedup, 2)} | {r['check']} |")
    table = "\n".join(lines) + "\n"
    (out / "block_attnres_train.md").write_text(table)
    (out / "block_attnres_train.json").write_text(json.dumps(dict(peer=peer_note, rows=results), indent=1) + "\n")
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
