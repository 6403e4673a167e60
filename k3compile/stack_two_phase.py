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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class BlockPartials:
    """One block's phase 1 for the points `points` (k3compile.stack.Point, in order) of one run;
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
        from k3compile.ops.attnres import attnres_block_partials

        return attnres_block_partials(torch.stack(reps), queries, gains, self.eps)

    def point_input(self, k: int, partial: torch.Tensor | None) -> torch.Tensor:
        """The sublayer input of point k of this block's run (differentiable when grad is on)."""
        point = self.points[k]
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
    from k3compile.ops.attnres import attnres_block_merge

    lse, mix = partials
    h = mix[k] if partial is None else attnres_block_merge((lse[k], mix[k]), partial, query, gain, eps)
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
