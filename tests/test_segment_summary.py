"""The `segment_summary` entry (lower-segment-scan): every segment's (M, N) from the compiled
kernels in Triton's interpreter, against the float64 definition (reference.segment_summaries),
with NaN-poisoned outputs; and the identity S_end = M S_start + N against the chunk entry."""

from __future__ import annotations

import pytest
import torch

from conftest import RecurrenceShape, assert_matches, layer_op, recurrence_inputs, recurrence_table
from k3compile.ir import reference

C = 16
PIPELINE = (f"lower-recurrent,derive-chunkwise{{chunk-size={C}}},fuse-chunkwise{{block-v=16}},"
            f"derive-segment-scan{{chunk-size={C}}},lower-segment-scan{{block-v=16}}")
# segments: shorter than a chunk, exactly one, several with a partial tail, one token
SEGMENTS = (5, C, 2 * C + 3, 1)
# segment_summary printed first: the prepare code all three entries share is declared there
SUMMARY_FIRST = (f"lower-recurrent,derive-segment-scan{{chunk-size={C}}},lower-segment-scan{{block-v=16}},"
                 f"derive-chunkwise{{chunk-size={C}}},fuse-chunkwise{{block-v=16}}")


def summary_layer(compile_layer, kind: str, layout: str = "kv", pipeline: str = PIPELINE, **dims):
    layer = compile_layer(pipeline=pipeline, **recurrence_table(kind, layout, **dims))
    layer.module.POISON_OUTPUTS = True
    return layer


def summaries(layer, inputs: dict):
    kept = {n: inputs[n] for n in ("k", "v", "g", "beta", "cu_seqlens") if n in inputs}
    out = layer.segment_summary(**kept)
    return (None, out[0]) if len(out) == 1 else out


@pytest.mark.parametrize("kind", ["kda", "gated_deltanet", "deltanet", "gla"])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_summaries_match_the_definition(compile_layer, kind, layout):
    dims = dict(H=2, HV=4, K=16, V=8)
    layer = summary_layer(compile_layer, kind, layout, **dims)
    shape = RecurrenceShape(1, sum(SEGMENTS), 2, 4, 16, 8, seqlens=SEGMENTS)
    inputs = recurrence_inputs(kind, layout, shape, initial_state=False)
    M, N = summaries(layer, inputs)
    op = layer_op(layer)
    ref_M, ref_N = reference.segment_summaries(op, inputs["k"], inputs["v"], inputs.get("g"), inputs.get("beta"),
                                               segments=inputs["cu_seqlens"], cu_seqlens=inputs["cu_seqlens"])
    assert_matches(N, ref_N, f"{kind} N", rms_tol=1e-4, atol=1e-4)
    if ref_M is None:
        assert M is None
    else:
        expected = {"full": (4, 4, 16, 16), "diagonal": (4, 4, 16), "scalar": (4, 4)}
        assert tuple(M.shape) in expected.values()
        assert_matches(M, ref_M, f"{kind} M", rms_tol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pipeline", [PIPELINE, SUMMARY_FIRST], ids=["chunk-first", "summary-first"])
@pytest.mark.parametrize("kind", ["kda", "gated_deltanet"])
def test_summary_maps_any_start_to_the_chunk_entrys_state(compile_layer, kind, pipeline):
    """M S0 + N equals the chunk entry's final state from S0 (non-power-of-two dims, batch rows
    as the segments); the chunk entry's outputs match the reference. The entries share one prepare
    code, whose query stages the summary's launch skips, whichever entry declares it."""
    layer = summary_layer(compile_layer, kind, pipeline=pipeline, H=1, HV=2, K=12, V=10)
    assert len([name for name in dir(layer.module) if name.endswith("_prepare_kernel")]) == 1
    shape = RecurrenceShape(2, C + 7, 1, 2, 12, 10)
    inputs = recurrence_inputs(kind, "kv", shape)
    M, N = summaries(layer, inputs)
    o, final = layer.chunk(**inputs, output_final_state=True)
    ref_o, _ = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    assert_matches(o, ref_o, f"{kind} o", rms_tol=1e-4, atol=1e-4)
    S0 = inputs["initial_state"]
    moved = torch.einsum("nhij,nhjv->nhiv", M, S0) if M.dim() == 4 else (M[..., None] * S0 if M.dim() == 3 else M[..., None, None] * S0)
    assert_matches(moved + N, final.double(), f"{kind} M S0 + N", rms_tol=1e-4, atol=1e-4)


def test_summary_rejects_a_bad_tensor(compile_layer):
    layer = summary_layer(compile_layer, "kda")
    inputs = recurrence_inputs("kda", "kv", RecurrenceShape(1, 9, 2, 2, 16, 16), initial_state=False)
    with pytest.raises(ValueError, match="beta"):
        layer.segment_summary(inputs["k"], inputs["v"], inputs["g"], inputs["beta"][..., :1])

