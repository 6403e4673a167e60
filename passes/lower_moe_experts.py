"""lower-moe-experts: k3.latent_moe -> the layer's entries: `moe_prefill` (expert-centric),
`moe_decode` (token-centric) and `moe`, which picks one by the token count.

The stages follow from the layer op: the routing (lower-moe-routing's kernels); with latent_dim
> 0 the latent down-projection before the experts and the RMSNorm fused into the latent
up-projection after them (latent_dim = 0: none, the experts run at full width); the routed
experts' GLU (gate and up halves of one weight, one pass over the input) and down projection;
with shared experts a dense GLU over all of them at once (their FFNs side by side) whose down
projection adds to the output.

How the routed experts run is the dispatch plan:
- expert-centric (prefill): the (token, slot) pairs are grouped by expert on the device (count,
  pad each expert's run to whole blocks of block_rows, scatter) with no host synchronisation;
  each program of the GLU and down kernels multiplies one block of one expert's pairs with that
  expert's weights; the down kernel writes each pair's weighted output, and a combine sums each
  token's slots in slot order (deterministic: no atomics on outputs).
- token-centric (decode), decode = split: one program per (pair, block of FFN columns) for the
  GLU, and per (token, block of output columns) for the down projection, which accumulates the
  token's weighted slots in registers: no sorting, no padding, no per-pair output buffer.
- token-centric, decode = warp (WarpDecode, split by output neurons): a program per (token,
  block of FFN columns) holds all the token's slots as a tile axis (k3s.project_token_slots)
  and streams each slot's expert gate/up rows whole, its GLU stored per (token, slot); a program
  per (token, block of output rows) streams the slots' down rows in teams of warp-slots (a tile
  axis), accumulating the weighted teams in fp32 registers and reducing over the slot axis at
  the end (k3s.sum_expert_rows). The GLU output goes through the small [R, top_k, F] fp32 buffer:
  a down program owns output rows and needs every FFN column of every slot, which a program
  covering the whole FFN in registers would recompute per block of output rows (w / BN times
  the gate/up bytes).

The training forward (derive-moe-backward's moe_forward) is the expert-centric plan built with
saving: the tensors its backward reads are outputs, the GLUs' pre-activations are stored too, and
the pair list is built in pair order (k3s.rank_pairs, k3s.chunk_offsets) rather than by atomic
ranks, which fixes the order the experts' weight gradients sum in.

With expert_weight_format = mxfp4 the routed experts' weights are each two arguments, packed
values and scales (<name>_packed, <name>_scales), and the projections that read them say
weight_format = mxfp4 (the latent and shared experts' weights stay in the layer's dtype). Their
layout is the decode plan's choice, written on every stage that reads them: decode = split reads
nibbles (two codes a byte, the default: no packing property), decode = warp words (packing =
words: eight codes a 32-bit word, fp4x8, dequantised by two shifts and a bit-select per two
values and one multiply per block of 32); the layer's moe_prefill reads the same layout, since
`moe` passes both entries the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, SymbolRefAttr
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.ir.choices import WeightFormat
from k3compile.ir.k3 import LatentMoEOp
from k3compile.passes.common import (
    add_entries,
    argument_values,
    check_num_warps,
    check_power_of_two,
    make,
    props,
    tensor_arg,
)
from k3compile.passes.moe_dispatch import DECODE_PLANS, H100_TABLE, Bucket, parse_table, spell_table
from k3compile.passes.lower_moe_routing import (
    LowerMoeRoutingPass,
    routing_inputs,
    routing_outputs,
    routing_stages,
)


@dataclass(frozen=True)
class Widths:
    """The layer's widths: d hidden, w the experts' (latent or d), F expert FFN, k top_k, E
    experts, S shared experts of Fs each."""

    d: int
    w: int
    F: int
    k: int
    E: int
    S: int
    Fs: int
    latent: bool
    mxfp4: bool  # the routed experts' weights as MXFP4
    packing: k3s.Packing = k3s.Packing.NIBBLES  # MXFP4's layout, the same for every entry of the layer

    @classmethod
    def of(cls, op: LatentMoEOp, packing: k3s.Packing = k3s.Packing.NIBBLES) -> Widths:
        value = lambda name: getattr(op, name).value.data  # noqa: E731
        latent = value("latent_dim") > 0
        shared = value("num_shared_experts") if value("shared_ffn_dim") > 0 else 0
        return cls(d=value("hidden_size"), w=value("latent_dim") if latent else value("hidden_size"),
                   F=value("expert_ffn_dim"), k=value("top_k"), E=value("num_experts"), S=shared,
                   Fs=value("shared_ffn_dim"), latent=latent, mxfp4=op.weight_format == WeightFormat.MXFP4,
                   packing=packing)


def expert_weight(n: Widths, name: str) -> dict:
    """What a projection reads of the routed experts' weight `name`: the tensor, or with MXFP4 the
    packed values (`name`_packed) and their scales (`name`_scales), its weight_format and, words,
    its packing (nibbles, the default, is left out)."""
    if n.mxfp4:
        words = {"packing": n.packing.value} if n.packing == k3s.Packing.WORDS else {}
        return dict(weight=f"{name}_packed", weight_format=WeightFormat.MXFP4.value, scales=f"{name}_scales", **words)
    return dict(weight=name)


def expert_weight_arguments(n: Widths) -> list[k3s.TensorArgOp]:
    """expert_gate_up [E, 2F, w] and expert_down [E, w, F] in the layer's float dtype, or with
    MXFP4 each as its packed values (nibbles: two E2M1 codes a byte, [.., in / 2]; words: eight a
    32-bit word, [.., in / 8]) and scales (an E8M0 byte per 32 inputs: [.., in / 32]),
    pack_expert_weights' outputs."""
    shapes = {"expert_gate_up": (n.E, 2 * n.F, n.w), "expert_down": (n.E, n.w, n.F)}
    if not n.mxfp4:
        return [tensor_arg(name, k3s.tensor(*shape, dtype="float")) for name, shape in shapes.items()]
    codes_per_element = {k3s.Packing.NIBBLES: 2, k3s.Packing.WORDS: 8}[n.packing]
    arguments = []
    for name, (*rows, inputs) in shapes.items():
        packed = k3s.tensor(*rows, inputs // codes_per_element, dtype=k3s.PACKED_DTYPES[n.packing])
        arguments += [tensor_arg(f"{name}_packed", packed),
                      tensor_arg(f"{name}_scales", k3s.tensor(*rows, inputs // 32, dtype="e8m0"))]
    return arguments


def weight_arguments(n: Widths) -> list[k3s.TensorArgOp]:
    """The experts' weights in reference.latent_moe's layouts; absent stages' weights forbidden."""
    latent_role = "input" if n.latent else "forbidden"
    shared_role = "input" if n.S else "forbidden"
    S, Fs = max(n.S, 1), max(n.Fs, 1)  # a forbidden tensor's shape is never checked, but a dimension is positive
    return [
        *expert_weight_arguments(n),
        tensor_arg("latent_down", k3s.tensor(n.w, n.d, dtype="float"), latent_role),
        tensor_arg("latent_up", k3s.tensor(n.d, n.w, dtype="float"), latent_role),
        tensor_arg("latent_norm_gain", k3s.tensor(n.w, dtype="float"), latent_role),
        tensor_arg("shared_gate_up", k3s.tensor(S, 2 * Fs, n.d, dtype="float"), shared_role),
        tensor_arg("shared_down", k3s.tensor(S, n.d, Fs, dtype="float"), shared_role),
        tensor_arg("out", k3s.tensor("R", n.d, dtype="float"), "output"),
    ]


class MoeEntry:
    """Builds one entry of a k3.latent_moe: the stages around the routed experts are the same for
    both plans, the routed experts' kernels are the plan's. Its stages read and write its
    arguments' values, which `tensors` holds by name as they are declared (the inputs and weights
    first, each workspace as it is made)."""

    def __init__(self, op: LatentMoEOp, plan: str, num_warps: int, saving: bool = False,
                 packing: k3s.Packing = k3s.Packing.NIBBLES) -> None:
        self.op, self.n, self.num_warps = op, Widths.of(op, packing), num_warps
        self.layer, self.plan = op.sym_name.data, plan
        # saving (the training forward, derive-moe-backward's): what the backward reads is returned
        self.saving = saving
        self.inputs = [*routing_inputs(op), *weight_arguments(self.n)]
        self.tensors = argument_values(self.inputs)

    def declare(self, arguments: list[k3s.TensorArgOp]) -> list[k3s.TensorArgOp]:
        """Arguments of the entry (its workspaces), their values now readable by name."""
        self.tensors |= argument_values(arguments)
        return arguments

    def workspace(self, name: str, type: k3s.TensorType, **values) -> k3s.TensorArgOp:
        return self.declare([tensor_arg(name, type, "workspace", **values)])[0]

    def kept(self, name: str, type: k3s.TensorType, **values) -> k3s.TensorArgOp:
        """A workspace the backward reads: an output of the training forward."""
        return self.declare([tensor_arg(name, type, "output" if self.saving else "workspace", **values)])[0]

    def project(self, rows: str, input: str, index: str, weight: str, in_dim: int, out_dim: int, layout: str,
                glu: bool = False, scales: str | None = None, gain: str | None = None, **extra) -> k3s.ProjectOp:
        """A projection of the tensors named: input, weight, then (k3s.project's order) its scales,
        its gain and those its rows come from."""
        names = [input, weight, *(name for name in (scales, gain) if name is not None), *k3s.ROW_TENSORS.get(rows, ())]
        results = [("g", k3s.tile("M", "N")), ("u", k3s.tile("M", "N"))] if glu else [("y", k3s.tile("M", "N"))]
        return make(k3s.ProjectOp, operands=[self.tensors[name] for name in names], in_dim=in_dim, out_dim=out_dim,
                    rows=rows, input_index=index, layout=layout, glu=glu, results=results, **extra)

    def project_slots(self, input: str, weight: str, scales: str | None = None, **extra) -> k3s.ProjectSlotsOp:
        """The token-centric down projection of the tensors named: input, the routing's topk_ids and
        topk_weights, weight and its scales."""
        names = [input, "topk_ids", "topk_weights", weight, *([scales] if scales is not None else [])]
        return make(k3s.ProjectSlotsOp, operands=[self.tensors[name] for name in names],
                    result=("y", k3s.tile("M", "N")), **extra)

    def glu_stages(self, projection: k3s.ProjectOp, tensor: str, index: str, width: int,
                   saved: tuple[str, int] | None = None) -> list:
        """The GLU of the projection's halves stored to `tensor`; saving, its pre-activations too,
        to saved = (tensor, its group) in the weight's row order (k3s.store_glu_halves: the
        backward's GLU adjoint reads them, 2 out values a row, rather than recompute the projection)."""
        act = make(k3s.GluOp, operands=list(projection.results), activation=self.op.activation.data,
                   result=("act", k3s.tile("M", "N")))
        rows = projection.rows.data.value
        halves = [make(k3s.StoreGluHalvesOp, operands=[*projection.results, self.tensors[saved[0]]], rows=rows,
                       index=index, group=saved[1], width=2 * width)] if self.saving and saved else []
        return [projection, *halves, act, self.store(act.results[0], rows, tensor, index, width)]

    def store(self, value, rows: str, tensor: str, index: str, width: int, accumulate: bool = False
              ) -> k3s.StoreRowsOp:
        return make(k3s.StoreRowsOp, operands=[value, self.tensors[tensor]], rows=rows, index=index, width=width,
                    accumulate=accumulate)

    @property
    def kernel_prefix(self) -> str:
        return f"{self.layer}_{self.plan}"

    def kernel(self, suffix: str, grid: list[GridAxis], stages: list) -> k3s.KernelOp:
        return make(k3s.KernelOp, stages, sym_name=f"{self.kernel_prefix}_{suffix}", grid=grid,
                    num_warps=self.num_warps)

    def before_experts(self) -> tuple[list, list]:
        """Workspaces and kernels: the routing, and the latent down-projection h = x W_down^T."""
        n = self.n
        routing = self.declare(routing_outputs(self.op, "output" if self.saving else "workspace"))
        workspaces, kernels = routing_stages(self.op, LowerMoeRoutingPass.num_warps, self.tensors)
        for kernel in kernels:  # kernel names are the module's: each entry's its own
            kernel.properties["sym_name"] = StringAttr(kernel.sym_name.data.replace(self.layer, self.kernel_prefix, 1))
        workspaces = [*routing, *self.declare(workspaces)]
        if n.latent:
            workspaces.append(self.kept("h", k3s.tensor("R", n.w, dtype="float")))
            down = self.project("token_block", "x", "token", "latent_down", n.d, n.w, "dense")
            kernels.append(self.kernel("latent_down", [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK],
                                       [down, self.store(down.results[0], "token_block", "h", "token", n.w)]))
        return workspaces, kernels

    def expert_input(self) -> str:
        return "h" if self.n.latent else "x"

    def after_experts(self, combined: str) -> tuple[list, list]:
        """Workspaces and kernels after the routed experts' combined rows: the latent RMSNorm and
        up-projection, and the shared experts' GLU added to the output."""
        n = self.n
        workspaces, kernels = [], []
        if n.latent:
            up = self.project("token_block", combined, "token", "latent_up", n.w, n.d, "dense",
                              rms_eps=self.op.eps.value.data, gain="latent_norm_gain")
            kernels.append(self.kernel("latent_up", [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK],
                                       [up, self.store(up.results[0], "token_block", "out", "token", n.d)]))
        if n.S:
            width = n.S * n.Fs
            workspaces.append(self.kept("shared_act", k3s.tensor("R", width, dtype="float")))
            if self.saving:
                workspaces.append(self.kept("shared_gu", k3s.tensor("R", 2 * width, dtype="float")))
            gate_up = self.project("token_block", "x", "token", "shared_gate_up", n.d, width, "stacked_out", glu=True,
                                   group=n.Fs)
            kernels.append(self.kernel("shared_gate_up", [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK],
                                       self.glu_stages(gate_up, "shared_act", "token", width, ("shared_gu", n.Fs))))
            down = self.project("token_block", "shared_act", "token", "shared_down", width, n.d, "stacked_in",
                                group=n.Fs)
            # out holds the routed experts' part already (the latent up-projection's or the combine's)
            kernels.append(self.kernel("shared_down", [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK],
                                       [down, self.store(down.results[0], "token_block", "out", "token", n.d,
                                                         accumulate=True)]))
        return workspaces, kernels

    def combined_target(self) -> tuple[str, list]:
        """Where the routed experts' combined rows go: an fp32 workspace the latent up-projection
        normalises, or (full width) the output itself."""
        n = self.n
        if n.latent:
            return "combined", [self.kept("combined", k3s.tensor("R", n.w, dtype="float32"))]
        return "out", []

    def entry(self, name: str, workspaces: list, kernels: list) -> k3s.EntryOp:
        return make(k3s.EntryOp, [*self.inputs, *workspaces, *kernels], sym_name=name,
                    source=SymbolRefAttr(self.layer))

    def rank_stages(self, block_rows: int) -> tuple[list, list[k3s.KernelOp]]:
        """The kernels that count each expert's pairs and rank each pair among them: atomic ranks
        (k3s.count_pairs), or, saving (training), ranks in pair order (k3s.rank_pairs over chunks of a
        block's pairs, then k3s.chunk_offsets), which fix the order the weight gradients sum in."""
        n, t = self.n, self.tensors
        if not self.saving:
            return [], [self.kernel("count_pairs", [GridAxis.PAIR_CHUNK], [make(
                k3s.CountPairsOp, operands=[t["topk_ids"], t["expert_counts"], t["pair_rank"]], num_experts=n.E,
                top_k=n.k)])]
        # chunks of block_rows pairs: at most PB of them (a block per chunk the pairs fill)
        counts = self.workspace("chunk_counts", k3s.tensor("PB", n.E, dtype="index"), fill=0)
        plan = dict(num_experts=n.E, top_k=n.k, pairs_per_chunk=block_rows)
        rank = self.kernel("rank_pairs", [GridAxis.PAIR_CHUNK], [make(
            k3s.RankPairsOp, operands=[t["topk_ids"], t["chunk_counts"], t["pair_rank"]], **plan)])
        rank.properties.update(props(block_r=block_rows))  # a program per chunk
        offsets = self.kernel("chunk_offsets", [GridAxis.ONE], [make(
            k3s.ChunkOffsetsOp, operands=[t["chunk_counts"], t["expert_counts"]], **plan)])
        # the prefix in [chunks, experts] tiles: 32 chunks by up to 128 experts
        offsets.properties.update(props(block_r=32, block_e=min(128, 1 << (n.E - 1).bit_length())))
        return [counts], [rank, offsets]

    def expert_centric(self, block_rows: int, name: str = "moe_prefill") -> k3s.EntryOp:
        n = self.n
        workspaces, kernels = self.before_experts()
        combined, combined_workspace = self.combined_target()
        workspaces += [
            self.workspace("expert_counts", k3s.tensor(n.E, dtype="index"), fill=0),
            self.workspace("pair_rank", k3s.tensor("R", n.k, dtype="index")),
            self.kept("expert_offsets", k3s.tensor(n.E + 1, dtype="index")),
            self.kept("sorted_pairs", k3s.tensor("PP", dtype="index"), fill=-1),
            self.kept("block_expert", k3s.tensor("PB", dtype="index")),
            *([self.kept("expert_gu", k3s.tensor("PP", 2 * n.F, dtype="float"))] if self.saving else []),
            self.kept("expert_act", k3s.tensor("PP", n.F, dtype="float")),
            self.workspace("pair_out", k3s.tensor("R", n.k, n.w, dtype="float")),
            *combined_workspace,
        ]
        t = self.tensors
        ranking_workspaces, ranking = self.rank_stages(block_rows)
        workspaces += ranking_workspaces
        kernels += [
            *ranking,
            self.kernel("expert_offsets", [GridAxis.ONE], [make(
                k3s.ExpertOffsetsOp, operands=[t["expert_counts"], t["expert_offsets"]], num_experts=n.E,
                block_rows=block_rows)]),
            self.kernel("sort_pairs", [GridAxis.PAIR_CHUNK], [make(
                k3s.SortPairsOp, operands=[t[name] for name in ("topk_ids", "expert_offsets", "pair_rank",
                                                                "sorted_pairs", "block_expert")]
                + ([t["chunk_counts"]] if self.saving else []),
                top_k=n.k, block_rows=block_rows, **({"pairs_per_chunk": block_rows} if self.saving else {}))]),
        ]
        gate_up = self.project("sorted_block", self.expert_input(), "token", **expert_weight(n, "expert_gate_up"),
                               in_dim=n.w, out_dim=n.F, layout="expert", glu=True, block_rows=block_rows)
        kernels.append(self.kernel("expert_gate_up", [GridAxis.SORTED_BLOCK, GridAxis.COLUMN_BLOCK],
                                   self.glu_stages(gate_up, "expert_act", "position", n.F, ("expert_gu", n.F))))
        down = self.project("sorted_block", "expert_act", "position", **expert_weight(n, "expert_down"), in_dim=n.F,
                            out_dim=n.w, layout="expert", block_rows=block_rows)
        weighed = make(k3s.WeighPairsOp, operands=[down.results[0], t["topk_weights"]],
                       result=("yw", k3s.tile("M", "N")))
        kernels.append(self.kernel("expert_down", [GridAxis.SORTED_BLOCK, GridAxis.COLUMN_BLOCK],
                                   [down, weighed, self.store(weighed.results[0], "sorted_block", "pair_out", "pair",
                                                              n.w)]))
        summed = make(k3s.SumSlotsOp, operands=[t["pair_out"]], out_dim=n.w, top_k=n.k,
                      result=("c", k3s.tile("M", "N")))
        kernels.append(self.kernel("combine", [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK],
                                   [summed, self.store(summed.results[0], "token_block", combined, "token", n.w)]))
        more_workspaces, more_kernels = self.after_experts(combined)
        # the padded pair list's sizes (shape symbols PP, PB) follow from the plan's block rows
        return self.entry(name, workspaces + more_workspaces, kernels + more_kernels)

    def warp_plan(self, tiles: list[tuple[int | None, int, int]], team: int, name: str = "moe_decode"
                  ) -> k3s.EntryOp:
        """The decode entry split by output neurons (decode = warp): the GLU of every slot of a
        token a tile axis, the down projection over teams of `team` slots reduced in registers.
        tiles: (at most this many rows, BN, BD) of both kernels by the call's rows, the last the
        kernels' own (its rows None or the most the dispatch table sends here), the others
        k3s.launch_by_rows ops."""
        n, t = self.n, self.tensors
        workspaces, kernels = self.before_experts()
        combined, combined_workspace = self.combined_target()
        workspaces += [self.workspace("pair_act", k3s.tensor("R", n.k, n.F, dtype="float")), *combined_workspace]
        *narrower, (_, block_n, block_d) = tiles
        gate_up_weight, down_weight = self.slot_weights("expert_gate_up"), self.slot_weights("expert_down")
        gate_up = make(k3s.ProjectTokenSlotsOp, operands=[t[self.expert_input()], t["topk_ids"], *gate_up_weight[0]],
                       in_dim=n.w, out_dim=n.F, top_k=n.k, slots=1 << (n.k - 1).bit_length(), glu=True,
                       results=[("g", k3s.tile("M", "N")), ("u", k3s.tile("M", "N"))], **gate_up_weight[1])
        act = make(k3s.GluOp, operands=list(gate_up.results), activation=self.op.activation.data,
                   result=("act", k3s.tile("M", "N")))
        kernels.append(self.kernel("token_gate_up", [GridAxis.TOKEN, GridAxis.COLUMN_BLOCK], [
            gate_up, act, self.store(act.results[0], "token_slots", "pair_act", "pair", n.F)]))
        down = make(k3s.SumExpertRowsOp, operands=[t["pair_act"], t["topk_ids"], t["topk_weights"], *down_weight[0]],
                    in_dim=n.F, out_dim=n.w, top_k=n.k, slots=min(team, 1 << (n.k - 1).bit_length()),
                    result=("y", k3s.tile("N")), **down_weight[1])
        kernels.append(self.kernel("token_down", [GridAxis.TOKEN, GridAxis.COLUMN_BLOCK],
                                   [down, self.store(down.results[0], "token", combined, "token", n.w)]))
        for kernel in kernels[-2:]:
            kernel.properties.update(props(block_n=block_n, block_d=block_d))
        # a bucket launching as the next one does needs no op of its own (the next one holds its rows)
        distinct = [(most, bn, bd) for (most, bn, bd), after in zip(narrower, tiles[1:]) if (bn, bd) != after[1:]]
        kernels += [make(k3s.LaunchByRowsOp, kernel=SymbolRefAttr(kernel.sym_name), max_rows=most, block_n=bn,
                         block_d=bd) for kernel in kernels[-2:] for most, bn, bd in distinct]
        more_workspaces, more_kernels = self.after_experts(combined)
        return self.entry(name, workspaces + more_workspaces, kernels + more_kernels)

    def slot_weights(self, name: str) -> tuple[list, dict]:
        """The operands (the weight, with MXFP4 its scales after it) and properties with which a
        warp-plan stage reads the routed experts' weight `name`."""
        read = expert_weight(self.n, name)
        tensors = [read.pop("weight"), *([read.pop("scales")] if "scales" in read else [])]
        return [self.tensors[tensor] for tensor in tensors], read

    def token_centric(self, name: str = "moe_decode") -> k3s.EntryOp:
        n = self.n
        workspaces, kernels = self.before_experts()
        combined, combined_workspace = self.combined_target()
        workspaces += [self.workspace("pair_act", k3s.tensor("R", n.k, n.F, dtype="float")), *combined_workspace]
        gate_up = self.project("pair", self.expert_input(), "token", **expert_weight(n, "expert_gate_up"), in_dim=n.w,
                               out_dim=n.F, layout="expert", glu=True)
        kernels.append(self.kernel("pair_gate_up", [GridAxis.PAIR, GridAxis.COLUMN_BLOCK],
                                   self.glu_stages(gate_up, "pair_act", "pair", n.F)))
        down = self.project_slots("pair_act", **expert_weight(n, "expert_down"), in_dim=n.F, out_dim=n.w, top_k=n.k)
        kernels.append(self.kernel("token_down", [GridAxis.TOKEN, GridAxis.COLUMN_BLOCK],
                                   [down, self.store(down.results[0], "token", combined, "token", n.w)]))
        more_workspaces, more_kernels = self.after_experts(combined)
        return self.entry(name, workspaces + more_workspaces, kernels + more_kernels)


@dataclass(frozen=True)
class LowerMoeExpertsPass(ModulePass):
    """Add `moe_prefill`, `moe_decode` (and the other decode plan's entry where the dispatch
    table runs it) and `moe` (the table's choice by token count) for every k3.latent_moe."""

    name = "lower-moe-experts"
    # the expert-centric plan's pairs per block (each expert's run is padded to whole blocks):
    # the rows of its GEMM tiles. K3 on an H200 (bench/moe_gpu.py): 420-444 TFLOP/s at 8192-32768
    # tokens with 128, 262-253 with 64
    block_rows: int = 128
    num_warps: int = 4
    # moe_decode's plan, the one `schedule="decode"` runs: split (a program per pair for the GLU,
    # per token for the down projection) or warp (split by output neurons, the slots a tile
    # axis). MXFP4 weights' layout follows: warp reads them in words (the layout made for its
    # one-row products), split in nibbles; the layer's other entries read the same layout (`moe`
    # passes every entry the same tensors), so an mxfp4 layer's table runs this plan only
    decode: str = "split"
    # `moe`'s dispatch table (moe_dispatch.py: "1=split,4=warp/4x128", rows above the last bound
    # to prefill); "" takes the default: moe_dispatch.H100_TABLE for bf16 weights, and for MXFP4
    # (not measured per plan yet) the decode plan up to 4 tokens, as before the table existed
    dispatch: str = ""
    # the warp plan's tiles: output columns (BN) and input columns (BD) per step of both its
    # kernels (a bucket's own tiles replace them), and the slots per team of its down projection
    # (the GLU holds all top_k)
    warp_block_n: int = 4
    warp_block_d: int = 128
    warp_slots: int = 4

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_num_warps(self.name, self.num_warps)
        check_power_of_two(self.name, "block-rows", self.block_rows, 256)
        if self.block_rows < 16:
            raise ValueError(f"{self.name}: block-rows must be at least 16 (tl.dot's rows), got {self.block_rows}")
        if self.decode not in DECODE_PLANS:
            raise ValueError(f"{self.name}: decode must be split or warp, got {self.decode}")
        for option, value in (("warp-block-n", self.warp_block_n), ("warp-block-d", self.warp_block_d),
                              ("warp-slots", self.warp_slots)):
            check_power_of_two(self.name, option, value, 1024)
        tables = {layer.sym_name.data: self.table(layer) for layer in op.ops if isinstance(layer, LatentMoEOp)}
        entries = {"prefill": add_entries(op, LatentMoEOp, lambda layer: MoeEntry(
            layer, "prefill", self.num_warps, packing=self.packing).expert_centric(self.block_rows))}
        for plan in (self.decode, *(other for other in DECODE_PLANS if other != self.decode)):
            # moe_decode is the decode option's plan; the other plan's entry only for a layer whose table runs it
            entries[plan] = add_entries(op, LatentMoEOp, lambda layer, plan=plan: self.decode_entry(
                layer, plan, tables[layer.sym_name.data])
                if plan == self.decode or any(b.plan == plan for b in tables[layer.sym_name.data]) else None)
        add_entries(op, LatentMoEOp, lambda layer: self.dispatch_entry(layer, tables[layer.sym_name.data], entries))

    def table(self, layer: LatentMoEOp) -> list[Bucket]:
        """The layer's dispatch table: the option's, else the default for its weights' format."""
        where = f"{self.name}: dispatch"
        mxfp4 = layer.weight_format == WeightFormat.MXFP4
        spelled = self.dispatch or (f"4={self.decode}" if mxfp4 else H100_TABLE)
        table = parse_table(spelled, where)
        if mxfp4 and (other := next((b for b in table if b.plan in DECODE_PLANS and b.plan != self.decode), None)):
            raise ValueError(f"{where}: bucket {other.spelled()!r}: @{layer.sym_name.data}'s mxfp4 weights are laid "
                             f"out for decode = {self.decode} only (pass decode={other.plan} to run that plan)")
        if mxfp4 and any(b.block_d is not None and b.block_d < 32 for b in table):
            raise ValueError(f"{where}: a warp bucket's BD must hold whole blocks of 32 inputs (a scale each) for "
                             f"@{layer.sym_name.data}'s mxfp4 weights, got {spell_table(table)!r}")
        return table

    @property
    def packing(self) -> k3s.Packing:
        """The layout of MXFP4 weights, the decode plan's: words for warp (a shift-and-mask per two
        values, a multiply per block of 32), nibbles for split."""
        return k3s.Packing.WORDS if self.decode == "warp" else k3s.Packing.NIBBLES

    def decode_entry(self, layer: LatentMoEOp, plan: str, table: list[Bucket]) -> k3s.EntryOp:
        """The token-centric entry of `plan`: moe_decode for the decode option's, else
        moe_decode_<plan> (its kernels <layer>_decode_<plan>_*)."""
        word = "decode" if plan == self.decode else f"decode_{plan}"
        entry = MoeEntry(layer, word, self.num_warps, packing=self.packing)
        if plan == "split":
            return entry.token_centric(f"moe_{word}")
        if entry.n.mxfp4 and self.warp_block_d < 32:
            raise ValueError(f"{self.name}: warp-block-d must hold whole blocks of 32 inputs (a scale each) for "
                             f"@{layer.sym_name.data}'s mxfp4 weights, got {self.warp_block_d}")
        # each warp bucket's tiles, the pass's where it names none; the last bucket's are the kernels' own
        tiles = [(b.max_rows, b.block_n or self.warp_block_n, b.block_d or self.warp_block_d)
                 for b in table if b.plan == "warp"] or [(None, self.warp_block_n, self.warp_block_d)]
        return entry.warp_plan(tiles, self.warp_slots, f"moe_{word}")

    def dispatch_entry(self, layer: LatentMoEOp, table: list[Bucket], entries: dict[str, dict[str, str]]
                       ) -> k3s.EntryByRowsOp:
        name = layer.sym_name.data
        # the decode plans' entries first, moe_decode leading: the order `schedule`'s words are listed in
        built = {plan: names[name] for plan, names in sorted(entries.items(), key=lambda item: item[0] == "prefill")
                 if name in names}
        words = {plan: entry.removeprefix(f"{name}_").removeprefix("moe_") for plan, entry in built.items()}
        return make(k3s.EntryByRowsOp, sym_name="moe", source=SymbolRefAttr(name),
                    entries=[SymbolRefAttr(entry) for entry in built.values()], words=list(words.values()),
                    max_rows=[b.max_rows for b in table[:-1]], by_rows=[SymbolRefAttr(built[b.plan]) for b in table])
