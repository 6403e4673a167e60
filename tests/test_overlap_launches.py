"""overlap-launches: which consecutive launches run side by side (those that share no tensor
either writes: the backward's two scans, the summary's two scans), which do not (a kernel and the
one reading its spills), and that a module compiled with it computes what it computed before
(in the interpreter the side stream is none: the launches run in order)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_rms, layer_op
from k3compile.ir import k3s
from k3compile.pipeline import RECURRENCE_PIPELINE
from k3compile.checking.verify_backward import reference_gradients

H, HV, K, V = 2, 4, 16, 12
TABLE = dict(kind="kda", num_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, dtype="float32",
             gate_input="softplus", beta_input="logits")


def pipeline() -> str:
    return RECURRENCE_PIPELINE + ",overlap-launches"


def entry_ops(module, name: str) -> list:
    entry = next(op for op in module.ops if isinstance(op, k3s.EntryOp) and op.sym_name.data == name)
    return [op for op in entry.body.ops if isinstance(op, (k3s.LaunchOp, k3s.ForkStreamsOp, k3s.JoinStreamsOp))]


def shape(ops) -> list[str]:
    """fork / join, and each launch as its kernel's suffix, marked * on the side stream."""
    out = []
    for op in ops:
        if isinstance(op, k3s.LaunchOp):
            out.append(op.kernel.string_value().removeprefix("overlap_") + ("*" if k3s.on_side_stream(op) else ""))
        else:
            out.append(op.name.removeprefix("k3s."))
    return out


@pytest.fixture(scope="module")
def scheduled():
    from k3compile.driver import schedule
    from k3compile.spec import spec_from_table

    return schedule(spec_from_table(dict(name="overlap", **TABLE)), pipeline()).scheduled


def test_the_backward_scans_overlap_and_nothing_that_reads_a_spill(scheduled):
    assert shape(entry_ops(scheduled, "chunk_backward")) == [
        "backward_prepare", "fork_streams", "backward_state_scan*", "backward_cotangent_scan", "join_streams",
        "backward_gradients", "backward_gradients_steep"]  # the steep launch reads the checks the first records
    # the forward's scan reads what the prepare spills: one after the other
    assert shape(entry_ops(scheduled, "chunk")) == ["chunk_prepare", "chunk_scan"]


def test_the_summary_scans_overlap(scheduled):
    assert shape(entry_ops(scheduled, "segment_summary")) == [
        "summary_prepare", "fork_streams", "summary_scan_N*", "summary_scan_M", "join_streams"]


def test_a_launch_that_writes_what_the_next_reads_stays_in_order(scheduled):
    from k3compile.passes.overlap_launches import independent, written

    launches = [op for op in entry_ops(scheduled, "chunk_backward") if isinstance(op, k3s.LaunchOp)]
    prepare, state_scan, cotangent_scan, gradients, steep = launches
    assert written(prepare.callee()), "the prepare spills: it writes its workspaces"
    assert not independent(prepare, state_scan)
    assert not independent(cotangent_scan, gradients)  # S_bar
    assert not independent(gradients, steep)  # steep_chunks, and both store the gradients
    assert independent(state_scan, cotangent_scan)


def test_gradients_with_overlapped_launches_equal_autograd(compile_layer):
    layer = compile_layer(pipeline=pipeline(), name="overlap_run", **TABLE)
    assert "_fork(q.device)" in layer.path.read_text()
    T = 37
    x = {"q": torch.randn(1, T, H, K), "k": torch.randn(1, T, H, K), "v": torch.randn(1, T, HV, V),
         "g": torch.randn(1, T, HV, K), "beta": torch.randn(1, T, HV), "A_log": 0.3 * torch.randn(HV),
         "dt_bias": 0.5 * torch.randn(HV * K), "initial_state": 0.5 * torch.randn(1, HV, K, V)}
    x["q"], x["k"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    for segments in (None, 2):
        leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
        o, final = layer.module.chunk(**leaves, output_final_state=True, segments=segments)
        do, dht = torch.randn_like(o), torch.randn_like(final)
        torch.autograd.backward([o, final], [do, dht])
        want = reference_gradients(layer_op(layer), x, do, dht)
        for name, leaf in leaves.items():
            assert_rms(leaf.grad, want["h0" if name == "initial_state" else name], f"d{name} (segments={segments})",
                       1e-4)
