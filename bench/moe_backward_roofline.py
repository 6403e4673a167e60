"""The LatentMoE backward's kernels (derive-moe-backward's moe_backward) at a shard's size: each
kernel's GEMM flop and its DRAM bytes (every operand read once and every result written once, in
the dtype the module keeps it: bf16 activations and weights, fp32 where the backward keeps fp32),
and its roofline floor, max(flop / GEMM rate, bytes / bandwidth). A gathered operand (a token's
row read by each of its pairs) counts its rows once: L2 serves the other reads when the programs
that share them run together. The sum is the floor of the backward; bench/moe_train_gpu.py
--profile sets the measured time of each kernel beside it.

    python3 bench/moe_backward_roofline.py                    # K3 shard: 64 experts, 8192 tokens
    python3 bench/moe_backward_roofline.py --tflops 717 --tbps 3.0 --tokens 8192 --experts 64
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    d: int = 7168  # hidden
    l: int = 3584  # latent (the routed experts' width)  # noqa: E741
    E: int = 64  # local experts
    k: int = 16  # top-k
    F: int = 3072  # expert FFN
    S: int = 2  # shared experts
    Fs: int = 3072  # shared FFN
    E_router: int | None = None  # the router's experts (the shard's, as the bench's layer)
    T: int = 8192  # tokens
    glu_block_n: int = 64  # the expert down dgrad's column blocks (its routing-weight partials)

    @classmethod
    def of(cls, key, T: int) -> Shard:
        return cls(d=key.hidden_size, l=key.latent_dim, E=key.num_experts, k=key.top_k, F=key.expert_ffn_dim,
                   S=key.num_shared_experts, Fs=key.shared_ffn_dim, T=T)


def kernels(s: Shard) -> list[tuple[str, float, float]]:
    """(kernel suffix, flop, DRAM bytes) of moe_backward's kernels in launch order."""
    T, d, l, E, k, F, SF = s.T, s.d, s.l, s.E, s.k, s.F, s.S * s.Fs
    Er = s.E_router or E
    P = T * k  # (token, slot) pairs (the padded list's rows are at most E * 127 more)
    bf, f32 = 2, 4
    dout, x, dx_rmw = T * d * bf, T * d * bf, 2 * T * d * f32
    rows = [
        ("shared_down_wgrad", 2 * T * d * SF, dout + T * SF * bf + d * SF * bf),
        ("shared_down_dgrad", 2 * T * d * SF, dout + d * SF * bf + 2 * T * 2 * SF * bf),  # + saved g, u; out_bar
        ("shared_gate_up_dgrad", 2 * T * 2 * SF * d, T * 2 * SF * bf + 2 * SF * d * bf + dx_rmw),
        ("shared_gate_up_wgrad", 2 * T * 2 * SF * d, T * 2 * SF * bf + x + 2 * SF * d * bf),
        ("latent_up_dgrad", 2 * T * d * l, dout + d * l * bf + T * l * f32),
        ("combined_rms_norm_adjoint", 0, 2 * (T * l * f32 + T * l * f32) + T * l * bf),  # two passes
        ("latent_norm_gain_grad", 0, 2 * T * l * f32),
        ("latent_up_wgrad", 2 * T * d * l, dout + T * l * f32 + d * l * bf),
        ("expert_down_wgrad", 2 * P * l * F, T * l * bf + P * F * bf + E * l * F * bf),
        ("expert_down_dgrad", 2 * P * l * F,  # + saved act, g, u; out_bar; the partial row dots
         T * l * bf + E * l * F * bf + P * F * bf + 2 * P * 2 * F * bf + P * (F // s.glu_block_n) * f32),
        ("expert_gate_up_dgrad", 2 * P * 2 * F * l, P * 2 * F * bf + E * 2 * F * l * bf + P * l * bf),
        ("h_sum_slots", 0, P * l * bf + T * l * bf),
        ("expert_gate_up_wgrad", 2 * P * 2 * F * l, P * 2 * F * bf + T * l * bf + E * 2 * F * l * bf),
        ("latent_down_dgrad", 2 * T * l * d, T * l * bf + l * d * bf + dx_rmw),
        ("latent_down_wgrad", 2 * T * l * d, T * l * bf + x + l * d * bf),
        ("router_logits", 2 * T * d * Er, x + Er * d * bf + T * Er * f32),  # recomputed
        ("router", 0, 2 * T * Er * f32 + T * k * (F // s.glu_block_n) * f32),
        ("router_weight_dgrad", 2 * T * Er * d, T * Er * f32 + Er * d * bf + dx_rmw),
        ("router_weight_wgrad", 2 * T * Er * d, T * Er * f32 + x + Er * d * bf),
    ]
    return [(name, float(flop), float(nbytes)) for name, flop, nbytes in rows]


def floor_ms(flop: float, nbytes: float, flops: float, bandwidth: float) -> float:
    return max(flop / flops, nbytes / bandwidth) * 1e3


def table(s: Shard, flops: float, bandwidth: float) -> list[str]:
    lines = ["| kernel | GFLOP | MB | compute ms | memory ms | floor ms |", "|---|---|---|---|---|---|"]
    total = [0.0, 0.0, 0.0]
    for name, flop, nbytes in kernels(s):
        floor = floor_ms(flop, nbytes, flops, bandwidth)
        total = [total[0] + flop, total[1] + nbytes, total[2] + floor]
        lines.append(f"| {name} | {flop / 1e9:.0f} | {nbytes / 1e6:.0f} | {flop / flops * 1e3:.2f} | "
                     f"{nbytes / bandwidth * 1e3:.2f} | {floor:.2f} |")
    lines.append(f"| **backward** | {total[0] / 1e9:.0f} | {total[1] / 1e6:.0f} | {total[0] / flops * 1e3:.2f} | "
                 f"{total[1] / bandwidth * 1e3:.2f} | **{total[2]:.2f}** |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--tflops", type=float, default=717.0, help="the measured bf16 GEMM rate")
    parser.add_argument("--tbps", type=float, default=3.0, help="DRAM bandwidth, TB/s")
    args = parser.parse_args()
    s = Shard(T=args.tokens, E=args.experts)
    print("\n".join(table(s, args.tflops * 1e12, args.tbps * 1e12)))


if __name__ == "__main__":
    main()
