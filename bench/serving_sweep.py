"""Launch sweep of the serving kernels (issue 4): decode and one speculative round under several
(block-v, num-warps, token-stages) choices of lower-decode and lower-speculative, every choice
checked against an fp32 token loop before it is timed, side by side in one process.

    python bench/serving_sweep.py --out DIR                      # on the GPU, from the repo root
    python bench/serving_sweep.py --out /tmp/ss --smoke          # CPU: Triton's interpreter, tiny

Needs k3compile (it compiles one module per choice from --spec). Writes DIR/serving_sweep.md and
.json: decode at T = 1 (µs, state TB/s, fraction of the copy bandwidth measured in the same run)
and a round of n tokens, all accepted (replay = verify + commit; spec_step = the fused launch),
with the cost of n over n = 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import argument_shapes, compare, copy_bandwidth, cpu_time_ms, device_name, fmt, git_commit, import_file, ints, make_inputs, reference  # noqa: E402

PIPELINE = ("lower-decode{{block-v={bv} num-warps={warps} token-stages={stages}}},derive-replay{{draft-tokens={depth}}},"
            "lower-speculative{{block-v={bv} num-warps={warps} token-stages={stages}}}")
DEFAULT_CHOICES = ",".join(f"{bv}:{w}:{s}" for bv in (16, 32, 64) for w in (2, 4, 8) for s in (0, 3))
TOLERANCE = dict(o=5e-3, state=1e-5)  # rms ratios against the fp32 loop: bf16 outputs, fp32 states
SMOKE_LAYER = dict(name="kda_sweep", kind="kda", dtype="bfloat16", num_heads=2, num_v_heads=4, head_k_dim=16,
                   head_v_dim=16)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--spec", default="bench/kda_bench.toml", help="layer spec (default: bench/kda_bench.toml)")
    p.add_argument("--choices", default=DEFAULT_CHOICES,
                   help="comma-separated block_v:num_warps:token_stages (default: 16/32/64 x 2/4/8 x 0/3)")
    p.add_argument("--batches", default="64,256", help="comma-separated B (default 64,256)")
    p.add_argument("--drafts", default="1,8", help="comma-separated n per round (default 1,8)")
    p.add_argument("--depth", type=int, default=16, help="draft-tokens of derive-replay (default 16)")
    p.add_argument("--rep", type=float, default=50.0, help="do_bench rep, ms (default 50)")
    p.add_argument("--smoke", action="store_true", help="tiny layer in Triton's interpreter (CPU)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch
    import triton.testing

    from k3compile.driver import compile as k3_compile
    from k3compile.spec import load_spec, spec_from_table

    device = torch.device("cpu" if args.smoke else "cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = spec_from_table(SMOKE_LAYER) if args.smoke else load_spec(args.spec)
    batches, drafts = ([2], [1, 2]) if args.smoke else (ints(args.batches), ints(args.drafts))

    def bench(fn):
        if args.smoke:
            return cpu_time_ms(fn, reps=1)
        return triton.testing.do_bench(fn, warmup=10, rep=args.rep, return_mode="median")

    copy_Bps = copy_bandwidth(torch, bench, 1 if args.smoke else 512, device)

    rows = []
    for choice in args.choices.split(","):
        bv, warps, stages = (int(x) for x in choice.split(":"))
        row = dict(block_v=bv, num_warps=warps, token_stages=stages, failed=[])
        rows.append(row)
        pipeline = PIPELINE.format(bv=bv, warps=warps, stages=stages, depth=args.depth)
        layer = k3_compile(spec, out_dir=out / "modules" / f"bv{bv}_w{warps}_s{stages}", pipeline=pipeline)
        mod = import_file(layer.path, f"sweep_bv{bv}_w{warps}_s{stages}")
        shapes = argument_shapes(mod.spec_step)
        H, K, HV, V = (int(shapes[name][dim]) for name, dim in (("q", 2), ("q", 3), ("v", 2), ("v", 3)))
        scale = K**-0.5

        def check(name, got, want, tol):
            rms = compare(torch, got, want)[1]
            if not rms <= tol:  # NaN fails too
                row["failed"].append(f"{name} rms {rms:.1e}")

        for B in batches:
            inp = make_inputs(torch, B, max(drafts), H, HV, K, V, device, seed=B)
            slots = torch.randperm(B).to(device)
            pool0 = torch.empty_like(inp["initial_state"])
            pool0[slots] = inp["initial_state"]
            for n in [1, *drafts]:
                tok = {k: inp[k][:, :n].contiguous() for k in ("q", "k", "v", "g", "beta")}
                o_ref, s_ref = reference(torch, {**tok, "initial_state": inp["initial_state"]}, scale)
                cache = torch.full((B, args.depth, HV, 2 * K + V), float("nan"), device=device)
                next_cache = torch.full_like(cache, float("nan"))
                accepted = torch.full((B,), n, device=device)
                zero = torch.zeros_like(accepted)
                # check: verify + commit, and spec_step (committing nothing) then commit, from the pool
                pool = pool0.clone()
                (o,) = mod.verify(**tok, scale=scale, state=pool, state_indices=slots, check_indices=False, cache=cache)
                mod.commit(state=pool, state_indices=slots, check_indices=False, cache=cache, accepted=accepted)
                check(f"replay B{B} n{n} o", o, o_ref, TOLERANCE["o"])
                check(f"replay B{B} n{n} state", pool[slots], s_ref, TOLERANCE["state"])
                pool = pool0.clone()
                (o,) = mod.spec_step(**tok, scale=scale, state=pool, state_indices=slots, check_indices=False, cache=cache,
                                     accepted=zero, next_cache=next_cache)
                mod.commit(state=pool, state_indices=slots, check_indices=False, cache=next_cache, accepted=accepted)
                check(f"spec_step B{B} n{n} o", o, o_ref, TOLERANCE["o"])
                check(f"spec_step B{B} n{n} state", pool[slots], s_ref, TOLERANCE["state"])
                if n == 1:
                    pool = pool0.clone()
                    (o,) = mod.decode(**tok, scale=scale, state=pool, state_indices=slots, check_indices=False)
                    check(f"decode B{B} o", o, o_ref, TOLERANCE["o"])
                    check(f"decode B{B} state", pool[slots], s_ref, TOLERANCE["state"])
                    ms = bench(lambda: mod.decode(**tok, scale=scale, state=pool, state_indices=slots, check_indices=False))
                    row[f"decode_B{B}_us"] = ms * 1e3
                    row[f"decode_B{B}_copy"] = 2 * B * HV * K * V * 4 / (ms * 1e-3) / copy_Bps
                if n not in drafts:
                    continue
                # timing: every round commits the n tokens the previous one cached (the cache above)
                pool = pool0.clone()
                row[f"replay_B{B}_n{n}_us"] = 1e3 * bench(lambda: (
                    mod.verify(**tok, scale=scale, state=pool, state_indices=slots, check_indices=False, cache=cache),
                    mod.commit(state=pool, state_indices=slots, check_indices=False, cache=cache, accepted=accepted)))
                pool = pool0.clone()
                row[f"spec_step_B{B}_n{n}_us"] = 1e3 * bench(lambda: mod.spec_step(
                    **tok, scale=scale, state=pool, state_indices=slots, check_indices=False, cache=next_cache, accepted=accepted,
                    next_cache=cache))
            if not args.smoke:
                del inp, pool0, pool, cache, next_cache
                torch.cuda.empty_cache()
        print(f"{choice}: " + ", ".join(f"{k} {fmt(v, 1)}" for k, v in row.items() if k.endswith("_us"))
              + (f" FAILED {row['failed']}" if row["failed"] else ""), flush=True)

    meta = dict(device=device_name(torch, args.smoke), torch=torch.__version__, triton=triton.__version__,
                commit=git_commit(), spec="smoke layer" if args.smoke else args.spec, copy_TBps=copy_Bps / 1e12, rep_ms=args.rep)
    (out / "serving_sweep.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    text = report(meta, rows, batches, drafts)
    (out / "serving_sweep.md").write_text(text)
    print(text)
    if any(row["failed"] for row in rows):
        sys.exit("serving_sweep: some choices failed their check (see the table)")


def report(meta, rows, batches, drafts) -> str:
    lines = [
        "# Serving launch sweep: decode and one speculative round per (block-v, num-warps, token-stages)",
        "",
        f"device {meta['device']}; torch {meta['torch']}, triton {meta['triton']}; commit {meta['commit']}; "
        f"spec {meta['spec']}; copy bandwidth {meta['copy_TBps']:.3f} TB/s; do_bench median, rep {meta['rep_ms']} ms.",
        "Rounds: all n tokens accepted; replay = verify + commit, spec_step = one launch. ×n1: over n = 1.",
        "",
    ]
    head = ["block_v", "warps", "stages"]
    for B in batches:
        head += [f"decode B{B} µs", f"B{B} copy"]
        for name in ("replay", "spec_step"):
            head += [f"{name} B{B} n{n} µs" for n in drafts] + [f"{name} B{B} ×n1"]
    lines += ["| " + " | ".join(head + ["checks"]) + " |", "|" + "---|" * (len(head) + 1)]
    for row in rows:
        cells = [str(row["block_v"]), str(row["num_warps"]), str(row["token_stages"])]
        for B in batches:
            copy = row.get(f"decode_B{B}_copy")
            cells += [fmt(row.get(f"decode_B{B}_us"), 1), f"{copy:.0%}" if copy else "—"]
            for name in ("replay", "spec_step"):
                times = [row.get(f"{name}_B{B}_n{n}_us") for n in drafts]
                cells += [fmt(t, 1) for t in times]
                one, last = row.get(f"{name}_B{B}_n1_us"), times[-1]
                cells.append(f"{last / one:.2f}×" if one and last else "—")
        cells.append("; ".join(row["failed"]) or "ok")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
