"""LatentMoE training step (forward + backward) on the GPU at an expert-parallel shard's size, bf16:
our layer (k3compile.ops.moe.latent_moe: moe_forward + the derived moe_backward) against the same
layer written with torch._grouped_mm (forward, backward by autograd), side by side in one process.

The shard: the spec's widths (examples/latent_moe.toml: K3's d 7168, latent 3584, FFN 3072, two
shared experts of 3072, SiTU-GLU) with --experts local experts (64) and its top-k (16) routed
among them, --tokens tokens (8192). Before timing, both layers' output and gradients are checked
against the torch layer in fp32 (a per-expert loop, fp32 weights) at --check-tokens tokens: the
RMS ratio of every tensor. Then per token count: forward + backward time (triton.testing.do_bench,
gradients reset each call), forward alone, TFLOP/s (the layer's GEMMs, backward twice the
forward's) against a measured bf16 GEMM (8192^3 torch.matmul), and the peak memory a step adds
over the weights and their gradients. Writes DIR/moe_train.md (also printed) and moe_train.json.

--profile: our training step's GPU time per kernel (torch.profiler, mean of a few steps) at the
first token count, each backward kernel beside its roofline floor at the measured GEMM rate and
--bandwidth (bench/moe_backward_roofline.py, under the variant's options). --variants
'NAME:OPTIONS;...': the layer compiled again with derive-moe-backward{OPTIONS} (e.g.
'n256:dgrad-block-n=256'), its moe_backward timed and profiled per kernel on its own
moe_forward's tensors, its gradients against the default module's (RMS ratio): tiles compared
in one run.

    PYTHONPATH=/tmp/site python3 -P bench/moe_train_gpu.py --out DIR           # on the GPU
    PYTHONPATH=/tmp/site python3 -P bench/moe_train_gpu.py --out DIR --profile --variants 'n256:dgrad-block-n=256'
    TRITON_INTERPRET=1 python3 bench/moe_train_gpu.py --smoke --out /tmp/x      # tiny, CPU

The next device run (issue 36): the GLU's adjoint in a row kernel of its own, the routed wgrads
on contiguous copies of their gathered rows, both, both with 128-row wgrad steps, and the GLU
kernel at 32 columns (docs/moe.md, "The backward's options, offline"):

    PYTHONPATH=/tmp/site python3 -P bench/moe_train_gpu.py --out DIR --profile --variants \
        'glu_kernel:glu-adjoint=kernel;wgrad_copy:sorted-wgrad-rows=copy;both:glu-adjoint=kernel sorted-wgrad-rows=copy;both_r128:glu-adjoint=kernel sorted-wgrad-rows=copy sorted-wgrad-block-r=128 sorted-wgrad-num-stages=3;glu_kernel_n32:glu-adjoint=kernel row-kernel-block-n=32'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
from common import ints, short_error  # noqa: E402
from moe_backward_roofline import Shard, floor_ms, kernels  # noqa: E402

SMOKE_LAYER = dict(hidden_size=48, latent_dim=24, num_experts=6, top_k=2, expert_ffn_dim=20, num_shared_experts=2,
                   shared_ffn_dim=12, activation="situ_glu")
GRADIENTS = ("x", "router_weight", "expert_gate_up", "expert_down", "latent_down", "latent_up", "latent_norm_gain",
             "shared_gate_up", "shared_down")


class TorchLatentMoe:
    """The layer in torch ops, differentiable by autograd: routing in fp32 (sigmoid, top-k by score +
    bias, normalised), the routed experts over the (token, slot) pairs sorted by expert with
    torch._grouped_mm (grouped=True; bf16) or a loop over the experts (any dtype), the combine by
    index_add in fp32, the latent RMSNorm with gain, the shared experts as batched GEMMs."""

    def __init__(self, torch, key) -> None:
        self.torch, self.key = torch, key

    def glu(self, gate_up):
        torch = self.torch
        g, u = gate_up.float().chunk(2, dim=-1)
        if self.key.activation == "situ_glu":
            return 4 * torch.tanh(g / 4) * torch.sigmoid(g) * 25 * torch.tanh(u / 25)
        return torch.nn.functional.silu(g) * u

    def __call__(self, w: dict, grouped: bool):
        torch, key = self.torch, self.key
        x = w["x"]
        s = torch.sigmoid((x @ w["router_weight"].T).float())
        ids = torch.topk(s.detach() + w["router_bias"], key.top_k, dim=-1).indices
        weights = s.gather(-1, ids)
        if key.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights * key.routed_scaling_factor
        h = x @ w["latent_down"].T if key.latent_dim else x
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        rows = order // key.top_k
        counts = torch.bincount(flat, minlength=key.num_experts)
        if grouped:
            offsets = torch.cumsum(counts, 0).to(torch.int32)
            act = self.glu(torch._grouped_mm(h[rows], w["expert_gate_up"].transpose(1, 2), offs=offsets)).to(h.dtype)
            out_rows = torch._grouped_mm(act, w["expert_down"].transpose(1, 2), offs=offsets)
        else:
            parts, start = [], 0
            for e, count in enumerate(counts.tolist()):
                part = h[rows[start:start + count]]
                parts.append(self.glu(part @ w["expert_gate_up"][e].T).to(h.dtype) @ w["expert_down"][e].T)
                start += count
            out_rows = torch.cat(parts)
        combined = torch.zeros(h.shape, dtype=torch.float32, device=h.device).index_add(
            0, rows, out_rows.float() * weights.flatten()[order, None])
        if key.latent_dim:
            normed = combined * torch.rsqrt(combined.pow(2).mean(-1, keepdim=True) + key.eps)
            out = (normed * w["latent_norm_gain"].float()).to(x.dtype) @ w["latent_up"].T
        else:
            out = combined.to(x.dtype)
        if key.num_shared_experts and key.shared_ffn_dim:
            act = self.glu(torch.einsum("rd,sfd->srf", x, w["shared_gate_up"])).to(x.dtype)
            out = out + torch.einsum("srf,sdf->rd", act, w["shared_down"])
        return out


def layer_weights(torch, key, device, dtype, gen) -> dict:
    """Fresh weights (drawn in the dtype: the shard's experts are gigabytes), scaled so activations stay O(1)."""
    d, l, E, F, S, Fs = (key.hidden_size, key.latent_dim, key.num_experts, key.expert_ffn_dim,
                         key.num_shared_experts, key.shared_ffn_dim)
    w_ = l or d

    def randn(*shape, scale=1.0, shift=0.0, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=dt).mul_(scale).add_(shift)

    out = {"router_weight": randn(E, d, scale=2 / d**0.5), "router_bias": randn(E, scale=0.1, dt=torch.float32),
           "expert_gate_up": randn(E, 2 * F, w_, scale=w_**-0.5), "expert_down": randn(E, w_, F, scale=F**-0.5)}
    if l:
        out |= {"latent_down": randn(l, d, scale=d**-0.5), "latent_up": randn(d, l, scale=l**-0.5),
                "latent_norm_gain": randn(l, scale=0.2, shift=1.0)}
    if S and Fs:
        out |= {"shared_gate_up": randn(S, 2 * Fs, d, scale=d**-0.5), "shared_down": randn(S, d, Fs, scale=Fs**-0.5)}
    return out


def flops(key, T: int) -> float:
    """The forward's GEMM flop at T tokens: routed experts (3 GEMMs of w x F per pair), shared
    experts, latent projections, router."""
    w_ = key.latent_dim or key.hidden_size
    per_token = (key.top_k * 3 * w_ * key.expert_ffn_dim + 3 * key.hidden_size * key.shared_ffn_dim
                 * key.num_shared_experts + 2 * key.hidden_size * key.latent_dim + key.hidden_size * key.num_experts)
    return 2.0 * T * per_token


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=Path(__file__).resolve().parent.parent / "examples/latent_moe.toml")
    parser.add_argument("--experts", type=int, default=64, help="local experts of the shard")
    parser.add_argument("--top-k", type=int, default=16)
    parser.add_argument("--tokens", type=ints, default=[8192], help="token counts to time")
    parser.add_argument("--check-tokens", type=int, default=2048, help="tokens of the gradient check")
    parser.add_argument("--smoke", action="store_true", help="tiny widths on the CPU (Triton's interpreter)")
    parser.add_argument("--profile", action="store_true", help="our step's GPU time per kernel beside its floor")
    parser.add_argument("--variants", default="", help="'NAME:derive-moe-backward options;...' timed per kernel")
    parser.add_argument("--bandwidth", type=float, default=3.0, help="DRAM TB/s of the floors (H100 SXM: 3.35 peak)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import dataclasses

    import torch
    import triton
    import triton.testing

    from k3compile.ops.moe import MoeKey, latent_moe

    if args.smoke:
        key, device, tokens, check_tokens = MoeKey(**SMOKE_LAYER), "cpu", [37], 37
    else:
        key = dataclasses.replace(MoeKey.of(args.spec), num_experts=args.experts, top_k=args.top_k)
        device, tokens, check_tokens = "cuda", args.tokens, args.check_tokens
    dtype = torch.float32 if args.smoke else torch.bfloat16  # the interpreter runs fp32
    gen = torch.Generator(device).manual_seed(0)
    weights = layer_weights(torch, key, device, dtype, gen)
    torch_layer = TorchLatentMoe(torch, key)
    grouped = not args.smoke and hasattr(torch, "_grouped_mm")
    methods = {"ours": lambda w: latent_moe(**w, layer=key),
               "torch_grouped_mm" if grouped else "torch_loop": lambda w: torch_layer(w, grouped)}

    def leaves_of(x, source=weights, to=None) -> dict:
        tensors = {"x": x, **source}
        return {n: (t.to(to) if to is not None and n != "router_bias" else t).detach().requires_grad_(n in GRADIENTS)
                for n, t in tensors.items()}

    def step(method, leaves, dout):
        out = method(leaves)
        out.backward(dout)
        return out

    def rms_ratio(a, b) -> float:
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    # the check: both layers against the torch layer in fp32 (a loop over the experts, fp32 weights)
    x = torch.randn(check_tokens, key.hidden_size, generator=gen, device=device, dtype=dtype)
    dout = torch.randn(x.shape, generator=gen, device=device, dtype=dtype)
    reference = leaves_of(x, to=torch.float32)
    ref_out = step(lambda w: torch_layer(w, False), reference, dout.float())
    check = {}
    for name, method in list(methods.items()):
        leaves = leaves_of(x)
        try:
            out = step(method, leaves, dout)
        except Exception as err:  # noqa: BLE001 - e.g. a torch whose _grouped_mm has no backward
            print(f"{name}: {short_error(err)}; not timed", flush=True)
            del methods[name]
            continue
        check[name] = {"out": rms_ratio(out, ref_out), **{f"d{n}": rms_ratio(leaves[n].grad, reference[n].grad)
                                                        for n in GRADIENTS if n in leaves}}
        print(name, json.dumps(check[name]), flush=True)
    del reference, ref_out

    def bench(fn) -> float:
        if args.smoke:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return triton.testing.do_bench(fn, warmup=5, rep=100)

    if args.smoke:
        gemm_flops = math.nan
    else:
        square = torch.randn(8192, 8192, device=device, dtype=dtype)
        gemm_flops = 2 * 8192**3 / (triton.testing.do_bench(lambda: square @ square) * 1e-3)
        del square
    rows = []
    for T in tokens:
        x = torch.randn(T, key.hidden_size, generator=gen, device=device, dtype=dtype)
        dout = torch.randn(x.shape, generator=gen, device=device, dtype=dtype)
        row = {"T": T, "forward_tflop": flops(key, T) / 1e12}
        for name, method in methods.items():
            leaves = leaves_of(x)
            try:
                grads = [leaves[n] for n in GRADIENTS if n in leaves]

                def train(method=method, leaves=leaves, grads=grads):
                    for t in grads:
                        t.grad = None
                    step(method, leaves, dout)

                with torch.no_grad():
                    row[f"{name}_forward_ms"] = bench(lambda method=method, leaves=leaves: method(leaves))
                train()  # the weights' gradients exist: the peak below is what a step adds to them
                if device == "cuda":
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                train()
                if device == "cuda":
                    torch.cuda.synchronize()
                    row[f"{name}_peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
                row[f"{name}_step_ms"] = bench(train)
            except Exception as err:  # noqa: BLE001 - one failing method must not hide the other
                row[f"{name}_error"] = short_error(err)
            del leaves
        rows.append(row)
        print(json.dumps(row), flush=True)

    profiled = profile_step(torch, methods, leaves_of, step, key, tokens[0], gen, device, dtype, gemm_flops,
                            args) if args.profile or args.variants else []
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter, smoke sizes)"
    head = (f"{gpu}, torch {torch.__version__}, triton {triton.__version__}; {key.hidden_size} hidden, latent "
            f"{key.latent_dim}, {key.num_experts} local experts top-{key.top_k}, FFN {key.expert_ffn_dim}, "
            f"{key.num_shared_experts} shared x {key.shared_ffn_dim}, {key.activation}; {str(dtype)[6:]}; "
            f"bf16 GEMM {gemm_flops / 1e12:.0f} TFLOP/s (8192^3 torch.matmul)")
    baseline = next((n for n in methods if n != "ours"), "ours")
    lines = [head, "", f"Check at {check_tokens} tokens: RMS ratio against the torch layer in fp32", "",
             "| tensor | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    lines += [f"| {t} | " + " | ".join(f"{check[m][t]:.1e}" for m in methods) + " |" for t in check["ours"]]
    lines += ["", "Forward + backward (forward alone); TFLOP/s of the step (backward = 2 x forward's GEMMs); peak "
              "memory a step adds over the weights and their gradients", "",
              "| T | " + " | ".join(f"{m} step | {m} forward | {m} TFLOP/s | {m} peak GiB" for m in methods)
              + f" | ours / {baseline} |", "|---|" + "---|" * (4 * len(methods) + 1)]
    for row in rows:
        cells = []
        for m in methods:
            if f"{m}_error" in row:
                cells += ["error"] * 4
                continue
            cells += [f"{row[f'{m}_step_ms']:.2f} ms", f"{row[f'{m}_forward_ms']:.2f} ms",
                      f"{3 * row['forward_tflop'] / row[f'{m}_step_ms'] * 1e3:.0f}",
                      f"{row.get(f'{m}_peak_gib', math.nan):.2f}"]
        speedup = (f"{row[f'{baseline}_step_ms'] / row['ours_step_ms']:.2f}"
                   if f"{baseline}_step_ms" in row and "ours_step_ms" in row else "-")
        lines.append(f"| {row['T']} | " + " | ".join(cells) + f" | {speedup} |")
    lines += profiled
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe_train.md").write_text("\n".join(lines) + "\n")
    (args.out / "moe_train.json").write_text(json.dumps({"head": head, "gemm_flops": gemm_flops, "check": check,
                                                        "rows": rows}, indent=1))
    print("\n".join(lines))
    worst = max(v for c in check.values() for v in c.values())
    return 0 if math.isfinite(worst) and all("ours_error" not in r for r in rows) else 1


def kernel_times(torch, fn, calls: int) -> dict[str, float]:
    """GPU ms per call of each kernel (and torch op) fn launches: torch.profiler over `calls` calls."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else \
        [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        total = event.device_time_total if torch.cuda.is_available() else event.cpu_time_total
        if total > 0 and (torch.cuda.is_available() or event.key.endswith("_kernel")):
            times[event.key] = total / calls / 1e3
    return times


def kernel_table(times: dict[str, float], shard: Shard, gemm_flops: float, bandwidth: float) -> list[str]:
    """Rows: each kernel's ms per call, the backward's beside their roofline floor (and its share)."""
    floors = {name: floor_ms(flop, nbytes, gemm_flops, bandwidth) for name, flop, nbytes in kernels(shard)}
    lines = ["| kernel | ms | floor ms | floor / ms |", "|---|---|---|---|"]
    backward = floor_total = 0.0
    for name, ms in sorted(times.items(), key=lambda item: -item[1]):
        suffix = name.removesuffix("_kernel").rpartition("_backward_")[2] if "_backward_" in name else None
        floor = floors.get(suffix) if suffix else None
        if floor is not None:
            backward, floor_total = backward + ms, floor_total + floor
        cells = f"{floor:.2f} | {floor / ms:.0%}" if floor is not None else "- | -"
        lines.append(f"| {name} | {ms:.3f} | {cells} |")
    lines.append(f"| **moe_backward's kernels** | **{backward:.2f}** | **{floor_total:.2f}** | "
                 f"{floor_total / backward if backward else math.nan:.0%} |")
    return lines


def profile_step(torch, methods, leaves_of, step, key, T, gen, device, dtype, gemm_flops, args) -> list[str]:
    """--profile's and --variants' sections of the report (markdown lines)."""
    import triton.testing

    from k3compile.ops.layers import layer_module
    from k3compile.ops.moe import ARGUMENTS

    rate = gemm_flops if math.isfinite(gemm_flops) else 717e12
    bandwidth = args.bandwidth * 1e12
    shard = Shard.of(key, T)
    x = torch.randn(T, key.hidden_size, generator=gen, device=device, dtype=dtype)
    dout = torch.randn(x.shape, generator=gen, device=device, dtype=dtype)
    lines = []
    if args.profile:
        leaves = leaves_of(x)

        def train():
            for t in leaves.values():
                t.grad = None
            step(methods["ours"], leaves, dout)

        calls = 1 if args.smoke else 5
        lines += ["", f"Our training step per kernel at {T} tokens (torch.profiler, GPU ms per step, mean of {calls}); "
                  f"floors at {rate / 1e12:.0f} TFLOP/s and {args.bandwidth} TB/s (bench/moe_backward_roofline.py)",
                  ""] + kernel_table(kernel_times(torch, train, calls), shard, rate, bandwidth)
        del leaves
    if not args.variants:
        return lines
    from k3compile import compile as compile_spec
    from k3compile.spec import spec_from_table

    weights = {n: t.detach() for n, t in leaves_of(x).items() if n in ARGUMENTS and t is not None}
    default = layer_module(key)
    saved = default.moe_forward(**weights)
    names = [n for n in default.OUTPUT_DTYPES["moe_forward"] if n != "out"]
    reference = default.moe_backward(**weights, **dict(zip(names, saved[1:], strict=True)), dout=dout)
    lines += ["", f"moe_backward at {T} tokens under derive-moe-backward's options (each its own module and "
              "moe_forward; gradients: the largest RMS ratio against the default module's)", "",
              "| variant | options | moe_backward ms | gradients |", "|---|---|---|---|"]
    sections = []
    for variant in ["default:", *args.variants.split(";")]:
        if not variant.strip():
            continue
        name, _, options = variant.partition(":")
        try:
            if options.strip():
                pipeline = f"lower-moe-routing,lower-moe-experts,derive-moe-backward{{{options.strip()}}},outline-kernels"
                table = key.table() | {"name": f"{key.table()['name']}_{name.strip()}"}
                out_dir = args.out / "variants" / name.strip()
                module = compile_spec(spec_from_table(table, source=f"<variant {name}>"), out_dir=out_dir,
                                      pipeline=pipeline)
            else:
                module = default
            forward = module.moe_forward(**weights)
            tensors = dict(zip(names, forward[1:], strict=True))

            def backward(module=module, tensors=tensors):
                return module.moe_backward(**weights, **tensors, dout=dout)

            grads = backward()
            worst = max((((g.float() - r.float()).norm() / r.float().norm()).item()
                         for g, r in zip(grads, reference, strict=True)), default=0.0)
            ms = triton.testing.do_bench(backward, warmup=3, rep=50) if not args.smoke else math.nan
            lines.append(f"| {name} | {options.strip() or '(defaults)'} | {ms:.2f} | {worst:.1e} |")
            sections += ["", f"moe_backward per kernel, variant {name}", ""] + kernel_table(
                kernel_times(torch, backward, 1 if args.smoke else 5), Shard.of(key, T, options), rate, bandwidth)
            del forward, tensors, grads
        except Exception as err:  # noqa: BLE001 - a failing variant must not hide the others
            lines.append(f"| {name} | {options.strip()} | error | {short_error(err)} |")
    return lines + sections


if __name__ == "__main__":
    sys.exit(main())
