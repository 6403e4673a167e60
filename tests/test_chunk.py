"""The compiled `chunk` entry (default pipeline lower-recurrent,derive-chunkwise,fuse-chunkwise)
of every KDA-family member, in both state layouts and at several chunk sizes, against the
float64 token recurrence of k3compile.ir.reference.

Triton interpreter, fp32 (and a few fp16 and bf16 cases: k3compile.checking.interpreter_bf16 computes
bf16 as the GPU does), small non-power-of-two dims (K = 24, V = 40) with block-v 16, so the scan
runs 3 value blocks per head and value heads are grouped (HV = 2 H). The chunk form reassociates
sums, so the tolerance is an RMS ratio of 1e-4 (observed: ~1e-7) instead of test_recurrent's
1e-5 allclose.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rms as shared_assert_rms
from conftest import assert_causal
from conftest import (
    DELTA_OF_KIND,
    GATE_OF_KIND,
    RECURRENCE_KINDS,
    RecurrenceShape,
    layer_op,
    recurrence_inputs,
    recurrence_table,
    rms_ratio,
)
from k3compile.driver import schedule
from k3compile.ir import k3s, reference
from k3compile.spec import spec_from_table

LAYOUTS = ("kv", "vk")
CHUNK_SIZES = (16, 32, 64)
H, HV, K, V = 2, 4, 24, 40  # grouped value heads (2 per qk head), K and V not powers of two
BLOCK_V = 16  # V = 40 -> 3 value blocks in the scan, the last one partial
RMS_TOL = 1e-4

# To keep the interpreter's runtime small, the cases cover pairs of the three axes, not their
# product: the layout only changes how the state is loaded and stored, the chunk size does not
# change argument handling. Each list still reaches every member and both layouts.
MEMBERS = [(kind, layout, 16) for kind in RECURRENCE_KINDS for layout in LAYOUTS]
# every member at every chunk size, the layouts alternating: each (member, C) and each
# (layout, C) pair once, each (member, layout) pair
SIZES = [(kind, LAYOUTS[(i + j) % 2], C) for i, kind in enumerate(RECURRENCE_KINDS) for j, C in enumerate(CHUNK_SIZES)]
# every member in both layouts at C = 16 and at every chunk size: 16 of the 24 combinations
PAIRS = MEMBERS + [case for case in SIZES if case[2] != 16]
ONE_LAYOUT = [(kind, LAYOUTS[i % 2], 16) for i, kind in enumerate(RECURRENCE_KINDS)]


def ids(cases):
    return [f"{kind}-{layout}-C{C}" for kind, layout, C in cases]


def chunk_pipeline(chunk_size: int, sub_chunk: int = 16) -> str:
    return (f"lower-recurrent,derive-chunkwise{{chunk-size={chunk_size} sub-chunk={sub_chunk}}},"
            f"fuse-chunkwise{{block-v={BLOCK_V} num-warps=4}}")


def chunk_layer(compile_layer, kind, layout, chunk_size, sub_chunk=16, **dims):
    dims = {"H": H, "HV": HV, "K": K, "V": V, **dims}
    name = f"{kind}_{layout}_c{chunk_size}_s{sub_chunk}_h{dims['H']}_hv{dims['HV']}_k{dims['K']}_v{dims['V']}"
    return compile_layer(pipeline=chunk_pipeline(chunk_size, sub_chunk),
                         **recurrence_table(kind, layout, name=name, **dims))


@pytest.fixture
def case(request, compile_layer):
    kind, layout, C = request.param
    return kind, layout, C, chunk_layer(compile_layer, kind, layout, C)


def assert_rms(out: torch.Tensor, ref: torch.Tensor, what: str, tol: float = RMS_TOL) -> None:
    shared_assert_rms(out, ref, what, tol)


def check(layer, inputs, **kwargs):
    """chunk(...) with output_final_state=True against the reference; returns (o, final)."""
    o, final = layer.chunk(**inputs, output_final_state=True, **kwargs)
    ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True, **kwargs)
    assert o.dtype == inputs["q"].dtype
    assert final is not None and final.dtype == torch.float32
    assert_rms(o, ref_o, "o")
    assert_rms(final, ref_final, "final_state")
    return o, final


def varlen_shape(seqlens, **dims) -> RecurrenceShape:
    dims = {"H": H, "HV": HV, "K": K, "V": V, **dims}
    return RecurrenceShape(B=1, T=sum(seqlens), seqlens=tuple(seqlens), **dims)


# --- every member x layout, every member x chunk size, every layout x chunk size -------------


@pytest.mark.parametrize("case", PAIRS, ids=ids(PAIRS), indirect=True)
def test_batch_several_chunks_and_a_partial_one(case):
    """B = 2, T = 2C + 3 (two full chunks and a partial one per sequence), initial and final
    state, grouped value heads, 3 value blocks."""
    kind, layout, C, layer = case
    assert "chunk" in layer.entries and "recurrent" in layer.entries
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=2, T=2 * C + 3, H=H, HV=HV, K=K, V=V))
    check(layer, inputs)


@pytest.mark.parametrize("case", SIZES, ids=ids(SIZES), indirect=True)
def test_varlen_short_exact_empty_and_long_sequences(case):
    """Sequences shorter than a chunk, exactly one chunk, empty, several chunks with a partial
    tail and a single token, packed back to back (their chunks start mid-chunk of the packing)."""
    kind, layout, C, layer = case
    seqlens = (C // 2 + 1, C, 0, 2 * C + 3, 1)
    inputs = recurrence_inputs(kind, layout, varlen_shape(seqlens))
    o, final = check(layer, inputs)
    assert final.shape[0] == len(seqlens)
    # the empty sequence's final state is its initial state, untouched
    assert torch.equal(final[2], inputs["initial_state"][2])


# --- cheaper cases, at one chunk size -------------------------------------------------------


@pytest.mark.parametrize("case", MEMBERS, ids=ids(MEMBERS), indirect=True)
def test_no_initial_state_and_no_final_state_unless_asked(case):
    kind, layout, C, layer = case
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=C + 3, H=H, HV=HV, K=K, V=V),
                               initial_state=False)
    o, final = check(layer, inputs)  # the final state from a zero state
    out = layer.chunk(**inputs)  # output_final_state defaults to False
    assert isinstance(out, tuple) and len(out) == 2
    o2, final2 = out
    assert final2 is None
    assert torch.equal(o, o2)


@pytest.mark.parametrize("case", ONE_LAYOUT, ids=ids(ONE_LAYOUT), indirect=True)
def test_scale_override(case):
    kind, layout, C, layer = case
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=C + 5, H=H, HV=HV, K=K, V=V))
    scale = 0.7  # not the default K ** -0.5
    o, _ = check(layer, inputs, scale=scale)
    ref_default, _ = reference.recurrence(layer_op(layer), **inputs)
    assert rms_ratio(o, ref_default) > 1e-2, "the scale argument must matter"


@pytest.mark.parametrize("case", MEMBERS, ids=ids(MEMBERS), indirect=True)
def test_chunk_and_recurrent_of_one_module_agree(case):
    kind, layout, C, layer = case
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=C + 5, H=H, HV=HV, K=K, V=V))
    o_c, s_c = layer.chunk(**inputs, output_final_state=True)
    o_r, s_r = layer.recurrent(**inputs, output_final_state=True)
    assert_rms(o_c, o_r.to(torch.float64), "chunk o vs recurrent o")
    assert_rms(s_c, s_r.to(torch.float64), "chunk final_state vs recurrent final_state")


@pytest.mark.parametrize("case", ONE_LAYOUT, ids=ids(ONE_LAYOUT), indirect=True)
def test_varlen_sequences_isolated(case):
    """NaN in one sequence's v reaches neither the outputs nor the final states of the others,
    which stay bit-identical to a run without the NaN."""
    kind, layout, C, layer = case
    seqlens = (C // 2 + 1, 2 * C + 3, C, 0, 3)
    T = sum(seqlens)
    inputs = recurrence_inputs(kind, layout, varlen_shape(seqlens))
    start, end = seqlens[0], seqlens[0] + seqlens[1]  # sequence 1, several chunks, between two others
    poisoned = dict(inputs)
    poisoned["v"] = inputs["v"].clone()
    poisoned["v"][:, start:end] = float("nan")
    o, final = layer.chunk(**inputs, output_final_state=True)
    o_p, final_p = layer.chunk(**poisoned, output_final_state=True)
    others = torch.ones(T, dtype=torch.bool)
    others[start:end] = False
    assert torch.isfinite(o_p[:, others]).all(), "NaN leaked into another sequence's output"
    assert torch.equal(o_p[:, others], o[:, others])
    for n in (0, 2, 3, 4):
        assert torch.isfinite(final_p[n]).all(), f"NaN leaked into the final state of sequence {n}"
        assert torch.equal(final_p[n], final[n])
    assert torch.isnan(o_p[:, start:end]).any(), "the poisoned sequence itself should be NaN"
    ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    assert_rms(o, ref_o, "o")
    assert_rms(final, ref_final, "final_state")


# --- causality: every member x chunk size -------------------------------------------------


@pytest.mark.parametrize("case", SIZES, ids=ids(SIZES), indirect=True)
def test_causal_inside_a_chunk(case):
    """Changing q, k, v, g, beta at t >= t0 leaves o[:, :t0] bit-identical, with t0 inside the
    second chunk and inside a sub-chunk (not at a boundary of either)."""
    kind, layout, C, layer = case
    T = 2 * C + 5
    t0 = C + C // 2 + 3  # C=16: 27, C=32: 51, C=64: 99 -- none a multiple of 16
    assert t0 % 16 and t0 % C
    assert_causal(layer.chunk, kind, layout, RecurrenceShape(B=1, T=T, H=H, HV=HV, K=K, V=V), t0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy warns about inf * 0
@pytest.mark.parametrize("kind", ["kda", "gla", "gated_deltanet"])
def test_strong_decay(kind, compile_layer):
    """One fast-decaying gate channel (g = -7 per token: 105 nats over a 16-token sub-chunk, the
    state forgets it within a few tokens) is a valid input; the output must stay finite and right.
    The unbounded log gate's Grams are guarded: the first chunk spans 112 nats, past what a
    factored diagonal may (its operands would overflow), and takes the elementwise blocks; the
    partial second spans 21 and takes the factored ones."""
    C = 16
    layer = chunk_layer(compile_layer, kind, "kv", C)
    inputs = recurrence_inputs(kind, "kv", RecurrenceShape(B=1, T=C + 3, H=H, HV=HV, K=K, V=V))
    inputs["g"][..., 0] = -7.0  # channel gate: key channel 0 of every value head; scalar: value head 0
    check(layer, inputs)


@pytest.mark.parametrize("case", ONE_LAYOUT, ids=ids(ONE_LAYOUT), indirect=True)
def test_bfloat16_inputs(case):
    """bf16 inputs, B = 2, T = 2C + 3: o (bf16) and the final state (fp32) against the float64
    recurrence on the same bf16 inputs, at fla's bf16 tolerance (k3c verify's, 5e-3)."""
    kind, layout, C, layer = case
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=2, T=2 * C + 3, H=H, HV=HV, K=K, V=V),
                               dtype=torch.bfloat16)
    o, final = layer.chunk(**inputs, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert_rms(o, ref_o, "o", 5e-3)
    assert_rms(final, ref_final, "final_state", 5e-3)


@pytest.mark.parametrize("kind,gate_input,qk_l2norm", [("kda", "clamped", False), ("kda", "bounded", True),
                                                      ("gla", "clamped", False)])
def test_float16_bounded_gates_at_the_bound_stay_finite(kind, gate_input, qk_l2norm, compile_layer, fresh_seed):
    """fp16 inputs with gates at (or below) the bound, so every sub-chunk spans 16 x 5 = 80 nats:
    the factored Gram diagonal's operands reach e^80, far past fp16's 65504, so they must be
    formed in a dtype with fp32's range (once they were cast to fp16 and the output was NaN).
    Keys as fla's tests draw them (torch.rand, |k| ~ sqrt(K / 3)): raw for GLA, unit (normalised
    outside) or raw through the in-kernel L2 norm for KDA (the delta rule needs |k| <= 1).
    B2 T50, K = V = 60. With fp16 inputs the products are tf32, which the interpreter computes in
    fp32: compared with the float64 recurrence on the same fp16 inputs at the fp16 tolerance."""
    options = dict(gate_input=gate_input, qk_l2norm=qk_l2norm)
    table = recurrence_table(kind, "kv", H=2, K=60, V=60, name=f"fp16_{kind}_{gate_input}_{qk_l2norm}", **options)
    layer = compile_layer(pipeline=chunk_pipeline(16), **table)
    op = layer_op(layer)
    assert any(isinstance(o, k3s.GramOp) and o.diagonal.data == "factored" for o in layer.compilation.scheduled.walk())
    gen = torch.Generator().manual_seed(fresh_seed)
    B, T = 2, 50
    inputs = {"q": torch.rand(B, T, 2, 60, generator=gen), "k": torch.rand(B, T, 2, 60, generator=gen),
              "v": torch.rand(B, T, 2, 60, generator=gen)}
    if kind == "kda" and not qk_l2norm:
        inputs["q"], inputs["k"] = (torch.nn.functional.normalize(inputs[n], dim=-1) for n in ("q", "k"))
    if gate_input == "clamped":  # at the bound and below it (the kernel clamps)
        inputs["g"] = -5.0 - 3 * torch.rand(B, T, 2, 60, generator=gen)
    else:  # saturated projections: the bounded gate's sigmoid near 1, g near -5
        inputs["g"] = 20 + torch.rand(B, T, 2, 60, generator=gen)
        inputs["A_log"] = torch.zeros(2)
        inputs["dt_bias"] = torch.zeros(2 * 60)
    if kind == "kda":
        inputs["beta"] = torch.rand(B, T, 2, generator=gen)
    inputs = {n: x.half() if n not in ("A_log", "dt_bias") else x for n, x in inputs.items()}
    inputs["initial_state"] = torch.randn(B, 2, 60, 60, generator=gen)
    o, final = layer.chunk(**inputs, output_final_state=True)
    assert o.dtype == torch.float16 and torch.isfinite(o).all() and torch.isfinite(final).all()
    ref_o, ref_final = reference.recurrence(op, **inputs, output_final_state=True)
    shared_assert_rms(o, ref_o, "o", 2e-3)
    shared_assert_rms(final, ref_final, "final_state", 2e-3)


# --- pipeline variants --------------------------------------------------------------------


def test_smaller_sub_chunk_than_chunk(compile_layer):
    """sub-chunk 8 in chunks of 32: 4 gate-ratio blocks in the Gram and 4 diagonal blocks in the
    triangular solve (the off-diagonal part by products)."""
    kind, layout, C = "kda", "kv", 32
    layer = chunk_layer(compile_layer, kind, layout, C, sub_chunk=8)
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=2 * C + 3, H=H, HV=HV, K=K, V=V))
    check(layer, inputs)


def test_default_pipeline_chunk_entry(compile_layer):
    """The kind's default pipeline (chunk size 64, block-v 64) yields a correct `chunk` too."""
    kind, layout = "kda", "vk"
    layer = compile_layer(**recurrence_table(kind, layout, H=1, HV=2, K=K, V=V, name="kda_vk_chunk_default"))
    assert "chunk" in layer.entries
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=70, H=1, HV=2, K=K, V=V))
    check(layer, inputs)


# --- fuse-chunkwise: what crosses from the prepare kernel to the scan -----------------------


def chunk_entry(kind: str, pipeline: str) -> k3s.EntryOp:
    spec = spec_from_table(recurrence_table(kind, "kv", H=H, HV=HV, K=K, V=V, name=f"{kind}_ir"))
    module = schedule(spec, pipeline).scheduled
    entries = [op for op in module.ops if isinstance(op, k3s.EntryOp) and op.sym_name.data == "chunk"]
    assert len(entries) == 1
    return entries[0]


def dataflow_closed(kernel: k3s.KernelOp) -> None:
    """In program order, every op reads only values defined before it in the same kernel (its
    loads, reloads, stages and the loop's carried state) or its own entry's arguments (the
    tensors it reads and writes): a kernel hands nothing to another but through what it spills."""
    from k3compile.passes.common import entry_values

    defined: set = set(entry_values(kernel.parent_op()).values())
    where = kernel.sym_name.data

    def walk(block) -> None:
        defined.update(block.args)
        for op in block.ops:
            missing = [v.name_hint for v in op.operands if v not in defined]
            assert not missing, f"{where}: {op.name} reads {missing} that it never gets"
            defined.update(op.results)
            for region in op.regions:
                walk(region.block)

    walk(kernel.body.block)


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_fuse_chunkwise_spills_exactly_what_the_scan_reads(kind):
    """The prepare kernel spills W, U, P with the delta rule and only P without, plus with a gate
    the decayed queries and keys QG, KG and the chunk decay gamma_C (one fp32 row per chunk); the
    scan reloads exactly those and nothing else crosses between them (no gate work in the scan)."""
    C = 32
    gated = GATE_OF_KIND[kind] != "none"
    expected = ({"W", "U", "P"} if DELTA_OF_KIND[kind] else {"P"}) | ({"QG", "KG", "gamma_C"} if gated else set())

    # what the scan stages of the unfused schedule read from its chunk-local stages
    unfused = chunk_entry(kind, f"derive-chunkwise{{chunk-size={C}}}")
    (chunked,) = [op for op in unfused.body.ops if isinstance(op, k3s.ChunkedOp)]
    local_values = {v for op in chunked.local_ops() if not op.name.startswith("k3s.load") for v in op.results}
    scan_reads = {v for op in chunked.scan.walk() for v in op.operands}
    assert {v.name_hint for v in scan_reads & local_values} == expected

    entry = chunk_entry(kind, f"derive-chunkwise{{chunk-size={C}}},fuse-chunkwise{{block-v={BLOCK_V}}}")
    assert not any(isinstance(op, k3s.ChunkedOp) for op in entry.walk())
    kernels = [op for op in entry.body.ops if isinstance(op, k3s.KernelOp)]
    assert [k.axes for k in kernels] == [[k3s.GridAxis.CHUNK, k3s.GridAxis.VALUE_HEAD],
                                         [k3s.GridAxis.VALUE_BLOCK, k3s.GridAxis.SEQUENCE_HEAD]]
    prepare, scan_kernel = kernels
    spills = [k3s.argument_name(op.workspace) for op in prepare.walk() if isinstance(op, k3s.SpillOp)]
    reloads = [k3s.argument_name(op.workspace) for op in scan_kernel.walk() if isinstance(op, k3s.ReloadOp)]
    assert sorted(spills) == sorted(expected), f"prepare spills {spills}"
    assert sorted(reloads) == sorted(expected), f"scan reloads {reloads}"
    assert not any(isinstance(op, k3s.ReloadOp) for op in prepare.walk())
    assert not any(isinstance(op, k3s.SpillOp) for op in scan_kernel.walk())

    per_token = {"W": K, "U": V, "P": C, "QG": K, "KG": K}
    per_chunk = {"gamma_C": ("NC", HV, K) if GATE_OF_KIND[kind] == "channel" else ("NC", HV)}
    workspaces = {op.sym_name.data: op.type for op in entry.body.ops
                  if isinstance(op, k3s.TensorArgOp) and op.role.data == "workspace"}
    assert workspaces == {n: k3s.tensor("B", "T", HV, per_token[n], dtype="float") if n in per_token
                          else k3s.tensor(*per_chunk[n], dtype="float32") for n in expected}

    # nothing of the gate is rebuilt in the scan
    assert not any(isinstance(op, (k3s.GateCumsumOp, k3s.LoadGateOp)) for op in scan_kernel.walk())
    # each kernel's stages only read what it loads, reloads or computes itself
    dataflow_closed(prepare)
    dataflow_closed(scan_kernel)


# --- fuse-chunkwise{grouping=split-prepare}: the prepare as two kernels --------------------------


def split_prepare_pipeline(chunk_size: int) -> str:
    return chunk_pipeline(chunk_size).replace("fuse-chunkwise{", "fuse-chunkwise{grouping=split-prepare ")


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_split_prepare_kernels_hand_over_T_only(kind):
    """split-prepare: a gram kernel (Grams, solve) spilling T beside what the scan reads of it, a
    wy kernel reloading T and rebuilding the gate's cumsum (WY products, gate applications), then
    the scan; every kernel's dataflow is closed. Without a delta rule (GLA) nothing is handed over:
    the wy kernel only applies the gate."""
    C = 32
    entry = chunk_entry(kind, f"derive-chunkwise{{chunk-size={C}}},fuse-chunkwise{{grouping=split-prepare block-v={BLOCK_V}}}")
    kernels = [op for op in entry.body.ops if isinstance(op, k3s.KernelOp)]
    gated, delta = GATE_OF_KIND[kind] != "none", DELTA_OF_KIND[kind]
    gram, wy, scan_kernel = kernels
    assert [k.sym_name.data for k in kernels] == [f"{kind}_ir_chunk_gram", f"{kind}_ir_chunk_wy", f"{kind}_ir_chunk_scan"]
    spills = {kernel.sym_name.data: sorted(k3s.argument_name(op.workspace) for op in kernel.walk()
                                           if isinstance(op, k3s.SpillOp)) for kernel in kernels}
    reloads = {kernel.sym_name.data: sorted(k3s.argument_name(op.workspace) for op in kernel.walk()
                                            if isinstance(op, k3s.ReloadOp)) for kernel in kernels}
    handed = ["T_ut"] if delta else []  # T, in its workspace T_ut
    assert spills[gram.sym_name.data] == sorted(["P", *handed, *(["gamma_C"] if gated else [])])
    assert reloads[wy.sym_name.data] == handed
    assert spills[wy.sym_name.data] == sorted([*(["U", "W"] if delta else []), *(["KG", "QG"] if gated else [])])
    assert not any(isinstance(op, (k3s.GramOp, k3s.ForwardSubstitutionOp)) for op in wy.walk())
    assert not any(isinstance(op, (k3s.WYApplyOp, k3s.GateApplyOp)) for op in gram.walk())
    workspaces = {op.sym_name.data: op.type for op in entry.body.ops
                  if isinstance(op, k3s.TensorArgOp) and op.role.data == "workspace"}
    T_ut = k3s.tensor("B", "T", HV, C, dtype="float")
    assert ("T_ut" in workspaces) == delta and workspaces.get("T_ut", T_ut) == T_ut
    dataflow_closed(gram)
    dataflow_closed(wy)
    dataflow_closed(scan_kernel)


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_split_prepare_matches_the_recurrence(kind, compile_layer):
    """The split-prepare grouping, varlen (shorter than a chunk, several chunks and a partial
    one), initial states, grouped value heads, K and V not powers of two."""
    layout, C = "kv", 16
    layer = compile_layer(pipeline=split_prepare_pipeline(C),
                          **recurrence_table(kind, layout, name=f"{kind}_split_prepare", H=H, HV=HV, K=K, V=V))
    check(layer, recurrence_inputs(kind, layout, varlen_shape((5, 2 * C + 3))))



@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_scan_warps_whole_value_rows(kind, compile_layer):
    """fuse-chunkwise{scan-warps=8} with whole value rows in one block (block-v 64 >= V = 40): the
    scan kernel runs 8 warps, the prepare keeps num-warps; varlen with a partial chunk, initial
    states, grouped value heads, both layouts across the members, against the recurrence."""
    layout = LAYOUTS[RECURRENCE_KINDS.index(kind) % 2]
    pipeline = "lower-recurrent,derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=64 num-warps=4 scan-warps=8}"
    layer = compile_layer(pipeline=pipeline, **recurrence_table(kind, layout, name=f"{kind}_{layout}_scan_warps",
                                                               H=H, HV=HV, K=K, V=V))
    kernels = {op.sym_name.data.rsplit("_", 1)[-1]: op.num_warps.value.data for op in layer.compilation.scheduled.walk()
               if isinstance(op, k3s.KernelOp) and "_chunk_" in op.sym_name.data}
    assert kernels == {"prepare": 4, "scan": 8}, kernels
    check(layer, recurrence_inputs(kind, layout, varlen_shape((5, 2 * 16 + 3))))


# --- derive-chunkwise{solve-block=N}: how much of the triangular solve runs row by row ------------


@pytest.mark.parametrize("kind", [kind for kind in RECURRENCE_KINDS if DELTA_OF_KIND[kind]])
@pytest.mark.parametrize("chunk_size, solve_block", [(16, 1), (32, 1), (32, 4)])
def test_solve_block_matches_the_recurrence(kind, chunk_size, solve_block, compile_layer):
    """solve-block=1 inverts I + A by products of nilpotent factors only (no row loop); 4 solves
    4 x 4 diagonal blocks by rows and the rest by products. Varlen with a partial chunk, initial
    states, grouped value heads, K and V not powers of two."""
    layout = "kv"
    pipeline = chunk_pipeline(chunk_size).replace("sub-chunk=16}", f"sub-chunk=16 solve-block={solve_block}}}")
    layer = compile_layer(pipeline=pipeline, **recurrence_table(kind, layout, name=f"{kind}_solve_{chunk_size}_{solve_block}",
                                                               H=H, HV=HV, K=K, V=V))
    source = layer.compilation.source
    assert ("for r in range(0, SUB_T)" in source) == (solve_block > 1)
    check(layer, recurrence_inputs(kind, layout, varlen_shape((5, 2 * chunk_size + 3))))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy warns about inf * 0
@pytest.mark.parametrize("diagonal", ["elementwise", "guarded"])
def test_extracted_diagonal_rows(diagonal, tmp_path, monkeypatch):
    """lower-to-triton's other form of a Gram's elementwise diagonal blocks: each block's key row
    and G picked out of the tiles in registers (diagonal_rows = extract) rather than reloaded
    from memory (its choice, reload). On test_strong_decay's input (the first chunk takes the
    elementwise blocks), the output must stay finite and right."""
    from k3compile.backends.triton import lower
    from k3compile.driver import compile as k3_compile

    choose = lower.gram_choices

    def extract(op, kernel):
        choices = choose(op, kernel)
        if "diagonal_rows" in choices:
            choices["diagonal_rows"] = k3s.DiagonalRowsAttr(k3s.DiagonalRows.EXTRACT)
        return choices

    monkeypatch.setitem(lower.STAGE_CHOICES, k3s.GramOp, [extract])
    C = 16
    pipeline = chunk_pipeline(C).replace("sub-chunk=16}", f"sub-chunk=16 unbounded-diagonal={diagonal}}}")
    table = recurrence_table("kda", "kv", H=H, HV=HV, K=K, V=V, name=f"kda_extract_{diagonal}")
    layer = k3_compile(spec_from_table(table, source="<test extract>"), out_dir=tmp_path, pipeline=pipeline)
    grams = [o for o in layer.compilation.scheduled.walk() if isinstance(o, k3s.GramOp)]
    assert grams and all(g.diagonal_rows.data == k3s.DiagonalRows.EXTRACT for g in grams)
    assert "b_pick" in layer.compilation.source and "t_j = start" not in layer.compilation.source
    inputs = recurrence_inputs("kda", "kv", RecurrenceShape(B=1, T=C + 3, H=H, HV=HV, K=K, V=V))
    inputs["g"][..., 0] = -7.0
    check(layer, inputs)
