"""derive-moe-backward: k3.latent_moe -> `moe_forward` (the expert-centric forward, returning what
its backward reads) and `moe_backward`, the reverse-mode derivative of that schedule.

The backward is derived, not written: the forward's kernels are walked in reverse, each stage's
adjoint rule (passes/moe_adjoint_rules.py, one per k3s op) taking the cotangents of its results
and emitting the stages and kernels that make its operands':
- a projection (k3s.project) gives a dgrad GEMM (its input's cotangent, the weight transposed)
  and a wgrad GEMM (the weight's: a sum over the rows, for the routed experts over the same
  expert-sorted (token, slot) list as the forward, each expert's run block by block);
- the GLU's adjoint is elementwise and lands in the epilogue of the dgrad GEMM that made its
  output's cotangent (the down projection's), with the forward's saved pre-activations, or
  (glu-adjoint=kernel) that dgrad stores its product plainly and a row kernel of its own loads
  it again and applies the routing weight's terms and the GLU's adjoint;
- the routing weight's product (k3s.weigh_pairs) scales that GEMM's input rows and asks for the
  routing weights' cotangent, a row dot product computed in the same epilogue (or the GLU's row
  kernel) in the GEMM's input terms, one partial per block of columns (summed in order later:
  no atomics);
- the combine (k3s.sum_slots) broadcasts a token's cotangent to its slots; a token's input
  cotangent from its k pairs is stored per pair and summed in slot order (the forward's combine);
- the latent RMSNorm (a k3s.project with rms_eps) gets a row kernel for its adjoint and one for
  its gain's gradient;
- the router's stages are recomputed in one kernel (the chosen scores), then sigmoid, top-k and
  normalisation are differentiated there: the selection has no cotangent, the bias none.
Saved by the forward (bytes per token at K3's widths, bf16, top-16: the GLU pre-activations
16 x 2 x 3072 x 2 = 192 KiB, the GLU outputs 96 KiB) rather than recomputed (another gate/up
GEMM over every pair, 2 x 3584 x 6144 x 16 flop per token): the pair list, the routing, h, the
experts' pre-activations and activations, the combined rows (fp32), the shared experts' too.

Every gradient element is written once by one program (the input's, x's, accumulated in a fixed
order over its three uses: shared experts, latent down-projection, router), an expert's weight
gradient summing its run of the pair list in order, which moe_forward builds in pair order
(lower-moe-experts' saving plan): deterministic, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, SymbolRefAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.ir.k3 import LatentMoEOp
from k3compile.passes.common import add_entries, argument_values, check_num_warps, check_power_of_two, make, tensor_arg
from k3compile.passes.lower_moe_experts import MoeEntry, Widths
from k3compile.passes.moe_adjoint_rules import MOE_ADJOINT_RULES, Product, Rows, Tile

# the gradients the backward returns, of the forward's inputs that have one (not router_bias)
DIFFERENTIABLE = ("x", "router_weight", "expert_gate_up", "expert_down", "latent_down", "latent_up",
                  "latent_norm_gain", "shared_gate_up", "shared_down")
GLU_ADJOINTS = ("epilogue", "kernel")  # derive-moe-backward{glu-adjoint=...}, the default first
SORTED_WGRAD_ROWS = ("gather", "copy")  # derive-moe-backward{sorted-wgrad-rows=...}, the default first


def fit(block: int, width: int) -> int:
    """A block of columns no wider than the layer's (padded to a power of two, at least tl.dot's 16)."""
    return min(block, max(16, 1 << (width - 1).bit_length()))


def row_bytes(tensor: SSAValue, width: int) -> int:
    """A row's bytes at bf16 training (fp32 workspaces twice the input dtype's)."""
    return width * (4 if tensor.type.dtype_class == "float32" else 2)


def wgrad_grid(p: Product, cotangent: SSAValue, source: SSAValue, sorted_rows: bool) -> list[GridAxis]:
    """A weight gradient's grid. Its programs loop over the same rows in step: a wave of W
    programs reads, per row, the fastest axis's operand whole and W / (its blocks) blocks of the
    other's, so over the grid the fastest axis's operand is read (tiles / W) times and the
    other's once: the fastest axis is the one over the narrower operand in bytes per row. The
    expert is the slowest axis, so the programs of one expert run together and its run of the
    pair list (cotangent and input rows, tens of MB) is read from DRAM a few times, not once per
    block of the other axis (experts fastest: 28 times over at K3's gate/up)."""
    narrower_input = row_bytes(source, p.in_dim) < row_bytes(cotangent, p.out_dim)
    blocks = [GridAxis.INPUT_BLOCK, GridAxis.COLUMN_BLOCK]
    return (blocks if narrower_input else blocks[::-1]) + ([GridAxis.EXPERT] if sorted_rows else [])


def given(props: dict) -> dict:
    """The properties that are set (an optional one left out where None)."""
    return {key: value for key, value in props.items() if value is not None}


class MoeBackward:
    """Builds `moe_backward` of one layer from its `moe_forward`: the rules call these methods."""

    def __init__(self, op: LatentMoEOp, forward: k3s.EntryOp, options: DeriveMoeBackwardPass) -> None:
        self.op, self.n, self.forward, self.o = op, Widths.of(op), forward, options
        self.layer = op.sym_name.data
        forward_args = [a for a in forward.body.ops if isinstance(a, k3s.TensorArgOp)]
        inputs = [tensor_arg(a.sym_name.data, a.results[0].type, a.role.data) for a in forward_args
                  if a.role.data in ("input", "forbidden")]
        saved = [tensor_arg(a.sym_name.data, a.results[0].type, "input") for a in forward_args
                 if a.role.data == "output" and a.sym_name.data != "out"]
        present = {a.sym_name.data: a for a in forward_args if a.role.data == "input"}
        gradients = [self.gradient(name, present[name]) for name in DIFFERENTIABLE if name in present]
        out = next(a for a in forward_args if a.sym_name.data == "out")
        self.arguments = [*inputs, *saved, tensor_arg("dout", out.results[0].type), *gradients]
        self.t = argument_values(self.arguments)
        self.workspaces: list[Operation] = []
        self.kernels: list[k3s.KernelOp] = []
        self.open: tuple[list[Operation], dict] | None = None
        self.cot = {"out": Rows(self.t["dout"])}  # forward tensor name -> its cotangent
        self.tile_cot: dict[SSAValue, Tile | Rows] = {}  # forward tile value -> its cotangent
        self.primal: dict[SSAValue, SSAValue] = {}  # forward tile value -> its recomputation
        self.glu_layout: dict[SSAValue, dict] = {}  # a GLU projection's gate -> its saved halves' layout
        self.normed: dict[str, SSAValue] = {}  # an RMS-normalised tensor -> its normalised rows
        # the tensors the forward stores a GLU's output to: their dgrad holds the GLU's adjoint
        self.glu_outputs = {k3s.argument_name(s.tensor) for kernel in k3s.entry_kernels(forward)
                            for s in kernel.body.ops if isinstance(s, k3s.StoreRowsOp)
                            and isinstance(s.value.owner, k3s.GluOp)}

    @staticmethod
    def gradient(name: str, of: k3s.TensorArgOp) -> Operation:
        """x's in fp32, zero-filled (its three uses add to it in order); the norm gain's in fp32; the
        weights' in their dtype, each element written once."""
        dims = of.results[0].type.dims
        if name == "x":
            return tensor_arg("dx", k3s.tensor(*dims, dtype="float32"), "output", fill=0)
        return tensor_arg(f"d{name}", k3s.tensor(*dims, dtype="float32" if name == "latent_norm_gain" else "float"),
                          "output")

    def derive(self) -> k3s.EntryOp:
        for kernel in reversed(k3s.entry_kernels(self.forward)):
            for stage in reversed(list(kernel.body.ops)):
                if type(stage) in MOE_ADJOINT_RULES:
                    MOE_ADJOINT_RULES[type(stage)](self, stage)
        self.close()
        return make(k3s.EntryOp, [*self.arguments, *self.workspaces, *self.kernels], sym_name="moe_backward",
                    source=SymbolRefAttr(self.layer))

    # --- kernels --------------------------------------------------------------------------
    def workspace(self, name: str, type: k3s.TensorType, **values) -> SSAValue:
        arg = tensor_arg(name, type, "workspace", **values)
        self.workspaces.append(arg)
        self.t[name] = arg.results[0]
        return arg.results[0]

    def kernel(self, suffix: str, grid: list[GridAxis], stages: list[Operation], **sizes) -> k3s.KernelOp:
        return make(k3s.KernelOp, stages, sym_name=f"{self.layer}_backward_{suffix}", grid=grid,
                    num_warps=self.o.num_warps, **sizes)

    def begin(self, suffix: str, grid: list[GridAxis], **sizes) -> None:
        self.close()
        self.open = ([], dict(suffix=suffix, grid=grid, **sizes))

    def close(self) -> None:
        """The open kernel, without the recomputed stages no adjoint read, made."""
        if self.open is not None:
            stages, properties = self.open
            while dead := [s for s in stages if s.results and not any(r.uses for r in s.results)]:
                for stage in dead:
                    stages.remove(stage)
                    stage.erase()
            self.kernels.append(self.kernel(stages=stages, **properties))
            self.open = None

    def emit_op(self, op_type: type, operands: list[SSAValue], results: list[tuple], **props) -> Operation:
        """A stage in the open kernel; results as (name, *tile dims)."""
        op = make(op_type, operands=operands, results=[(name, k3s.tile(*dims)) for name, *dims in results],
                  **given(props))
        self.open[0].append(op)
        return op

    def store_rows(self, tile: Tile, tensor: SSAValue, width: int, accumulate: bool = False) -> None:
        self.emit_op(k3s.StoreRowsOp, [tile.value, tensor], [], rows=tile.rows, index=tile.index, width=width,
                     accumulate=accumulate)

    def width(self, name: str) -> int:
        return self.t[name].type.dims[-1]

    def materialise(self, name: str, tile: Tile, width: int | None = None, dtype: str = "float32") -> Rows:
        """The open kernel's cotangent of tensor `name` ([R, width], its rows by token) stored to
        `<name>_bar` (fp32, or `dtype`), the kernel closed."""
        width = width or self.width(name)
        bar = self.workspace(f"{name}_bar", k3s.tensor("R", width, dtype=dtype))
        self.store_rows(tile, bar, width)
        self.close()
        return Rows(bar)

    @staticmethod
    def as_rows(cot: Tile | Rows, op: Operation) -> Rows:
        """A cotangent that op's rule reads from a tensor (every schedule lower-moe-experts builds
        gives one there)."""
        if isinstance(cot, Tile):
            raise NotImplementedError(f"derive-moe-backward: {op.name}'s result has its cotangent in registers, "
                                      "where its adjoint reads a tensor")
        return cot

    def glu_in_kernel(self, source: str) -> bool:
        """Whether the cotangent of `source`, a GLU's output, is stored by its dgrad for the GLU's
        adjoint to run in a row kernel of its own (glu-adjoint=kernel)."""
        return source in self.glu_outputs and self.o.glu_adjoint == "kernel"

    def dgrad_columns(self, source: str, columns: int) -> int:
        """The block of a dgrad's output columns (a's), by what its epilogue holds besides the
        accumulator: glu-dgrad-block-n for the GLU's adjoint (the forward's saved gate and up
        halves and their cotangents: five fp32 tiles [rows, BN] at once, which spill at 128 x 128
        on sm_90), x-dgrad-block-n for x's fp32 gradient added to (a second fp32 tile: 128 x 256
        spills), dgrad-block-n for a plain store (a GLU's output with glu-adjoint=kernel too)."""
        if source in self.glu_outputs and not self.glu_in_kernel(source):
            block = self.o.glu_dgrad_block_n
        elif f"d{source}" in self.t:
            block = self.o.x_dgrad_block_n
        else:
            block = self.o.dgrad_block_n
        return fit(block, columns)

    def partials(self, source: str, columns: int) -> int:
        """The column blocks of the kernel that holds `source`'s cotangent whole in registers, the
        dgrad GEMM making it or the GLU's row kernel (its partial row dots)."""
        block = fit(self.o.row_kernel_block_n, columns) if self.glu_in_kernel(source) else \
            self.dgrad_columns(source, columns)
        return -(-columns // block)

    def row_terms(self, value: SSAValue, cot: Rows, source: str, rows: str, index: str, width: int) -> SSAValue:
        """k3s.weigh_pairs' terms on the open kernel's product with the weight, y_bar W over a's rows
        (`source`'s, `rows` by `index`): the routing weights' partial row dots (y_bar W) . a and the
        rows scaled by the routing weight, a's cotangent."""
        if cot.dot_into is not None:
            a = self.emit_op(k3s.LoadRowsOp, [self.t[source]], [("a", "M", "N")], rows=rows, index=index,
                             width=width).results[0]
            self.emit_op(k3s.StorePairDotOp, [value, a, cot.dot_into], [])
        if cot.scale is not None:
            value = self.emit_op(k3s.WeighPairsOp, [value, cot.scale], [("a_bar", "M", "N")]).results[0]
        return value

    def store_input_cotangent(self, p: Product, product: SSAValue, y_bar: Rows) -> Rows:
        """The dgrad's product y_bar W stored plainly, shaped and ordered as the forward's input
        rows (the open kernel closed), in the input dtype: the activation's cotangent as torch's
        autograd of the layer keeps it, half the bytes of fp32 on the way to GEMMs that round it
        anyway. The routing weight's terms go with it to the kernel that loads it again
        (open_row_kernel)."""
        bar = self.workspace(f"{p.source}_bar", k3s.tensor(*self.t[p.source].type.dims, dtype="float"))
        self.store_rows(Tile(product, p.rows, p.index), bar, p.in_dim)
        self.close()
        return Rows(bar, p.index, y_bar.scale, y_bar.dot_into)

    def row_grid(self, rows: str, width: int) -> tuple[list[GridAxis], dict]:
        """A row kernel's grid and blocks: a program per block of the pair list (block-rows) or of
        dgrad-block-r token rows, and row-kernel-block-n columns."""
        sizes = dict(block_n=fit(self.o.row_kernel_block_n, width))
        if rows == "sorted_block":
            return [GridAxis.COLUMN_BLOCK, GridAxis.SORTED_BLOCK], sizes | dict(block_r=self.o.block_rows)
        return [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK], sizes | dict(block_r=self.o.dgrad_block_r)

    def row_source(self, tensor: SSAValue, rows: str, index: str, width: int) -> Operation:
        """The k3s.load_rows that is a row kernel's rows (it takes the tensors they come from)."""
        plan = [self.t[name] for name in k3s.ROW_TENSORS.get(rows, ())]
        name = k3s.argument_name(tensor)
        return make(k3s.LoadRowsOp, operands=[tensor, *plan], result=(f"{name}_rows", k3s.tile("M", "N")),
                    rows=rows, index=index, width=width)

    def open_row_kernel(self, suffix: str, cot: Rows, source: str, rows: str, width: int) -> Tile:
        """Open a row kernel over the forward's rows of `source` (`rows`) that loads a cotangent a
        dgrad stored (store_input_cotangent) and applies its routing weight's terms."""
        grid, sizes = self.row_grid(rows, width)
        self.begin(suffix, grid, **sizes)
        load = self.row_source(cot.value, rows, cot.index, width)
        self.open[0].append(load)
        value = self.row_terms(load.results[0], cot, source, rows, cot.index, width)
        return Tile(value, rows, cot.index)

    def pair_rows(self, tensor: SSAValue, index: str, scale: SSAValue | None) -> SSAValue:
        """`tensor`'s row of each position of the sorted pair list (`index`: its token's or its
        pair's), times the routing weight with `scale`, stored contiguous in the list's order
        [PP, width] by a row kernel of its own (sorted-wgrad-rows=copy)."""
        name, width = k3s.argument_name(tensor), tensor.type.dims[-1]
        copy = self.workspace(f"{name}_pair_rows", k3s.tensor("PP", width, dtype="float"))
        load = self.row_source(tensor, "sorted_block", index, width)
        stages = [load]
        if scale is not None:
            stages.append(make(k3s.WeighPairsOp, operands=[load.results[0], scale],
                               result=(f"{name}_rows_weighted", k3s.tile("M", "N"))))
        stages.append(make(k3s.StoreRowsOp, operands=[stages[-1].results[0], copy], rows="sorted_block",
                           index="position", width=width, accumulate=False))
        grid, sizes = self.row_grid("sorted_block", width)
        self.kernels.append(self.kernel(f"{name}_pair_rows", grid, stages, **sizes))
        return copy

    # --- the adjoints' kernels ---------------------------------------------------------------
    def input_grad(self, p: Product, y_bar: Rows) -> SSAValue:
        """Open a dgrad kernel: a_bar = y_bar W over the forward's rows, the program's block of a's
        columns. Over the sorted pair list the column blocks are the fastest grid axis: the
        programs running together share a block's cotangent rows (per pair, R top_k rows of the
        whole depth: re-read from DRAM once per wave of row blocks the other way round, 28 times
        over at K3's gate/up) and sweep one expert's weight; sorted blocks on axis 1, which CUDA
        caps at 65535 (8.4M pairs at block-rows 128). Over token rows the row blocks stay fastest
        (the cotangent rows, a few hundred MB, against the weight's tens)."""
        sorted_rows = p.rows == "sorted_block"
        grid = [GridAxis.COLUMN_BLOCK, GridAxis.SORTED_BLOCK] if sorted_rows else \
            [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK]
        sizes = dict(block_n=self.dgrad_columns(p.source, p.in_dim), block_d=fit(self.o.dgrad_block_d, p.out_dim),
                     num_stages=self.o.num_stages)
        self.begin(f"{p.weight}_dgrad", grid, **sizes, **({} if sorted_rows else {"block_r": self.o.dgrad_block_r}))
        plan = [self.t[name] for name in k3s.ROW_TENSORS.get(p.rows, ())]
        # with a row scale still to apply (the routing weight), the product is yw_bar W, not yet a_bar
        name = "a_bar" if y_bar.scale is None else "yw_bar_w"
        return self.emit_op(k3s.ProjectInputGradOp, [y_bar.value, self.t[p.weight], *plan], [(name, "M", "N")],
                            in_dim=p.out_dim, out_dim=p.in_dim, rows=p.rows, input_index=y_bar.index, layout=p.layout,
                            group=p.group, block_rows=p.block_rows).results[0]

    def weight_grad(self, p: Product, y_bar: Rows) -> None:
        """A wgrad kernel: d<weight> = y_bar^T a over the rows, in the weight's layout (a the
        normalised rows of an RMS-normalised input, which its adjoint stored)."""
        sorted_rows = p.rows == "sorted_block"
        cotangent, cotangent_index, scale = y_bar.value, y_bar.index, y_bar.scale
        source = self.normed[p.source] if p.gain is not None else self.t[p.source]
        input_index = p.index
        if sorted_rows and self.o.sorted_wgrad_rows == "copy":
            # each operand gathered through the pair list copied in the list's order first, the
            # routing weight folded into the first copy: the wgrad's steps read contiguous rows
            if cotangent_index != "position":
                cotangent, cotangent_index, scale = self.pair_rows(cotangent, cotangent_index, scale), "position", None
            if input_index != "position":
                source, input_index, scale = self.pair_rows(source, input_index, scale), "position", None
        tensors = ([scale] if scale is not None else []) + \
            ([self.t["expert_offsets"], self.t["sorted_pairs"]] if sorted_rows else [])
        grad = make(k3s.ProjectWeightGradOp, operands=[cotangent, source, *tensors],
                    result=("w_bar", k3s.tile("N", "D")), **given(dict(
                        in_dim=p.in_dim, out_dim=p.out_dim, rows=p.rows, cotangent_index=cotangent_index,
                        input_index=input_index, scale_rows=scale is not None, block_rows=p.block_rows)))
        store = make(k3s.StoreWeightGradOp, operands=[grad.results[0], self.t[f"d{p.weight}"]],
                     **given(dict(layout="expert" if sorted_rows else p.layout, group=p.group)))
        # an expert's run is whole blocks of block_rows: a step of at most one block stays in it
        step = min(self.o.sorted_wgrad_block_r, self.o.block_rows) if sorted_rows else self.o.wgrad_block_r
        sizes = dict(block_r=step, block_n=fit(self.o.wgrad_block_n, p.out_dim),
                     block_d=fit(self.o.wgrad_block_d, p.in_dim),
                     num_stages=self.o.sorted_wgrad_num_stages if sorted_rows else self.o.num_stages)
        self.kernels.append(self.kernel(f"{p.weight}_wgrad", wgrad_grid(p, cotangent, source, sorted_rows),
                                        [grad, store], **sizes))

    def product_adjoint(self, p: Product, y_bar: Rows) -> None:
        """A plain GEMM's two adjoints: the input's cotangent to its tensor, the weight's gradient."""
        self.contribute(p.source, Tile(self.input_grad(p, y_bar), p.rows, p.index))
        self.weight_grad(p, y_bar)

    def store_glu_cotangent(self, op: k3s.ProjectOp, gate: Tile, up: Tile, name: str) -> Rows:
        """The GLU halves' cotangents stored in the weight's row order (the open kernel closed)."""
        layout = self.glu_layout[op.result]
        rows = ("PP" if layout["rows"] == "sorted_block" else "R", layout["width"])
        bar = self.workspace(name, k3s.tensor(*rows, dtype="float"))
        self.emit_op(k3s.StoreGluHalvesOp, [gate.value, up.value, bar], [], **layout)
        self.close()
        return Rows(bar, layout["index"])

    def contribute(self, name: str, tile: Tile) -> None:
        """A cotangent of tensor `name` from the open kernel: added to its gradient (x), or kept
        open for the stage that stored the tensor; a token's rows from its pairs are stored per
        pair and summed over its slots in order."""
        gradient = self.t.get(f"d{name}")
        per_pair = tile.rows == "sorted_block" and tile.index == "token"
        if per_pair:
            pairs = self.workspace(f"{name}_pair_bar", k3s.tensor("R", self.n.k, self.width(name), dtype="float"))
            self.store_rows(Tile(tile.value, tile.rows, "pair"), pairs, self.width(name))
            self.begin(f"{name}_sum_slots", [GridAxis.ROW_BLOCK, GridAxis.COLUMN_BLOCK])
            summed = self.emit_op(k3s.SumSlotsOp, [pairs], [("c", "M", "N")], out_dim=self.width(name), top_k=self.n.k)
            tile = Tile(summed.results[0], "token_block", "token")
        if gradient is not None:
            self.store_rows(tile, gradient, self.width(name), accumulate=True)
            self.close()
        elif per_pair:  # read only by the GEMMs of its producer's adjoint, which round it to the input dtype
            self.cot[name] = self.materialise(name, tile, dtype="float")
        else:
            self.cot[name] = tile

    def rms_norm_adjoint(self, p: Product, normed_bar: SSAValue, eps: float) -> None:
        """The cotangent of a's normalised rows -> a's (and 1 / RMS, and the normalised rows in the
        input dtype for the weight's gradient), and the gain's gradient."""
        width = p.in_dim
        stored = self.materialise(f"{p.source}_normed", Tile(normed_bar, p.rows, p.index), width).value
        # the input's cotangent in the input dtype: read only by the GEMMs of its producer's
        # adjoint (the experts' down projection: dgrad and wgrad operands, rounded to it anyway)
        bar = self.workspace(f"{p.source}_bar", k3s.tensor("R", width, dtype="float"))
        rstd = self.workspace(f"{p.source}_rstd", k3s.tensor("R", dtype="float32"))
        self.normed[p.source] = self.workspace(f"{p.source}_normed", k3s.tensor("R", width, dtype="float"))
        gain = p.gain
        self.kernels.append(self.kernel(f"{p.source}_rms_norm_adjoint", [GridAxis.ROW_BLOCK], [make(
            k3s.RmsNormAdjointOp, operands=[self.t[p.source], self.t[gain], stored, bar, rstd, self.normed[p.source]],
            eps=eps, width=width)],
            block_r=self.o.row_block, block_d=fit(self.o.wgrad_block_d, width)))
        self.kernels.append(self.kernel(f"{gain}_grad", [GridAxis.COLUMN_BLOCK], [make(
            k3s.NormGainGradOp, operands=[self.t[p.source], rstd, stored, self.t[f"d{gain}"]], width=width)],
            block_r=self.o.wgrad_block_r, block_n=fit(self.o.wgrad_block_n, width)))
        self.cot[p.source] = Rows(bar)

    def recompute_routing(self, store: k3s.StoreRoutingOp) -> None:
        """Open the router's backward kernel with the top-k kernel's stages (before its store)
        again, after the kernels that make the tensors they read (the router logits)."""
        top_k = store.parent_op()
        read = {k3s.argument_name(v) for s in top_k.body.ops for v in s.operands if isinstance(v.type, k3s.TensorType)}
        mapper = dict(self.tensor_mapper())
        for kernel in k3s.entry_kernels(self.forward):
            made = {k3s.argument_name(v) for s in kernel.body.ops for v in s.operands if isinstance(v.type, k3s.TensorType)}
            if kernel is top_k or not made & read - set(self.t):
                continue
            for name in made & read - set(self.t):
                mapper[self.forward_value(name)] = self.workspace(name, self.forward_value(name).type)
            clone = kernel.clone(value_mapper=mapper)
            clone.properties["sym_name"] = StringAttr(kernel.sym_name.data.replace(f"{self.layer}_forward",
                                                                                   f"{self.layer}_backward", 1))
            self.kernels.append(clone)
        self.begin("router", top_k.axes)
        mapper = dict(self.tensor_mapper())
        for stage in top_k.body.ops:
            if stage is store:
                break
            copy = stage.clone(value_mapper=mapper)
            self.open[0].append(copy)
            self.primal.update(zip(stage.results, copy.results, strict=True))

    def forward_value(self, name: str) -> SSAValue:
        return next(a.results[0] for a in self.forward.body.ops if isinstance(a, k3s.TensorArgOp)
                    and a.sym_name.data == name)

    def tensor_mapper(self):
        for a in self.forward.body.ops:
            if isinstance(a, k3s.TensorArgOp) and a.sym_name.data in self.t:
                yield a.results[0], self.t[a.sym_name.data]


@dataclass(frozen=True)
class DeriveMoeBackwardPass(ModulePass):
    """Add `moe_forward` (moe_prefill's schedule returning what the backward reads) and
    `moe_backward` (its derivative) for every k3.latent_moe with bf16/fp32 expert weights."""

    name = "derive-moe-backward"
    block_rows: int = 128  # the pair list's blocks, as lower-moe-experts' block-rows
    # the dgrad GEMMs' tiles: BR token rows (dense; the forward's 128: each wave of programs
    # re-reads the cotangent rows once per its blocks of columns), BN output and BD reduction
    # columns, 128 x 256 x 64 (sm_90's widest wgmma, half the shared-memory bytes per flop of
    # 128 x 128); BN where the epilogue holds more (MoeBackward.dgrad_columns): a GLU's
    # adjoint, x's fp32 gradient added to
    dgrad_block_r: int = 128
    dgrad_block_n: int = 256
    dgrad_block_d: int = 64
    glu_dgrad_block_n: int = 64
    x_dgrad_block_n: int = 128
    # where the GLU's adjoint runs: "epilogue" (in the dgrad GEMM making its output's cotangent,
    # glu-dgrad-block-n columns: each program re-reads its rows' cotangent, the GEMM's K operand,
    # once per 64 of the FFN's columns) or "kernel" (that dgrad stores its product plainly at
    # dgrad-block-n columns, and a row kernel of its own, row-kernel-block-n columns a program,
    # applies the routing weight's terms and the GLU's adjoint to it); docs/moe.md gives both
    # forms' bytes, flop and offline sm_90 resources
    glu_adjoint: str = GLU_ADJOINTS[0]
    # the columns a program of the backward's row kernels holds (the GLU's adjoint with
    # glu-adjoint=kernel, the pair-list row copies with sorted-wgrad-rows=copy), block-rows rows
    row_kernel_block_n: int = 64
    # the routed experts' weight gradients: "gather" (a step's rows gathered through the pair list
    # by token, the routing weight applied to the expert's input rows in registers: on sm_90 that
    # operand goes global -> shared -> registers -> shared) or "copy" (row kernels first copy each
    # gathered operand, times the routing weight, contiguous in the list's order: [PP, width] in
    # the input dtype, written and read once more, and the wgrad's loop reads two plain operands)
    sorted_wgrad_rows: str = SORTED_WGRAD_ROWS[0]
    # the wgrad GEMMs' [BN, BD] weight tiles, BR rows a step (every token row, or an expert's run of
    # the pair list): 128 x 256, 64 rows a step, bf16 operands, 3 stages: 144 KB of shared memory
    # (the latent up-projection's fp32 input rows: 208 KB)
    wgrad_block_r: int = 64
    wgrad_block_n: int = 128
    wgrad_block_d: int = 256
    row_block: int = 16  # the RMSNorm adjoint's rows per program
    num_warps: int = 8
    num_stages: int = 3
    # an expert's wgrad loads each step's rows through the pair list (an index load, then the
    # rows it names): Triton's pipeliner gives the index its own stage, so 3 stages prefetch the
    # rows one step ahead (two buffers, every step waiting for the last); 5 keep them two steps
    # ahead with three buffers, as the dense wgrads' 3 (sm_90, Triton 3.9: 99 KB of shared memory)
    sorted_wgrad_num_stages: int = 5
    # an expert's wgrad's rows a step (at most block-rows), apart from the dense wgrads' (128 rows
    # at 3 stages: 193 KB of shared memory, which the dense wgrads' 3 stages at 128 would exceed)
    sorted_wgrad_block_r: int = 64

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_num_warps(self.name, self.num_warps)
        check_power_of_two(self.name, "block-rows", self.block_rows, 256)
        for option in ("dgrad_block_r", "dgrad_block_n", "dgrad_block_d", "glu_dgrad_block_n", "x_dgrad_block_n",
                       "wgrad_block_r", "wgrad_block_n", "wgrad_block_d", "row_block", "row_kernel_block_n",
                       "sorted_wgrad_block_r"):
            check_power_of_two(self.name, option.replace("_", "-"), getattr(self, option), 256)
        for option, words in (("glu_adjoint", GLU_ADJOINTS), ("sorted_wgrad_rows", SORTED_WGRAD_ROWS)):
            if getattr(self, option) not in words:
                raise ValueError(f"{self.name}: {option.replace('_', '-')} must be one of {', '.join(words)}, "
                                 f"got {getattr(self, option)}")
        if self.block_rows < 16:
            raise ValueError(f"{self.name}: block-rows must be at least 16 (tl.dot's rows), got {self.block_rows}")
        if self.num_stages < 1 or self.sorted_wgrad_num_stages < 1:
            raise ValueError(f"{self.name}: num-stages and sorted-wgrad-num-stages must be positive")
        for option in ("wgrad_block_r", "sorted_wgrad_block_r"):
            if getattr(self, option) < 16:
                raise ValueError(f"{self.name}: {option.replace('_', '-')} must be at least 16 (the depth of its "
                                 f"tl.dot), got {getattr(self, option)}")
        if any(isinstance(layer, LatentMoEOp) and Widths.of(layer).mxfp4 for layer in op.ops):
            return  # MXFP4 weights are packed for serving: no gradient for them
        forwards = {}

        def forward(layer: LatentMoEOp) -> k3s.EntryOp:
            forwards[layer.sym_name.data] = MoeEntry(layer, "forward", self.num_warps, saving=True).expert_centric(
                self.block_rows, "moe_forward")
            return forwards[layer.sym_name.data]

        add_entries(op, LatentMoEOp, forward)
        add_entries(op, LatentMoEOp, lambda layer: MoeBackward(layer, forwards[layer.sym_name.data], self).derive())
