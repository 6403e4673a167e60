"""The LatentMoE backward's kernels (derive-moe-backward's moe_backward) at a shard's size: each
kernel's GEMM flop and its DRAM bytes (every operand read once and every result written once, in
the dtype the module keeps it: bf16 activations and weights, fp32 where the backward keeps fp32),
and its roofline floor, max(flop / GEMM rate, bytes / bandwidth). A gathered operand (a token's
row read by each of its pairs) counts its rows once: L2 serves the other reads when the programs
that share them run together. The sum is the floor of the backward; bench/moe_train_gpu.py
--profile sets the measured time of each kernel beside it.

Beside it, each GEMM's operand traffic from L2 to the SMs: a program of a [BM, BN] output tile
loads BM + BN operand values per step of its reduction for 2 BM BN flop, so a GEMM moves
flop (BM + BN) / (BM BN) bytes of bf16 operands (67.6 GB for the expert down dgrad at 128 x 64,
33.8 GB at 128 x 256). On the H200 the expert gate/up dgrad (128 x 256) moved its 67.6 GB in
7.98 ms, 8.5 TB/s (bench/results/moe_train_h200_00db61c.md): a narrow tile can be bound by
that before its flop or DRAM bytes.

The kernels follow derive-moe-backward's options (--options, as the pass takes them): the tiles,
glu-adjoint (epilogue: the GLU's adjoint in the down dgrad, glu-dgrad-block-n columns; kernel:
the dgrad stores its product plainly, a row kernel `<act>_glu_adjoint` applies the routing
weight's terms and the adjoint) and sorted-wgrad-rows (copy: `<rows>_pair_rows` kernels copy the
routed wgrads' gathered rows in the pair list's order first).

    python3 bench/moe_backward_roofline.py                    # K3 shard: 64 experts, 8192 tokens
    python3 bench/moe_backward_roofline.py --tflops 717 --tbps 3.0 --tokens 8192 --experts 64
    python3 bench/moe_backward_roofline.py --options 'glu-adjoint=kernel sorted-wgrad-rows=copy'
"""

from __future__ import annotations

import argparse
import dataclasses
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
    # derive-moe-backward's options (its defaults)
    glu_adjoint: str = "epilogue"
    glu_dgrad_block_n: int = 64
    row_kernel_block_n: int = 64
    sorted_wgrad_rows: str = "gather"
    dgrad_block_r: int = 128
    dgrad_block_n: int = 256
    x_dgrad_block_n: int = 128
    wgrad_block_n: int = 128
    wgrad_block_d: int = 256

    @classmethod
    def of(cls, key, T: int, options: str = "") -> Shard:
        return cls(d=key.hidden_size, l=key.latent_dim, E=key.num_experts, k=key.top_k, F=key.expert_ffn_dim,
                   S=key.num_shared_experts, Fs=key.shared_ffn_dim, T=T).with_options(options)

    def with_options(self, options: str) -> Shard:
        """The shard under derive-moe-backward{options} ('glu-adjoint=kernel dgrad-block-n=128');
        options that move no byte or flop here are passed over."""
        fields = {f.name: f.type for f in dataclasses.fields(self)}
        values = {}
        for option in options.split():
            key, _, value = option.partition("=")
            name = key.replace("-", "_")
            if name in fields and name not in ("d", "l", "E", "k", "F", "S", "Fs", "E_router", "T"):
                values[name] = value if fields[name] == "str" else int(value)
        return dataclasses.replace(self, **values)

    @property
    def glu_row_block_n(self) -> int:
        """The columns of the kernel holding the expert GLU's output cotangent whole: its partial row dots."""
        return self.row_kernel_block_n if self.glu_adjoint == "kernel" else self.glu_dgrad_block_n


def kernels(s: Shard) -> list[tuple[str, float, float]]:
    """(kernel suffix, flop, DRAM bytes) of moe_backward's kernels in launch order."""
    T, d, l, E, k, F, SF = s.T, s.d, s.l, s.E, s.k, s.F, s.S * s.Fs
    Er = s.E_router or E
    P = T * k  # (token, slot) pairs (the padded list's rows are at most E * 127 more)
    bf, f32 = 2, 4
    dout, x, dx_rmw = T * d * bf, T * d * bf, 2 * T * d * f32
    partials = P * (F // s.glu_row_block_n) * f32  # the routing weights' partial row dots
    if s.glu_adjoint == "kernel":  # the dgrads store the product plainly; the row kernels read it,
        # the saved halves (and the activation for the row dots), write the halves' cotangents
        shared_glu = [("shared_down_dgrad", 2 * T * d * SF, dout + d * SF * bf + T * SF * bf),
                      ("shared_act_glu_adjoint", 0, T * SF * bf + 2 * T * 2 * SF * bf)]
        expert_glu = [("expert_down_dgrad", 2 * P * l * F, T * l * bf + E * l * F * bf + P * F * bf),
                      ("expert_act_glu_adjoint", 0, 2 * P * F * bf + 2 * P * 2 * F * bf + partials + P * f32)]
    else:  # + saved (act,) g, u; out_bar; the partial row dots
        shared_glu = [("shared_down_dgrad", 2 * T * d * SF, dout + d * SF * bf + 2 * T * 2 * SF * bf)]
        expert_glu = [("expert_down_dgrad", 2 * P * l * F,
                       T * l * bf + E * l * F * bf + P * F * bf + 2 * P * 2 * F * bf + partials)]
    if s.sorted_wgrad_rows == "copy":  # the gathered rows (and the routing weights) copied, then read in order
        down_wgrad = [("combined_bar_pair_rows", 0, T * l * bf + P * f32 + P * l * bf),
                      ("expert_down_wgrad", 2 * P * l * F, P * l * bf + P * F * bf + E * l * F * bf)]
        gate_up_wgrad = [("h_pair_rows", 0, T * l * bf + P * l * bf),
                         ("expert_gate_up_wgrad", 2 * P * 2 * F * l, P * 2 * F * bf + P * l * bf + E * 2 * F * l * bf)]
    else:
        down_wgrad = [("expert_down_wgrad", 2 * P * l * F, T * l * bf + P * F * bf + E * l * F * bf)]
        gate_up_wgrad = [("expert_gate_up_wgrad", 2 * P * 2 * F * l, P * 2 * F * bf + T * l * bf + E * 2 * F * l * bf)]
    rows = [
        ("shared_down_wgrad", 2 * T * d * SF, dout + T * SF * bf + d * SF * bf),
        *shared_glu,
        ("shared_gate_up_dgrad", 2 * T * 2 * SF * d, T * 2 * SF * bf + 2 * SF * d * bf + dx_rmw),
        ("shared_gate_up_wgrad", 2 * T * 2 * SF * d, T * 2 * SF * bf + x + 2 * SF * d * bf),
        ("latent_up_dgrad", 2 * T * d * l, dout + d * l * bf + T * l * f32),
        ("combined_rms_norm_adjoint", 0, 2 * (T * l * f32 + T * l * f32) + T * l * bf),  # two passes
        ("latent_norm_gain_grad", 0, 2 * T * l * f32),
        ("latent_up_wgrad", 2 * T * d * l, dout + T * l * f32 + d * l * bf),
        *down_wgrad,
        *expert_glu,
        ("expert_gate_up_dgrad", 2 * P * 2 * F * l, P * 2 * F * bf + E * 2 * F * l * bf + P * l * bf),
        ("h_sum_slots", 0, P * l * bf + T * l * bf),
        *gate_up_wgrad,
        ("latent_down_dgrad", 2 * T * l * d, T * l * bf + l * d * bf + dx_rmw),
        ("latent_down_wgrad", 2 * T * l * d, T * l * bf + x + l * d * bf),
        ("router_logits", 2 * T * d * Er, x + Er * d * bf + T * Er * f32),  # recomputed
        ("router", 0, 2 * T * Er * f32 + partials),
        ("router_weight_dgrad", 2 * T * Er * d, T * Er * f32 + Er * d * bf + dx_rmw),
        ("router_weight_wgrad", 2 * T * Er * d, T * Er * f32 + x + Er * d * bf),
    ]
    return [(name, float(flop), float(nbytes)) for name, flop, nbytes in rows]


def gemm_tiles(s: Shard) -> dict[str, tuple[int, int]]:
    """The [BM, BN] output tile of each GEMM kernel under the shard's options (dgrads: rows x the
    input's columns, by what the epilogue holds; wgrads: the weight's [BN, BD])."""
    glu_columns = s.glu_dgrad_block_n if s.glu_adjoint == "epilogue" else s.dgrad_block_n
    dgrad = {"shared_down": glu_columns, "shared_gate_up": s.x_dgrad_block_n, "latent_up": s.dgrad_block_n,
             "expert_down": glu_columns, "expert_gate_up": s.dgrad_block_n, "latent_down": s.x_dgrad_block_n,
             "router_weight": s.x_dgrad_block_n}
    tiles = {f"{weight}_dgrad": (s.dgrad_block_r, block_n) for weight, block_n in dgrad.items()}
    return tiles | {f"{weight}_wgrad": (s.wgrad_block_n, s.wgrad_block_d) for weight in dgrad}


def l2_bytes(s: Shard, name: str, flop: float) -> float | None:
    """A GEMM kernel's bf16 operand traffic from L2 to the SMs, flop (BM + BN) / (BM BN); None for
    the others."""
    tile = gemm_tiles(s).get(name)
    return flop * (tile[0] + tile[1]) / (tile[0] * tile[1]) if tile and flop else None


def floor_ms(flop: float, nbytes: float, flops: float, bandwidth: float) -> float:
    return max(flop / flops, nbytes / bandwidth) * 1e3


def table(s: Shard, flops: float, bandwidth: float) -> list[str]:
    lines = ["| kernel | GFLOP | MB | L2 -> SM GB | compute ms | memory ms | floor ms |",
             "|---|---|---|---|---|---|---|"]
    total = [0.0, 0.0, 0.0]
    for name, flop, nbytes in kernels(s):
        floor = floor_ms(flop, nbytes, flops, bandwidth)
        total = [total[0] + flop, total[1] + nbytes, total[2] + floor]
        l2 = l2_bytes(s, name, flop)
        lines.append(f"| {name} | {flop / 1e9:.0f} | {nbytes / 1e6:.0f} | {'-' if l2 is None else f'{l2 / 1e9:.1f}'} | "
                     f"{flop / flops * 1e3:.2f} | {nbytes / bandwidth * 1e3:.2f} | {floor:.2f} |")
    lines.append(f"| **backward** | {total[0] / 1e9:.0f} | {total[1] / 1e6:.0f} | | {total[0] / flops * 1e3:.2f} | "
                 f"{total[1] / bandwidth * 1e3:.2f} | **{total[2]:.2f}** |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--tflops", type=float, default=717.0, help="the measured bf16 GEMM rate")
    parser.add_argument("--tbps", type=float, default=3.0, help="DRAM bandwidth, TB/s")
    parser.add_argument("--options", default="", help="derive-moe-backward's options, e.g. 'glu-adjoint=kernel'")
    args = parser.parse_args()
    s = Shard(T=args.tokens, E=args.experts).with_options(args.options)
    print("\n".join(table(s, args.tflops * 1e12, args.tbps * 1e12)))


if __name__ == "__main__":
    main()
