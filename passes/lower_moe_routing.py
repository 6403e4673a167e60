"""lower-moe-routing: k3.latent_moe -> a `route` entry that routes token rows from x to their
top-k experts and those experts' weights, in two kernels:

- `<layer>_router_logits`, a tiled GEMM: a program takes a block of token rows against a block
  of experts over one slice of the hidden columns (grid expert_block x row_block x
  hidden_slice), accumulates x W_r^T over blocks of its slice's columns and stores the partial
  logits in the `partial_logits` workspace [HS, R, E] fp32. Splitting the experts, and for a few
  rows the hidden columns too, over programs is what lets a few rows use the whole GPU: the
  router weight (12.8 MB at K3's dims) is streamed by many programs at once, not by one per row
  block. The slice count HS is chosen per call by its rows (legalize-triton): many slices for a
  few rows, one for many.
- `<layer>_router_top_k`: a program takes a block of rows with every expert's partial logits,
  sums them over the slices in order (deterministic: no atomics), applies the sigmoid, ranks the
  experts by score + bias, and stores the chosen ids and their unbiased scores, normalised and
  scaled. The sigmoid is here, not in the logits kernel: a slice's partial sum has none.

The stages follow from the layer op's attributes (d, E, top_k, norm_topk_prob,
routed_scaling_factor); `routing_stages` gives them to any entry that routes its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.ir.k3 import LatentMoEOp
from k3compile.passes.common import add_entries, argument_values, check_num_warps, make, tensor_arg


def routing_stages(op: LatentMoEOp, num_warps: int, tensors: dict[str, SSAValue]
                   ) -> tuple[list[k3s.TensorArgOp], list[k3s.KernelOp]]:
    """The routing of op's tokens as (its workspace arguments, its kernels), for an entry with the
    inputs x [R, d], router_weight [E, d] and router_bias [E] (fp32). The kernels write the
    tensors topk_ids [R, top_k] (index) and topk_weights [R, top_k] (float32), which the entry
    declares (as outputs, or as workspaces for its later kernels). `tensors`: the values of those
    five arguments by name."""
    d, E, top_k = op.hidden_size.value.data, op.num_experts.value.data, op.top_k.value.data
    layer = op.sym_name.data
    # sized by the call's slice count HS, not the largest any call takes: many rows take one
    # slice, and [largest, R, E] would be that many times the logits at every row count
    workspace = tensor_arg("partial_logits", k3s.tensor("HS", "R", E, dtype="float32"), "workspace")
    partial_logits = workspace.results[0]

    logits = make(k3s.RouterLogitsOp, operands=[tensors["x"], tensors["router_weight"]], hidden_size=d,
                  num_experts=E, result=("logits", k3s.tile("R", "E")))
    logits_kernel = make(
        k3s.KernelOp,
        [logits, make(k3s.StorePartialLogitsOp, operands=[logits.results[0], partial_logits])],
        sym_name=f"{layer}_router_logits",
        # experts fastest: the programs that run together share a block of x rows (read from
        # DRAM once, the rest from L2) and sweep the router weight, which L2 holds whole; row
        # blocks on axis 1, which CUDA caps at 65535 (millions of rows at legalize's blocks);
        # the hidden slices (a few) on axis 2
        grid=[GridAxis.EXPERT_BLOCK, GridAxis.ROW_BLOCK, GridAxis.HIDDEN_SLICE],
        num_warps=num_warps,
    )

    summed = make(k3s.SumPartialLogitsOp, operands=[partial_logits], num_experts=E,
                  result=("logits", k3s.tile("R", "E")))
    sigmoid = make(k3s.RouterSigmoidOp, operands=[summed.results[0]], result=("s", k3s.tile("R", "E")))
    chosen = make(k3s.SelectTopKOp, operands=[sigmoid.results[0], tensors["router_bias"]], top_k=top_k,
                  results=[("ids", k3s.tile("R", "KS")), ("w", k3s.tile("R", "KS"))])
    ids, unbiased = chosen.results
    weights = make(k3s.RoutingWeightsOp, operands=[unbiased], normalize=bool(op.norm_topk_prob.value.data),
                   scale=op.routed_scaling_factor.value.data, result=("weights", k3s.tile("R", "KS")))
    top_k_kernel = make(
        k3s.KernelOp,
        [summed, sigmoid, chosen, weights,
         make(k3s.StoreRoutingOp, operands=[ids, weights.results[0], tensors["topk_ids"], tensors["topk_weights"]])],
        sym_name=f"{layer}_router_top_k",
        grid=[GridAxis.ROW_BLOCK],
        num_warps=num_warps,
    )
    return [workspace], [logits_kernel, top_k_kernel]


def routing_inputs(op: LatentMoEOp) -> list[k3s.TensorArgOp]:
    """The router's tensor arguments: x, its weight and its selection bias."""
    d, E = op.hidden_size.value.data, op.num_experts.value.data
    return [
        tensor_arg("x", k3s.tensor("R", d, dtype="float")),
        tensor_arg("router_weight", k3s.tensor(E, d, dtype="float")),
        # the selection bias is added to scores in (0, 1) before ranking: fp32, as it is kept
        tensor_arg("router_bias", k3s.tensor(E, dtype="float32")),
    ]


def routing_outputs(op: LatentMoEOp, role: str) -> list[k3s.TensorArgOp]:
    """topk_ids [R, top_k] int32 and topk_weights [R, top_k] fp32, as outputs or workspaces."""
    top_k = op.top_k.value.data
    return [tensor_arg("topk_ids", k3s.tensor("R", top_k, dtype="index"), role),
            tensor_arg("topk_weights", k3s.tensor("R", top_k, dtype="float32"), role)]


def routing_entry(op: LatentMoEOp, num_warps: int) -> k3s.EntryOp:
    arguments = [*routing_inputs(op), *routing_outputs(op, "output")]
    workspaces, kernels = routing_stages(op, num_warps, argument_values(arguments))
    return make(k3s.EntryOp, [*arguments, *workspaces, *kernels],
                sym_name="route", source=SymbolRefAttr(op.sym_name))


@dataclass(frozen=True)
class LowerMoeRoutingPass(ModulePass):
    """Add a `route` entry (the router's logits and top-k kernels) for every k3.latent_moe."""

    name = "lower-moe-routing"
    num_warps: int = 8

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_num_warps(self.name, self.num_warps)
        add_entries(op, LatentMoEOp, lambda layer: routing_entry(layer, self.num_warps))
