"""The compiled LatentMoE layer on the GPU at a spec's dimensions (K3's: examples/latent_moe.toml),
bf16, side by side in one process with torch pipelines of the same semantics:

- decode (T = 1 .. 64 tokens): our token-centric `moe_decode` and expert-centric `moe_prefill`,
  torch with a loop over the experts the tokens touch; each against the weight-bytes floor (the
  distinct experts touched, the shared experts, the latent projections and the router, over the
  copy bandwidth measured in the same run);
- prefill (T = 2048 .. 32768): `moe_prefill`, torch's per-expert loop and torch._grouped_mm
  (where the installed torch has it), in TFLOP/s against the bf16 GEMM rate measured in the same
  run (an 8192^3 torch.matmul).
Each output is checked against the per-expert torch pipeline in fp32 (RMS ratio reported). A
module whose layer has expert_weight_format = mxfp4 (examples/latent_moe_mxfp4.toml) is timed on
the weights packed by its own pack_expert_weights (in the layout its kernels read: nibbles, or
words under lower-moe-experts{decode=warp}); torch runs the dequantised weights (exact in bf16),
so the RMS ratios compare the same layer, and the decode floor counts the packed bytes.
Needs only torch and triton:

    python -c "import k3compile; k3compile.compile('examples/latent_moe.toml', 'bench/generated/moe')"
    python3 bench/moe_gpu.py --module bench/generated/moe/latent_moe.py --out DIR   # on the GPU

Writes DIR/moe.md (the table, also printed) and DIR/moe.json (the rows, for bench/moe_plot.py).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
from common import import_file, ints, short_error  # noqa: E402


def layer_attributes(module) -> dict[str, str]:
    found = re.search(r"k3\.latent_moe @\w+ <([^>]*)>", module.__doc__ or "")
    if found is None:
        raise ValueError(f"{module.__file__}: no k3.latent_moe op in its docstring")
    return dict(item.split(" = ", 1) for item in found[1].split(", "))


class TorchMoe:
    """The layer's semantics in torch ops (bf16 GEMMs with fp32 accumulation, fp32 routing and
    activations): the routed experts by a loop over the experts with rows, or by
    torch._grouped_mm over the rows sorted by expert."""

    def __init__(self, torch, attributes: dict, weights: dict) -> None:
        self.torch, self.w = torch, weights
        self.k, self.E = int(attributes["top_k"]), int(attributes["num_experts"])
        self.latent = int(attributes["latent_dim"]) > 0
        self.S = int(attributes["num_shared_experts"]) if int(attributes["shared_ffn_dim"]) else 0
        self.situ = attributes["activation"] == "situ_glu"
        self.normalize = attributes["norm_topk_prob"] == "true"
        self.scale, self.eps = float(attributes["routed_scaling_factor"]), float(attributes["eps"])

    def glu(self, gate_up):
        g, u = gate_up.float().chunk(2, dim=-1)
        torch = self.torch
        if self.situ:
            return 4 * torch.tanh(g / 4) * torch.sigmoid(g) * 25 * torch.tanh(u / 25)
        return torch.nn.functional.silu(g) * u

    def route(self, x):
        s = self.torch.sigmoid((x @ self.w["router_weight"].to(x.dtype).T).float())
        ids = self.torch.topk(s + self.w["router_bias"], self.k, dim=-1).indices
        weights = s.gather(-1, ids)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return ids, weights * self.scale

    def __call__(self, x, grouped: bool = False, fp32: bool = False):
        torch, w = self.torch, self.w
        cast = (lambda t: t.float()) if fp32 else (lambda t: t)  # noqa: E731
        x = cast(x)
        ids, weights = self.route(x)
        h = x @ cast(w["latent_down"]).T if self.latent else x
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        rows = order // self.k
        if grouped:
            counts = torch.bincount(flat, minlength=self.E)
            offsets = torch.cumsum(counts, 0).to(torch.int32)
            act = self.glu(torch._grouped_mm(h[rows], w["expert_gate_up"].transpose(1, 2), offs=offsets))
            out_rows = torch._grouped_mm(act.to(h.dtype), w["expert_down"].transpose(1, 2), offs=offsets)
        else:
            out_rows = torch.empty(rows.numel(), h.shape[1], dtype=h.dtype, device=h.device)
            counts = torch.bincount(flat, minlength=self.E).tolist()
            start = 0
            for e, count in enumerate(counts):
                if count:
                    part = h[rows[start:start + count]]
                    act = self.glu(part @ cast(w["expert_gate_up"][e]).T).to(h.dtype)
                    out_rows[start:start + count] = act @ cast(w["expert_down"][e]).T
                    start += count
        combined = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        combined.index_add_(0, rows, out_rows.float() * weights.flatten()[order, None])
        if self.latent:
            combined = combined * torch.rsqrt(combined.pow(2).mean(-1, keepdim=True) + self.eps)
            out = (combined * w["latent_norm_gain"].float()).to(x.dtype) @ cast(w["latent_up"]).T
        else:
            out = combined.to(x.dtype)
        for s in range(self.S):
            out = out + (self.glu(x @ cast(w["shared_gate_up"][s]).T).to(x.dtype) @ cast(w["shared_down"][s]).T)
        return out


def dequantize_mxfp4_(torch, weight, packed, scales) -> None:
    """weight[e] = the MXFP4 weights of packed[e] and scales[e] (the module's layout, docs/moe.md:
    byte j of a block of 32 holds inputs j and j + 16), one expert at a time; exact in bf16."""
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], device=weight.device)
    for e in range(weight.shape[0]):
        codes = packed[e].long().reshape(*packed.shape[1:-1], -1, 16)
        blocks = torch.cat([values[codes & 15], values[codes >> 4]], dim=-1)
        scale = (scales[e].int() << 23).view(torch.float32)  # 2^(s - 127)
        weight[e] = (blocks * scale[..., None]).reshape(weight.shape[1:]).to(weight.dtype)


def profile(torch, module, weights, x, schedule: str) -> tuple[str, int, list[tuple[str, float]]]:
    """(schedule, T, [(kernel, mean GPU µs per call)]) of 10 calls of moe_<schedule>."""
    entry = getattr(module, f"moe_{schedule}")
    entry(**weights, x=x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            entry(**weights, x=x)
        torch.cuda.synchronize()
    kernels = [(e.key, e.device_time_total / 10) for e in prof.key_averages() if e.device_time_total > 0]
    return schedule, x.shape[0], sorted(kernels, key=lambda k: -k[1])


def main(argv=None) -> int:
    import torch
    import triton
    import triton.testing

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--decode", type=ints, default=[1, 4, 16, 32, 64], help="token counts of the decode table")
    parser.add_argument("--prefill", type=ints, default=[2048, 8192, 32768], help="token counts of the prefill table")
    parser.add_argument("--profile", type=ints, default=[], help="token counts to profile per kernel (torch.profiler)")
    args = parser.parse_args(argv)
    module = import_file(args.module, "moe_module")
    a = layer_attributes(module)
    d, l, E, k, F = (int(a[n]) for n in ("hidden_size", "latent_dim", "num_experts", "top_k", "expert_ffn_dim"))
    S, Fs = int(a["num_shared_experts"]), int(a["shared_ffn_dim"])
    w_ = l or d
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0, shift=0.0, dtype=torch.bfloat16):
        # drawn in the dtype itself: K3's expert weights are 59 GB in bf16, twice that in fp32
        return torch.randn(*shape, generator=gen, device="cuda", dtype=dtype).mul_(scale).add_(shift)

    weights = {"router_weight": randn(E, d, scale=2 / d**0.5), "router_bias": randn(E, scale=0.1, dtype=torch.float32),
               "expert_gate_up": randn(E, 2 * F, w_, scale=w_**-0.5), "expert_down": randn(E, w_, F, scale=F**-0.5)}
    if l:
        weights |= {"latent_down": randn(l, d, scale=d**-0.5), "latent_up": randn(d, l, scale=l**-0.5),
                    "latent_norm_gain": randn(l, scale=0.2, shift=1.0)}
    if S and Fs:
        weights |= {"shared_gate_up": randn(S, 2 * Fs, d, scale=d**-0.5), "shared_down": randn(S, d, Fs, scale=Fs**-0.5)}
    fixed_bytes = sum(weights[n].numel() * weights[n].element_size() for n in weights if not n.startswith("expert_"))
    mxfp4 = a.get("expert_weight_format") == "mxfp4"
    ours = weights  # what the module's entries take
    if mxfp4:
        nibbles = module.pack_expert_weights(weights["expert_gate_up"], weights["expert_down"], layout="nibbles")
        for name in ("expert_gate_up", "expert_down"):  # torch's weights: the ones our kernels decode
            dequantize_mxfp4_(torch, weights[name], nibbles[f"{name}_packed"], nibbles[f"{name}_scales"])
        del nibbles
        # ours in the module's layout (words under decode=warp), packed from the dequantised
        # weights: the same values (E2M1 values times the same block scales pack as themselves)
        packed = module.pack_expert_weights(weights["expert_gate_up"], weights["expert_down"])
        ours = {n: t for n, t in weights.items() if not n.startswith("expert_")} | packed
    torch_moe = TorchMoe(torch, a, weights)
    # a touched expert's gate/up and down weights: bf16, or MXFP4's half byte a weight plus a scale byte per 32
    expert_bytes = 3 * w_ * F * ((1 / 2 + 1 / 32) if mxfp4 else 2)

    scratch = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    copy_Bps = 2 * scratch.numel() / (triton.testing.do_bench(lambda: scratch.clone()) * 1e-3)
    del scratch
    square = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    gemm_flops = 2 * 8192**3 / (triton.testing.do_bench(lambda: square @ square) * 1e-3)
    del square

    def rms_ratio(out, ref):
        return ((out.float() - ref.float()).norm() / ref.float().norm()).item()

    def timed(row, name, fn, ref):
        try:
            out = fn()
            row[f"{name}_rms"] = rms_ratio(out, ref)
            row[f"{name}_ms"] = triton.testing.do_bench(fn, warmup=5, rep=50)
        except Exception as err:  # noqa: BLE001 - one failing method must not hide the others
            row[f"{name}_error"] = short_error(err)

    rows = []
    for phase, counts in (("decode", args.decode), ("prefill", args.prefill)):
        for T in counts:
            x = randn(T, d)
            ids, _ = torch_moe.route(x)
            touched = int(torch.unique(ids).numel())
            row = {"phase": phase, "T": T, "experts_touched": touched,
                   "floor_ms": (touched * expert_bytes + fixed_bytes) / copy_Bps * 1e3,
                   "flop": 2 * T * (k * 3 * w_ * F + (3 * d * Fs * S if Fs else 0) + (2 * d * l) + d * E)}
            ref = torch_moe(x, fp32=True)
            # the token-centric schedule only at decode sizes (a program per (token, slot) and FFN block)
            methods = {"ours_decode": lambda x=x: module.moe_decode(**ours, x=x)[0]} if phase == "decode" else {}
            methods |= {"ours_prefill": lambda x=x: module.moe_prefill(**ours, x=x)[0],
                        "torch_loop": lambda x=x: torch_moe(x)}
            if hasattr(torch, "_grouped_mm"):
                methods["torch_grouped_mm"] = lambda x=x: torch_moe(x, grouped=True)
            for name, fn in methods.items():
                timed(row, name, fn, ref)
            if phase == "decode":  # as a server runs decode: in a CUDA graph (torch's pipelines sync)
                for name in ("ours_decode", "ours_prefill"):
                    try:
                        row[f"{name}_graph_ms"] = triton.testing.do_bench_cudagraph(methods[name], rep=50)
                    except Exception as err:  # noqa: BLE001
                        row[f"{name}_graph_error"] = short_error(err)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del ref

    profiles = [profile(torch, module, ours, randn(T, d), schedule) for T in args.profile
                for schedule in ("decode", "prefill")]
    weight_format = ("expert_weight_format mxfp4: our routed experts' weights MXFP4 (packed by the module's "
                     "pack_expert_weights, dequantised in registers), torch's the dequantised bf16 ones, the rest bf16"
                     if mxfp4 else "expert_weight_format bf16: bf16 weights")
    head = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
            f"d {d}, latent {l}, {E} experts top-{k}, FFN {F}, {S} shared x {Fs}, {a['activation']}; {weight_format} "
            f"and bf16 activations; copy bandwidth {copy_Bps / 1e12:.2f} TB/s, bf16 GEMM {gemm_flops / 1e12:.0f} TFLOP/s "
            "(8192^3 torch.matmul); RMS ratio against the per-expert torch pipeline in fp32")
    methods = ["ours_decode", "ours_prefill", "torch_loop", "torch_grouped_mm"]

    def cell(row, name, unit):
        if f"{name}_error" in row:
            return "error"
        if f"{name}_ms" not in row:
            return "-"
        ms = row[f"{name}_ms"]
        value = {"ms": f"{ms * 1e3:.0f} µs" if ms < 1 else f"{ms:.2f} ms",
                 "tflops": f"{row['flop'] / ms / 1e9:.0f}"}[unit]
        return f"{value} ({row[f'{name}_rms']:.1e})"

    def graph(row, name):
        ms = row.get(f"{name}_graph_ms")
        return "error" if f"{name}_graph_error" in row else f"{ms * 1e3:.0f} µs ({row['floor_ms'] / ms:.0%})"

    lines = [head, "", "Decode: time (RMS ratio); in a CUDA graph: time (share of the weight-bytes floor)", "",
             "| T | experts touched | floor µs | " + " | ".join(methods)
             + " | ours_decode, graph | ours_prefill, graph |", "|---|---|---|" + "---|" * (len(methods) + 2)]
    for row in [r for r in rows if r["phase"] == "decode"]:
        lines.append(f"| {row['T']} | {row['experts_touched']} | {row['floor_ms'] * 1e3:.0f} | "
                     + " | ".join(cell(row, m, "ms") for m in methods)
                     + f" | {graph(row, 'ours_decode')} | {graph(row, 'ours_prefill')} |")
    lines += ["", f"Prefill: TFLOP/s (RMS ratio), against {gemm_flops / 1e12:.0f} TFLOP/s", "",
              "| T | TFLOP | " + " | ".join(methods[1:]) + " | ours / grouped_mm |", "|---|---|" + "---|" * len(methods)]
    for row in [r for r in rows if r["phase"] == "prefill"]:
        ratio = (f"{row['torch_grouped_mm_ms'] / row['ours_prefill_ms']:.2f}"
                 if "torch_grouped_mm_ms" in row and "ours_prefill_ms" in row else "-")
        lines.append(f"| {row['T']} | {row['flop'] / 1e12:.1f} | "
                     + " | ".join(cell(row, m, "tflops") for m in methods[1:]) + f" | {ratio} |")
    for schedule, T, kernels in profiles:
        lines += ["", f"moe_{schedule} at T = {T}: GPU time per kernel (torch.profiler, mean of 10 calls)", "",
                  "| kernel | µs |", "|---|---|"] + [f"| {name} | {us:.1f} |" for name, us in kernels]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe.md").write_text("\n".join(lines) + "\n")
    (args.out / "moe.json").write_text(json.dumps({"head": head, "format": "mxfp4" if mxfp4 else "bf16",
                                                   "copy_Bps": copy_Bps, "gemm_flops": gemm_flops, "rows": rows},
                                                  indent=1))
    print("\n".join(lines))
    return 0 if all(math.isfinite(r.get("ours_decode_rms", r.get("ours_prefill_rms", math.nan))) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
