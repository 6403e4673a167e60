"""Activation memory of the block stack on the GPU (k3compile.runtime.stack, docs/block-stack.md): Block
AttnRes with its aggregation points under activation checkpointing against the bound, the same
stack with plain residuals plus its block representatives.

    PYTHONPATH=/tmp/site python3 -P bench/block_stack_memory_gpu.py --out DIR [--layers 24] [--tokens 8192]
    python3 bench/block_stack_memory_gpu.py --out DIR --smoke     # CPU: Triton's interpreter, tiny sizes

A K3-like stack that fits one GPU: hidden 7168, blocks of 12 layers, K3's 3 KDA : 1 attention
pattern (narrower mixers and FFN than K3's, so 24 layers' weights and gradients fit), bf16, one
sequence of --tokens tokens. Each form (plain residuals; the compiled one-phase aggregate
checkpointed and not; the torch form of the aggregate checkpointed; the two phases with their
own recompute) gets the same weights. After a warm-up step (kernels compiled, gradient buffers
allocated), one step is measured: `saved` = torch.cuda.memory_allocated() after the forward less
before (what the forward leaves for the backward, the output excluded), `peak` =
max_memory_allocated() over forward and backward less before; the bound = plain residuals' + the
n representatives the forward makes (n = layers / 12; b_0 is the input), n x T x 7168 x 2 bytes.
The outputs of the warm-up step are checked: every form against the torch form (RMS ratio <=
5e-2 in bf16, a sanity check: k3c verify checks the kernels) and the checkpointed aggregate
bit-equal to the unchecked one. Times: forward + backward, CUDA events, median of --reps. Writes
DIR/block_stack_memory.md (also printed) and .json; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import device_name, fmt, git_commit  # noqa: E402

FORMS = (("plain residuals", "none", True), ("aggregate, checkpointed", "aggregate", True),
         ("aggregate, not checkpointed", "aggregate", False), ("torch form, checkpointed", "torch", True),
         ("two phases (own recompute)", "two_phase", True))
TOLERANCE = 5e-2  # RMS ratio of a bf16 stack's output against the torch form's: a sanity check (k3c verify checks the kernels)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=24, help="layers (default 24: 2 blocks of 12)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens of the one sequence (default 8192)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--heads", type=int, default=16, help="KDA and attention heads of 128 (default 16)")
    p.add_argument("--ffn", type=int, default=4096, help="dense SwiGLU hidden size (default 4096)")
    p.add_argument("--reps", type=int, default=3, help="timed steps (median)")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: interpreter, fp32, D 48, 4 layers in blocks of 2")
    args = p.parse_args(argv)
    block, head_dim, dtype_name = 12, 128, "bfloat16"
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        args.layers, args.tokens, args.hidden, args.heads, args.ffn, args.reps = 4, 6, 48, 1, 40, 1
        block, head_dim, dtype_name = 2, 16, "float32"
    import torch

    from k3compile.runtime.stack import build_stack
    from k3compile.runtime.stack_spec import model_spec_from_table

    device = "cpu" if args.smoke else "cuda"
    cuda = device == "cuda"
    table = dict(hidden_size=args.hidden, num_layers=args.layers, block_size=block, layer_pattern="kda,kda,kda,attn",
                 kda_heads=args.heads, kda_head_dim=head_dim, attn_heads=args.heads, attn_head_dim=head_dim,
                 ffn_hidden_size=args.ffn, dtype=dtype_name)
    print(f"torch {torch.__version__}, device {device_name(torch, not cuda)}, commit {git_commit()}", flush=True)
    torch.manual_seed(0)
    x = torch.randn(1, args.tokens, args.hidden, device=device).to(getattr(torch, dtype_name))
    weights = torch.randn_like(x)
    state = None
    results, outputs, failed = [], {}, False
    for label, form, checkpointed in FORMS:
        with torch.device(device):  # the weights made where they run
            model = build_stack(model_spec_from_table({**table, "attnres": form, "checkpoint_attnres": checkpointed}))
        if state is None:
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if name.endswith("query"):
                        param.normal_(0, 0.05)  # away from the init's uniform mix
            state = model.state_dict()
        model.load_state_dict(state)
        try:
            out = model(x)
            (out.float() * weights).sum().backward()  # warm-up: kernels compiled, gradient buffers made
        except NotImplementedError as err:
            results.append({"form": label, "error": str(err).splitlines()[0]})
            print(f"{label}: {results[-1]['error']}", flush=True)
            continue
        outputs[label] = out.detach()
        del out
        model.zero_grad(set_to_none=False)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        out = model(x)
        saved = torch.cuda.memory_allocated() - before - out.untyped_storage().nbytes() if cuda else None
        (out.float() * weights).sum().backward()
        peak = torch.cuda.max_memory_allocated() - before if cuda else None
        del out
        times = []
        for _ in range(args.reps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            began = time.perf_counter()
            (model(x).float() * weights).sum().backward()
            if cuda:
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                times.append((time.perf_counter() - began) * 1e3)
        results.append({"form": label, "saved_bytes": saved, "peak_bytes": peak, "step_ms": statistics.median(times)})
        del model
    reference = outputs.get("torch form, checkpointed")
    for row in results:
        if row["form"] in outputs and row["form"] != "plain residuals":
            got = outputs[row["form"]]
            row["rms_vs_torch_form"] = float((got.double() - reference.double()).norm() / reference.double().norm())
            row["finite"] = bool(torch.isfinite(got).all())
            failed |= not row["finite"] or row["rms_vs_torch_form"] > TOLERANCE
    if "aggregate, checkpointed" in outputs and "aggregate, not checkpointed" in outputs:
        equal = torch.equal(outputs["aggregate, checkpointed"], outputs["aggregate, not checkpointed"])
        failed |= not equal
        print(f"checkpointed aggregate bit-equal to the unchecked one: {equal}")
    n = args.layers // block
    rep_bytes = args.tokens * args.hidden * x.element_size()
    plain = next(r for r in results if r["form"] == "plain residuals")
    lines = [f"# Block stack activation memory ({device_name(torch, not cuda)}, torch {torch.__version__}, commit "
             f"{git_commit()})", "",
             f"{args.layers} layers (kda,kda,kda,attn), blocks of {block}, hidden {args.hidden}, {args.heads} heads of "
             f"{head_dim}, dense FFN {args.ffn}, {dtype_name}, T = {args.tokens}; bound = plain residuals + {n} "
             f"representatives x {rep_bytes / 2**20:.0f} MiB. GiB.", "",
             "| form | saved | saved / bound | peak | peak / bound | step ms | RMS vs torch form |", "|---|---|---|---|---|---|---|"]
    for row in results:
        if "error" in row:
            lines.append(f"| {row['form']} | {row['error']} | | | | | |")
            continue
        cells = [row["form"]]
        for key in ("saved_bytes", "peak_bytes"):
            value, base = row[key], plain[key]
            bound = None if base is None else base + n * rep_bytes
            cells += [fmt(value and value / 2**30, 2), fmt(bound and value / bound, 3)]
        cells += [fmt(row["step_ms"], 1), fmt(row.get("rms_vs_torch_form"), 4)]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "block_stack_memory.md").write_text(text)
    (out_dir / "block_stack_memory.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    if failed:
        print("FAILED: an output check failed (see the table)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
