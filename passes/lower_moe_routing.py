"""lower-moe-routing: k3.latent_moe -> a `route` entry, one kernel that routes a block of token
rows from x to its top-k experts and their weights in one pass over x and the router.

The router's logits, sigmoid, top-k selection by score + bias and the weights' normalisation
and scaling are fused: a program holds its rows' scores for every expert, so nothing but the
chosen ids and weights leaves the chip. The stages follow from the layer op's attributes (d,
E, top_k, norm_topk_prob, routed_scaling_factor).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import LatentMoEOp
from k3compile.passes.common import add_entries, check_num_warps, make


def routing_stages(op: LatentMoEOp, num_warps: int) -> tuple[list[k3s.TensorArgOp], list[k3s.KernelOp]]:
    """The routing's workspaces and kernels, which write topk_ids and topk_weights (the caller
    declares those)."""
    d, E, top_k = op.hidden_size.value.data, op.num_experts.value.data, op.top_k.value.data
    logits = make(k3s.RouterLogitsOp, hidden_size=d, num_experts=E, result=("logits", k3s.tile("R", "E")))
    scores = make(k3s.RouterSigmoidOp, operands=[logits.results[0]], result=("s", k3s.tile("R", "E")))
    chosen = make(k3s.SelectTopKOp, operands=[scores.results[0]], top_k=top_k,
                  results=[("ids", k3s.tile("R", "KS")), ("w", k3s.tile("R", "KS"))])
    ids, unbiased = chosen.results
    weights = make(k3s.RoutingWeightsOp, operands=[unbiased], normalize=bool(op.norm_topk_prob.value.data),
                   scale=op.routed_scaling_factor.value.data, result=("weights", k3s.tile("R", "KS")))
    kernel = make(
        k3s.KernelOp,
        [logits, scores, chosen, weights, make(k3s.StoreRoutingOp, operands=[ids, weights.results[0]])],
        sym_name=f"{op.sym_name.data}_route",
        grid="row_block",
        num_warps=num_warps,
    )
    return [], [kernel]


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


def tensor_arg(sym_name: str, type: k3s.TensorType, role: str = "input", **values) -> k3s.TensorArgOp:
    return make(k3s.TensorArgOp, sym_name=sym_name, type=type, role=role, **values)


def routing_entry(op: LatentMoEOp, num_warps: int) -> k3s.EntryOp:
    workspaces, kernels = routing_stages(op, num_warps)
    return make(k3s.EntryOp, [*routing_inputs(op), *routing_outputs(op, "output"), *workspaces, *kernels],
                sym_name="route", source=op.sym_name.data)


@dataclass(frozen=True)
class LowerMoeRoutingPass(ModulePass):
    """Add a `route` entry (the fused router kernel) for every k3.latent_moe."""

    name = "lower-moe-routing"
    num_warps: int = 8

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_num_warps(self.name, self.num_warps)
        add_entries(op, LatentMoEOp, lambda layer: routing_entry(layer, self.num_warps))
