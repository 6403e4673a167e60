"""Block AttnRes's two phases in the block stack (attnres = "two_phase"), batched over a block's
points and recomputed in the backward (docs/block-stack.md, "Two phases"):

- forward: phase 1 (attnres_block_partials) runs once for the points of a block that a run of
  layers holds (a stage may hold part of a block), over the representatives, all their queries at
  once; each point merges its row with its partial sum (attnres_block_merge) and RMS-normalises
  the result for its sublayer. The partials live until the block's last point, then are dropped:
  nothing of the aggregation is kept for the backward but the representatives and the partial
  sums, which exist anyway (the checkpointed floor).
- backward: the first point to need them (the block's last, backward runs in reverse) recomputes
  phase 1 once, with grad, from the representatives; every point recomputes its merge and norm
  and adds its cotangents of its partials row to the block's; the block's first point, whose
  backward runs last (every later point depends on its output through the partial sums), runs
  phase 1's backward once and returns the representatives', queries' and gains' gradients.
- under torch.compile: the same schedule without the Python-side context, which Dynamo cannot
  trace (TwoPhasePoint mutates this object in its forward and backward: "HOP: Unsafe side
  effect"). Phase 1 and the split of its rows run in a torch.utils.checkpoint region, so the
  partitioner recomputes it once for the run in the backward (one node of the joint graph, whose
  backward receives every point's cotangents, summed by autograd); each point's merge and norm
  is one custom op (point_operator) whose autograd saves its inputs only and whose backward op
  recomputes the merge. The compiled forward keeps what eager keeps: the representatives, the
  partial sums, the weights, no output of an AttnRes op (tests/test_block_stack.py reads the
  saved tensors off the partitioned graph). Not a second checkpoint region for the merge: the
  partitioner stashes the tensors between two adjacent regions.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch.utils import checkpoint as torch_checkpoint


class BlockPartials:
    """One block's phase 1 for the points `points` (k3compile.runtime.stack.Point, in order) of one run;
    recompute False (the spec's checkpoint_attnres = false): plain autograd, which keeps phase 1's
    results for the backward."""

    def __init__(self, reps: list[torch.Tensor], points: list, eps: float, recompute: bool = True) -> None:
        self.reps, self.points, self.eps, self.recompute = reps, points, eps, recompute
        self.forward_partials = None
        self.recomputed = None  # (leaves, (lse, mix)) in the backward
        self.cotangents = None

    def queries(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([p.query for p in self.points]), torch.stack([p.gain for p in self.points])

    def phase1(self, reps, queries, gains):
        # the compiled ops (triton): only for a stack with two-phase points
        from k3compile.ops.attnres import attnres_block_partials

        return attnres_block_partials(torch.stack(reps), queries, gains, self.eps)

    def phase1_rows(self, reps) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Phase 1 over the run's points, split into one (lse, mix) row a point."""
        lse, mix = self.phase1(reps, *self.queries())
        return lse.unbind(0), mix.unbind(0)

    def point_input(self, k: int, partial: torch.Tensor | None) -> torch.Tensor:
        """The sublayer input of point k of this block's run (differentiable when grad is on)."""
        point = self.points[k]
        if torch.compiler.is_compiling() and torch.is_grad_enabled() and self.recompute:
            return self.traced_point_input(k, partial)
        if not torch.is_grad_enabled() or not self.recompute:  # recompute False: autograd keeps phase 1's results
            return point_output(self.partials_of_forward(), k, partial, point.query, point.gain, point.norm, self.eps)
        queries, gains = self.queries() if k == 0 else (None, None)
        leaders = (*self.reps, queries, gains) if k == 0 else ()
        return TwoPhasePoint.apply(self, k, partial, point.query, point.gain, point.norm, *leaders)

    def partials_of_forward(self):
        if self.forward_partials is None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.recompute):
                self.forward_partials = self.phase1(self.reps, *self.queries())
        return self.forward_partials

    def traced_point_input(self, k: int, partial: torch.Tensor | None) -> torch.Tensor:
        """point_input under torch.compile: phase 1 once a run in a checkpoint region (recomputed
        once in the backward), the point's merge and norm point_operator's op (no state outside
        its arguments: nothing for Dynamo to refuse)."""
        if self.forward_partials is None:  # an object made inside the traced function: Dynamo tracks it
            self.forward_partials = torch_checkpoint.checkpoint(self.phase1_rows, self.reps, use_reentrant=False)
        lse, mix = self.forward_partials
        point = self.points[k]
        op = getattr(torch.ops.k3compile, point_operator_name(mix[k].shape[-1], self.eps))
        return op(lse[k], mix[k], partial, point.query, point.gain, point.norm)

    def end_forward(self) -> None:
        """The block's run is over: its partials are not kept for the backward."""
        self.forward_partials = None

    def partials_of_backward(self):
        """Phase 1 recomputed (once) with grad from leaves of the representatives and queries."""
        if self.recomputed is None:
            queries, gains = self.queries()
            leaves = [x.detach().requires_grad_(True) for x in (*self.reps, queries, gains)]
            with torch.enable_grad():
                partials = self.phase1(leaves[:-2], leaves[-2], leaves[-1])
            self.recomputed = leaves, partials
            self.cotangents = [torch.zeros_like(p) for p in partials]
        return self.recomputed[1]

    def backward_phase1(self) -> list[torch.Tensor | None]:
        """Phase 1's backward with every point's cotangents: d representatives, d queries, d gains."""
        leaves, partials = self.recomputed
        grads = torch.autograd.grad(partials, leaves, self.cotangents, allow_unused=True)
        self.recomputed = self.cotangents = None
        return list(grads)


def point_output(partials, k: int, partial, query, gain, norm, eps: float) -> torch.Tensor:
    lse, mix = partials
    return merge_and_norm(lse[k], mix[k], partial, query, gain, norm, eps)


def merge_and_norm(lse, mix, partial, query, gain, norm, eps: float) -> torch.Tensor:
    """A point's sublayer input from its row of phase 1 (lse [B, T], mix [B, T, D]) and its
    partial sum (None at a block's first point: the row's mix alone)."""
    # the compiled ops (triton): only for a stack with two-phase points
    from k3compile.ops.attnres import attnres_block_merge

    h = mix if partial is None else attnres_block_merge((lse, mix), partial, query, gain, eps)
    return F.rms_norm(h, (h.shape[-1],), norm, eps)


class TwoPhasePoint(torch.autograd.Function):
    """A point's sublayer input from its block's phase 1 and its partial sum. Saves the partial sum
    and the point's weights only; the first point of a block's run also takes the representatives
    and the stacked queries and gains, and returns their gradients."""

    @staticmethod
    def forward(ctx, block: BlockPartials, k: int, partial, query, gain, norm, *leaders):
        ctx.block, ctx.k, ctx.leads = block, k, bool(leaders)
        ctx.save_for_backward(partial, query, gain, norm)
        return point_output(block.partials_of_forward(), k, partial, query, gain, norm, block.eps)

    @staticmethod
    def backward(ctx, grad):
        block, k = ctx.block, ctx.k
        partial, query, gain, norm = ctx.saved_tensors
        lse, mix = block.partials_of_backward()
        inputs = [x.detach().requires_grad_(True) for x in (lse[k], mix[k], query, gain, norm)]
        partial_leaf = None if partial is None else partial.detach().requires_grad_(True)
        with torch.enable_grad():
            out = point_output((inputs[0][None], inputs[1][None]), 0, partial_leaf, *inputs[2:], block.eps)
            wanted = inputs + ([] if partial_leaf is None else [partial_leaf])
            grads = torch.autograd.grad(out, wanted, grad, allow_unused=True)
        dlse, dmix, dquery, dgain, dnorm = grads[:5]
        for total, part in zip(block.cotangents, (dlse, dmix)):
            if part is not None:
                total[k] += part
        dpartial = grads[5] if partial_leaf is not None else None
        leaders = block.backward_phase1() if ctx.leads else []
        return (None, None, dpartial, dquery, dgain, dnorm, *leaders)


def merge_operators(hidden_size: int, eps: float):
    """attnres_block_merge's custom op ((out, lse) from partial_sum, query, gain, block_lse,
    block_mix) and its backward op, of the layer attnres_block_merge picks."""
    # the compiled ops (triton): only for a stack with two-phase points
    from k3compile.ops.attnres import NUM_BLOCKS, block_operator_name

    name = block_operator_name("block_merge", int(hidden_size), float(eps), NUM_BLOCKS)
    backward = name.replace("attnres_block_merge_", "attnres_block_merge_backward_", 1)
    return getattr(torch.ops.k3compile, name), getattr(torch.ops.k3compile, backward)


def rms_norm_backward(h, weight, eps: float, du):
    """d h and d weight of F.rms_norm(h, (D,), weight, eps), in fp32 inside."""
    x, g = h.float(), du.float() * weight.float()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    xhat = x * r
    dweight = (du.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
    dh = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return dh.to(h.dtype), dweight.to(weight.dtype)


@cache
def point_operator(hidden_size: int, eps: float):
    """The custom op of a point's merge and norm for the traced path: lse [B, T], mix [B, T, D]
    (its row of phase 1), partial_sum [B, T, D] or None, query, gain, norm [D] -> the sublayer
    input [B, T, D]. Its autograd saves the inputs only; its backward op recomputes the merge and
    runs the norm's and the merge's backward (attnres_block_merge's ops). Opaque to the compiler,
    so the backward's recompute is never merged with the forward's (as the same custom op called
    twice would be by the partitioner's common-subexpression pass, which then stashes the merge's
    output)."""
    # the compiled ops (triton): only for a stack with two-phase points
    from k3compile.ops.attnres import NUM_BLOCKS, AttnResKey

    name = AttnResKey(hidden_size, eps, NUM_BLOCKS).module_name()

    @torch.library.custom_op(f"k3compile::stack_point_input_{name}", mutates_args=())
    def point_input(lse: torch.Tensor, mix: torch.Tensor, partial_sum: torch.Tensor | None, query: torch.Tensor,
                    gain: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return merge_and_norm(lse, mix, partial_sum, query, gain, norm, eps)

    @point_input.register_fake
    def _(lse, mix, partial_sum, query, gain, norm):
        return mix.new_empty(mix.shape)

    @torch.library.custom_op(f"k3compile::stack_point_input_backward_{name}", mutates_args=())
    def point_input_backward(lse: torch.Tensor, mix: torch.Tensor, partial_sum: torch.Tensor | None,
                             query: torch.Tensor, gain: torch.Tensor, norm: torch.Tensor, du: torch.Tensor
                             ) -> list[torch.Tensor]:
        """d lse, d mix, d partial_sum, d query, d gain, d norm, each in its input's dtype (d lse,
        d partial_sum, d query and d gain empty without a partial sum: h is the row's mix)."""
        if partial_sum is None:
            dmix, dnorm = rms_norm_backward(mix, norm, eps, du)
            empty = [mix.new_empty((0,)) for _ in range(4)]
            return [empty[0], dmix, *empty[1:], dnorm]
        merge, merge_backward = merge_operators(hidden_size, eps)
        inputs = tuple(x.contiguous() for x in (partial_sum, query, gain, lse, mix))
        h, h_lse = merge(*inputs)
        dh, dnorm = rms_norm_backward(h, norm, eps, du)
        dpartial, dquery, dgain, dlse, dmix = (g.to(x.dtype) for g, x in zip(
            merge_backward(*inputs, h, h_lse, dh.contiguous()), inputs, strict=True))
        return [dlse, dmix, dpartial, dquery, dgain, dnorm]

    @point_input_backward.register_fake
    def _(lse, mix, partial_sum, query, gain, norm, du):
        if partial_sum is None:
            empty = [mix.new_empty((0,)) for _ in range(4)]
            return [empty[0], mix.new_empty(mix.shape), *empty[1:], norm.new_empty(norm.shape)]
        return [x.new_empty(x.shape) for x in (lse, mix, partial_sum, query, gain, norm)]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.has_partial = inputs[2] is not None

    def backward(ctx, du):
        grads = point_input_backward(*ctx.saved_tensors, du.contiguous())
        if not ctx.has_partial:  # no partial sum: only mix and norm have gradients
            return None, grads[1], None, None, None, grads[5]
        return tuple(grads)

    point_input.register_autograd(backward, setup_context=setup_context)
    return point_input


def point_operator_name(hidden_size: int, eps: float) -> str:
    """The name under torch.ops.k3compile of point_operator's op, registering it (run, not traced,
    by torch.compile: marked below as k3compile.ops.attnres.block_operator_name is)."""
    # the compiled ops (triton): only for a stack with two-phase points
    from k3compile.ops.attnres import NUM_BLOCKS, AttnResKey

    point_operator(int(hidden_size), float(eps))
    return f"stack_point_input_{AttnResKey(int(hidden_size), float(eps), NUM_BLOCKS).module_name()}"


point_operator_name._dynamo_marked_constant = True
