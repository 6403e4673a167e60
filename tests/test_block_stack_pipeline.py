"""The block stack over torch.distributed.pipelining (k3compile.runtime.stack_pipeline) in 2 and 4 gloo
processes on the CPU (tests/pipeline_worker.py): one training step gives the loss and every
parameter's gradient of the single-process stack run on the same microbatches (fp32, 1e-5), and the bytes each stage's P2P sends
carried, forward and backward, equal the plan's (k3compile.runtime.pipeline_plan) and, with several
stages a rank, are below resending every completed block. Fresh random weights and inputs each
run; the torch form of the aggregate where the interpreter would be too slow, the compiled KDA
and two phases in one 2-process run. The 2-process cases share one group (one spawn: a rank's
process spends seconds importing torch.distributed.pipelining)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from conftest import REPO, run_worker_ranks
from k3compile.ops.layers import compiler_fingerprint
from k3compile.runtime.pipeline_plan import plan_pipeline
from k3compile.runtime.stack import build_stack
from k3compile.runtime.stack_spec import model_spec_from_table

WORKER = REPO / "tests" / "pipeline_worker.py"
SMALL = dict(hidden_size=24, num_layers=8, layer_pattern="attn", block_size=2, attn_heads=2, attn_head_dim=8,
             ffn_hidden_size=40, attnres="torch", dtype="float32")


def reference_step(model, x, target, microbatches: int) -> tuple[torch.Tensor, dict]:
    """The microbatches in this process, their gradients accumulated: (loss, each parameter's gradient).
    On one thread, as the ranks run (run_steps): torch's CPU kernels sum in another order on
    several threads, and that order's rounding is not the pipeline's to answer for."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return accumulated_step(model, x, target, microbatches)
    finally:
        torch.set_num_threads(threads)


def accumulated_step(model, x, target, microbatches: int) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss = 0
    for x_mb, target_mb in zip(x.chunk(microbatches), target.chunk(microbatches)):
        mb_loss = ((model(x_mb) - target_mb) ** 2).sum()
        mb_loss.backward()
        loss = loss + mb_loss.detach()
    return loss, {name: p.grad.clone() for name, p in model.named_parameters()}


def prepare_step(table: dict, world: int, stages_per_rank: int, cuts=None, schedule=None,
                 microbatches: int | None = None, vocab: int = 0, tokens: int = 6):
    """One pipelined training step's case for tests/pipeline_worker.py and the same step in this
    process: returns (the case, (plan, the single-process loss and gradients, each gradient's
    rounding noise, microbatches, tensor bytes)). The noise: how far each gradient moves, relative
    to its largest element, when the targets move by fp32 rounding (2^-24 relative) - a gradient
    that is one sum of terms that cancel (a KDA gate's A_log over every token and channel of its
    head) moves far more than the rest, and the ranks' step may differ from this one's by that much."""
    microbatches = microbatches or world
    spec = model_spec_from_table({**table, "vocab_size": vocab})
    model = build_stack(spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    B = microbatches
    x = torch.randint(0, vocab, (B, tokens)) if vocab else torch.randn(B, tokens, spec.hidden_size)
    target = torch.randn(B, tokens, vocab or spec.hidden_size)
    nudged = target * (1 + 2.0 ** -24 * torch.randn_like(target))
    _, moved = reference_step(model, x, nudged, microbatches)
    loss, grads = reference_step(model, x, target, microbatches)
    noise = {name: ((moved[name] - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
             for name, want in grads.items()}
    # the ranks import the modules this process compiled (their names carry its compiler's
    # fingerprint): a compiler source edited meanwhile by someone else is not mixed in
    case = dict(compiler=compiler_fingerprint(), table=spec.table(), state=model.state_dict(), x=x, target=target,
                stages_per_rank=stages_per_rank, cuts=cuts, microbatches=microbatches, schedule=schedule)
    plan = plan_pipeline(spec, world, stages_per_rank, cuts=cuts)
    return case, (plan, loss, grads, noise, microbatches, tokens * spec.hidden_size * 4)


def run_steps(steps: list, world: int, workdir: Path, timeout: float = 240) -> list:
    """The prepared steps' cases in one group of `world` processes: per step, the ranks' outputs."""
    torch.save([case for case, _ in steps], workdir / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1", "K3C_POISON_OUTPUTS": "1", "OMP_NUM_THREADS": "1"}
    outs = run_worker_ranks(WORKER, world, workdir, env, timeout)
    return [[rank_outs[i] for rank_outs in outs] for i in range(len(steps))]


def check_step(outs, plan, loss, grads, noise, microbatches, tensor_bytes) -> None:
    losses = [value for out in outs for value in out["losses"]]
    assert len(losses) == microbatches
    assert abs(sum(losses) - loss) <= 1e-5 * abs(loss)
    got: dict[str, torch.Tensor] = {}
    for out in outs:
        for name, grad in out["grads"].items():
            assert name not in got, f"{name}: gradients on two ranks"
            got[name] = grad
    assert got.keys() == grads.keys(), "every parameter's gradient on the rank of its stage"
    # a floor for gradients that are zero in exact arithmetic (a block's first point over b_0 alone:
    # a softmax over one source has no query gradient), which the kernels give as rounding noise
    floor = 1e-6 * max(want.abs().max() for want in grads.values())
    for name, want in grads.items():
        err = ((got[name] - want).abs().max() / want.abs().max().clamp_min(floor)).item()
        # 1e-5, or ten times the gradient's own rounding noise where that is larger (run_step)
        tolerance = max(1e-5, 10 * noise[name])
        assert err <= tolerance, f"{name}: relative error {err:.2e} (its rounding noise {noise[name]:.1e})"
    sent_fwd = {s: n for out in outs for s, n in out["sent"]["fwd"].items()}
    sent_bwd = {s: n for out in outs for s, n in out["sent"]["bwd"].items()}
    for b in plan.boundaries:  # the backward of stage b.source + 1 returns what b sent
        assert sent_fwd[b.source] == b.tensors * tensor_bytes * microbatches, f"boundary {b.source} forward"
        assert sent_bwd[b.source + 1] == b.tensors * tensor_bytes * microbatches, f"boundary {b.source} backward"
    assert sent_fwd.get(len(plan.stages) - 1, 0) == 0 and sent_bwd.get(0, 0) == 0


def test_two_ranks(tmp_path):
    """Three steps in one group of 2 processes.
    Schedule1F1B: each boundary sends every completed block (a rank sees them once).
    ScheduleLoopedBFS, every cut inside a block (the partial sum crosses too): rank 0's second
    stage gets b0 and b1 from its cache, only b2 over the wire.
    KDA (chunk_kda) and the compiled two phases under the interleaved schedule, every stage a
    layer of a block of 2 (phase 1 for half a block a stage, recomputed in its backward)."""
    compiled = {**SMALL, "hidden_size": 16, "num_layers": 4, "layer_pattern": "kda,attn", "kda_heads": 1,
                "kda_head_dim": 16, "attnres": "two_phase"}
    steps = [prepare_step(SMALL, 2, 1, vocab=11),
             prepare_step(SMALL, 2, 2, cuts=[0, 1, 3, 5, 8], schedule="looped-bfs"),
             prepare_step(compiled, 2, 2, cuts=[0, 1, 2, 3, 4], tokens=5)]
    for what, outs, (_, expected) in zip(("one stage each", "cuts inside blocks", "compiled layers"),
                                         run_steps(steps, 2, tmp_path), steps):
        try:
            check_step(outs, *expected)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from error
    one_stage, cut_inside = steps[0][1][0], steps[1][1][0]
    assert [b.sent for b in one_stage.boundaries] == [(0, 1, 2)] and not one_stage.boundaries[0].partial
    assert [(b.cached, b.sent, b.partial) for b in cut_inside.boundaries] == [
        ((), (0,), True), ((0,), (1,), True), ((0, 1), (2,), True)]
    assert sum(b.tensors for b in cut_inside.boundaries) < sum(b.resend_all_tensors for b in cut_inside.boundaries)


def test_four_ranks_two_stages(tmp_path):
    """ScheduleInterleaved1F1B over 4 ranks, blocks of 3 over 11 layers (the last block partial)."""
    step = prepare_step({**SMALL, "num_layers": 11, "block_size": 3}, 4, 2)
    (outs,) = run_steps([step], 4, tmp_path)
    check_step(outs, *step[1])
    plan = step[1][0]
    cached = [b for b in plan.boundaries if b.cached]
    assert cached and sum(b.tensors for b in plan.boundaries) < sum(b.resend_all_tensors for b in plan.boundaries)
