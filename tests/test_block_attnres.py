"""Block AttnRes's two phases (derive-block-attnres): `block_partials` (a block's queries over its
completed representatives, the online softmax's partials stored) and `block_merge` (one query's
partials merged with the block's partial sum) against the one-phase reference
(k3compile.ir.reference.attnres over the representatives and the partial sum) and the two-phase
reference semantics; partials that are off must break the merge; the entries' and
k3compile.ops.attnres's refusals; the bytes the two forms move.

Fresh random inputs every run (conftest's seed), fp32 in Triton's interpreter; the modules
allocate their outputs NaN-filled (conftest sets K3C_POISON_OUTPUTS), so an element a kernel
never writes is NaN. D = 48 (not a power of two: masked columns), Q = 5 queries (not a power of
two: masked queries; in blocks of 2 as well, the last one partial), 1 to 4 representatives (the
most the layer allows), odd row counts.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from conftest import layer_op, one_line
from k3compile.ir import reference

D, Q, NUM_BLOCKS = 48, 5, 4
RTOL = 1e-5  # relative norm; the interpreter's fp32 gets ~1e-7
QUERY_BLOCKS = "partials-schedule=query-blocks"
PIPELINES = {"default": None,  # phase 1 by blocks of queries
             # phase 1 in blocks of columns: one block of 64 at D = 48, groups of 4 rows
             "columns": "fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=columns},"
                        "derive-block-attnres-backward,outline-kernels",
             # the columns form's numerators, in blocks of 32 columns (the last partial), groups of 8 rows
             "columns-numerator": "fuse-attnres,derive-block-attnres{partials-schedule=columns partials=numerator "
                                  "block-columns=32 columns-rows=8},outline-kernels",
             "two-per-program": f"fuse-attnres,derive-block-attnres{{{QUERY_BLOCKS} queries-per-program=2}},"
                                "outline-kernels",
             # groups of 8 from 8 rows: the calls of 7 and 1 rows take the per-row kernels, of 15 the groups
             "groups-of-rows": f"fuse-attnres,derive-block-attnres{{{QUERY_BLOCKS} rows-per-program=8 "
                               "grouped-from-rows=8},outline-kernels",
             "groups-numerator": f"fuse-attnres,derive-block-attnres{{{QUERY_BLOCKS} rows-per-program=4 "
                                 "grouped-from-rows=0 partials=numerator},outline-kernels"}


@pytest.fixture(scope="module", params=list(PIPELINES), ids=list(PIPELINES))
def layer(request, compile_layer):
    return compile_layer(name=f"block_attnres_{request.param.replace('-', '_')}", kind="attnres", hidden_size=D,
                         num_blocks=NUM_BLOCKS, block_size=3, eps=1e-5, dtype="float32",
                         pipeline=PIPELINES[request.param])


def inputs(n: int, B: int, T: int):
    """Representatives of growing scale (block sums grow with depth) sharing a direction, a
    partial sum, and Q queries large enough that the softmax is far from uniform, gains not 1."""
    scales = torch.linspace(0.5, 4.0, n + 1)[:, None, None, None]
    sources = torch.randn(n + 1, B, T, D) * scales + 0.3 * torch.randn(n + 1, 1, 1, D)
    queries = torch.randn(Q, D) * 3 / math.sqrt(D)
    gains = 1 + 0.3 * torch.randn(Q, D)
    return sources[:n].contiguous(), sources[n].contiguous(), queries, gains


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL) -> None:
    assert got.shape == want.shape, f"{name}: shape {list(got.shape)}, expected {list(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: {(~torch.isfinite(got)).sum().item()} non-finite (unwritten?)"
    err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
    assert err < rtol, f"{name}: relative error {err:.2e}"


def one_phase(op, representatives, partial_sum, query, gain):
    return reference.attnres(op, torch.cat([representatives, partial_sum[None]]), query, gain)


def partial_names(layer) -> list[str]:
    """The partials block_merge takes, in order: (block_lse, block_mix) in the normalised form,
    (block_max, block_normaliser, block_numerator) in the numerator form (then output_lse)."""
    return [name for name in list(inspect.signature(layer.block_merge).parameters)[3:] if name != "output_lse"]


def reference_partials(layer, op, representatives, queries, gains):
    partials = reference.attnres_block_partials(op, representatives, queries, gains)
    return reference.attnres_normalised_partials(*partials) if partial_names(layer)[0] == "block_lse" else partials


# --- the reference semantics ---------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 8])
def test_reference_two_phases_are_the_one_phase_aggregate(n):
    from k3compile.frontend import spec_to_module
    from k3compile.spec import spec_from_table

    op = next(iter(spec_to_module(spec_from_table(dict(name="ar", kind="attnres", hidden_size=D, num_blocks=8,
                                                       block_size=3, eps=1e-5))).ops))
    representatives, partial_sum, queries, gains = inputs(n, 2, 3)
    block_max, block_normaliser, block_numerator = reference.attnres_block_partials(op, representatives, queries,
                                                                                    gains)
    assert block_max.shape == block_normaliser.shape == (Q, 2, 3) and block_numerator.shape == (Q, 2, 3, D)
    block_lse, block_mix = reference.attnres_normalised_partials(block_max, block_normaliser, block_numerator)
    for j in range(Q):
        want = one_phase(op, representatives, partial_sum, queries[j], gains[j])
        merged = reference.attnres_block_merge(op, block_max[j], block_normaliser[j], block_numerator[j], partial_sum,
                                               queries[j], gains[j])
        torch.testing.assert_close(merged, want, rtol=1e-12, atol=1e-12)
        # the normalised partials are the same state: (lse, 1, a / z)
        merged = reference.attnres_block_merge(op, block_lse[j], torch.ones_like(block_lse[j]), block_mix[j],
                                               partial_sum, queries[j], gains[j])
        torch.testing.assert_close(merged, want, rtol=1e-12, atol=1e-12)


# --- the compiled entries ------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, NUM_BLOCKS])
@pytest.mark.parametrize("B,T", [(1, 7), (3, 5), (1, 1)], ids=["R7", "R15", "R1"])
def test_two_phases_match_the_one_phase_reference(layer, n, B, T):
    op = layer_op(layer)
    representatives, partial_sum, queries, gains = inputs(n, B, T)
    partials = layer.block_partials(representatives, queries, gains)
    for name, got, want in zip(partial_names(layer), partials,
                               reference_partials(layer, op, representatives, queries, gains), strict=True):
        assert got.dtype == (representatives.dtype if name == "block_mix" else torch.float32), name
        assert_close(name, got, want)
    for j in range(Q):
        out = layer.block_merge(partial_sum[None], queries[j], gains[j], *(p[j] for p in partials))[0]
        assert out.dtype == partial_sum.dtype
        assert_close(f"out of query {j}", out, one_phase(op, representatives, partial_sum, queries[j], gains[j]))
    if n > 1:  # the queries' scores differ far beyond the tolerance: partials of a mixed-up query fail
        first = partials[0].double()
        spread = ((first - first.mean(0)).norm() / first.norm()).item()
        assert spread > 100 * RTOL, f"test inputs should give the queries different scores: {spread:.1e}"


def reference_merge(layer, op, partials, partial_sum, query, gain):
    """The reference's merge of one query's partials, given in the layer's form."""
    if partial_names(layer)[0] == "block_lse":
        block_lse, block_mix = partials
        partials = (block_lse, torch.ones_like(block_lse), block_mix)
    return reference.attnres_block_merge(op, *partials, partial_sum, query, gain)


@pytest.mark.parametrize("part", [0, 1, 2], ids=["first", "second", "third"])
def test_merge_reads_the_partials(layer, part):
    """The merge computes what the reference merge does from the partials it is given, off ones
    included (the max or log-sum-exp moved, the normaliser or a mix scaled), and each change
    moves that result far beyond the tolerance, so a merge that ignores or misreads a partial
    fails. The first partial is moved by `shift`, which hands the whole weight to the block's
    row or to the partial sum's (a small move can change nothing where one already has it); the
    others are scaled with the block's row weighted alone, where they make the output."""
    op = layer_op(layer)
    n = 3
    representatives, partial_sum, queries, gains = inputs(n, 2, 3)
    query, gain = queries[1], gains[1]
    partials = [p[1].clone() for p in layer.block_partials(representatives, queries, gains)]
    if part >= len(partials):
        pytest.skip(f"the form of {partial_names(layer)} has {len(partials)} partials")
    # every score is within sqrt(D) |gain * query| of 0 (an RMSNorm'd row has norm <= sqrt(D)) and the
    # block's log-weight (its max or log-sum-exp, the normaliser in [1, n]) within log n above its scores,
    # so after the shift the other side weighs at most e^-40 of the winner
    shift = 2 * math.sqrt(D) * (gain * query).norm().item() + math.log(n) + 40

    def moved(by: float) -> list[torch.Tensor]:
        return [partials[0] + by, *partials[1:]]

    def scaled(given: list[torch.Tensor]) -> list[torch.Tensor]:
        return [p * 1.1 if i == part else p for i, p in enumerate(given)]

    pairs = ([(partials, moved(shift)), (partials, moved(-shift))] if part == 0
             else [(moved(shift), scaled(moved(shift)))])
    changes = []
    for given, off in pairs:
        out = layer.block_merge(partial_sum[None], query, gain, *off)[0]
        want = reference_merge(layer, op, off, partial_sum, query, gain)
        assert_close(f"merge of {partial_names(layer)[part]} off", out, want)
        unchanged = reference_merge(layer, op, given, partial_sum, query, gain)
        changes.append(((want - unchanged).norm() / want.norm()).item())
    assert max(changes) > 100 * RTOL, f"the change to {partial_names(layer)[part]} should move the merge: {changes}"


def test_derived_from_the_aggregate(layer):
    """Both phases are the aggregate's kernels with the loop over the sources split, the per-row
    kernel (the grouped one with rows-per-program > 1): block_partials stores its partials where
    the aggregate stores h and the log-sum-exp; block_merge starts from the partials' load where
    the aggregate starts from nothing (in a group's loop: each row resumes from its own partials
    where the aggregate restarts at -inf) and keeps its stores (h, and the log-sum-exp for the
    backward). The loops' stages are the aggregate's."""
    from k3compile.ir import k3s

    stages = kernel_stages(layer)
    start, *loop, store, lse = stages["aggregate"][1:]
    assert (start, store, lse) == ("k3s.softmax_start", "k3s.normalize_store", "k3s.store_lse")
    form = "normalised_" if partial_names(layer)[0] == "block_lse" else ""
    if "block_partials_columns" in stages:  # phase 1 in blocks of columns (its own test below)
        assert stages["block_merge"] == ["k3s.fold_query", f"k3s.load_{form}partials", *loop, store, lse]
        return
    assert "block_partials" in stages or "block_partials_groups" in stages
    if "block_partials" in stages:  # a program per row (every call, or those below grouped-from-rows)
        assert stages["block_partials"] == ["k3s.fold_query", start, *loop, f"k3s.store_{form}partials"]
        assert stages["block_merge"] == ["k3s.fold_query", f"k3s.load_{form}partials", *loop, store, lse]
    if "block_partials_groups" in stages:  # both phases over groups of rows
        groups = stages["aggregate_groups"]
        at, restart = groups.index("k3s.normalize_store"), groups.index("k3s.row_start")
        assert groups[at:at + 2] == ["k3s.normalize_store", "k3s.store_lse"]
        assert stages["block_partials_groups"] == [*groups[:at], f"k3s.store_{form}partials", *groups[at + 2:]]
        # each row resumes from its own partials where the aggregate restarts from nothing
        assert stages["block_merge_groups"] == [*groups[:restart], f"k3s.load_{form}partials", "k3s.row_resume",
                                                *groups[restart + 1:]]


def kernel_stages(layer) -> dict[str, list[str]]:
    """Each kernel's ops in program order (the kernel itself left out), by the kernel's name
    without the layer's."""
    from k3compile.ir import k3s

    return {op.sym_name.data.removeprefix(f"{layer.spec.name}_"): [o.name for o in op.walk()][1:]
            for op in layer.compilation.scheduled.ops if isinstance(op, k3s.KernelOp)}


def test_columns_form(layer):
    """partials-schedule=columns (an option until timed on a GPU): the queries folded once per call by a kernel of
    their own, then per group of rows two sweeps over the hidden columns, the second last block
    first: the Gram matrix and the queries' dots on the first, the group's mixes written on the
    second; no online rescale (k3s.online_softmax), no fold per program. The printed kernel's
    products are tl.dot, its rows read with L2 hints (kept, then last use)."""
    from k3compile.ir import k3s

    stages = kernel_stages(layer)
    if "block_partials_columns" not in stages:
        pytest.skip("the query-blocks form")
    assert stages["block_partials_fold"] == ["k3s.fold_queries_split"]
    stored = "k3s.store_group_stats"
    assert stages["block_partials_columns"] == [
        "k3s.zeros", "k3s.zeros", "k3s.column_loop", "k3s.load_group_sources", "k3s.load_folded_queries",
        "k3s.group_column_dots", "k3s.next_column", "k3s.group_scores", "k3s.group_softmax", stored,
        "k3s.split_weights", "k3s.column_loop", "k3s.load_group_sources", "k3s.group_mix", "k3s.store_group_rows",
        "k3s.next_column"]
    kernel = next(op for op in layer.compilation.scheduled.ops
                  if isinstance(op, k3s.KernelOp) and op.sym_name.data.endswith("block_partials_columns"))
    sweeps = [op for op in kernel.walk() if isinstance(op, k3s.ColumnLoopOp)]
    assert [op.reverse is not None and bool(op.reverse.value.data) for op in sweeps] == [False, True]
    source = layer.path.read_text()
    code = source[source.index("def " + kernel.sym_name.data + "_kernel("):]
    code = code[:code.index("\ndef ")]
    assert code.count("tl.dot(") == 5 + 1  # Gram, dots (2), mix (2); the rare rescan's
    assert "eviction_policy='evict_last'" in code and "eviction_policy='evict_first'" in code
    assert "tl.exp(b_score - b_max" not in code.split("k3s.group_softmax")[0]  # no softmax in the sweeps


@pytest.mark.parametrize("entry,name,bad,message", [
    ("block_partials", "representatives", lambda x: torch.randn(NUM_BLOCKS + 1, 1, 3, D), "expected 1 to 4 sources"),
    ("block_partials", "gains", lambda x: x[:, :-1].contiguous(), "dim 1"),
    ("block_merge", "partial_sum", lambda x: torch.randn(2, 1, 3, D), "expected 1 to 1 sources"),
    ("block_merge", 0, lambda x: x.half(), "expected dtype torch.float32"),  # max or lse: fp32 in either form
    ("block_merge", -1, lambda x: x[:, :-1].contiguous(), "dim 1"),  # numerator or mix: [B, T, D]
])
def test_entries_refuse_bad_arguments(layer, entry, name, bad, message):
    representatives, partial_sum, queries, gains = inputs(2, 1, 3)
    partials = layer.block_partials(representatives, queries, gains)
    args = {"block_partials": dict(representatives=representatives, queries=queries, gains=gains),
            "block_merge": dict(partial_sum=partial_sum[None], query=queries[0], gain=gains[0],
                                **{k: p[0] for k, p in zip(partial_names(layer), partials, strict=True)})}[entry]
    name = partial_names(layer)[name] if isinstance(name, int) else name  # a partial, by its place
    args[name] = bad(args[name])
    with pytest.raises(ValueError) as err:
        getattr(layer, entry)(**args)
    assert one_line(str(err.value)) and str(err.value).startswith(f"{name}:") and message in str(err.value)


# --- k3compile.ops.attnres ---------------------------------------------------------------------


@pytest.fixture
def ops_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "k3c_cache"))


def test_ops_two_phases_are_attnres_aggregate(ops_cache):
    from k3compile.ops.attnres import attnres_aggregate, attnres_block_merge, attnres_block_partials

    representatives, partial_sum, queries, gains = inputs(3, 1, 5)
    partials = attnres_block_partials(representatives, queries, gains, eps=1e-5)
    assert [tuple(p.shape) for p in partials] == [(Q, 1, 5), (Q, 1, 5, D)]
    for j in range(Q):
        out = attnres_block_merge([p[j] for p in partials], partial_sum, queries[j], gains[j], eps=1e-5)
        want = attnres_aggregate(torch.cat([representatives, partial_sum[None]]), queries[j], gains[j], eps=1e-5)
        assert out.shape == (1, 5, D) and out.dtype == torch.float32
        assert_close(f"query {j}", out, want.double())


def ops_arguments():
    representatives, partial_sum, queries, gains = inputs(2, 1, 3)
    partials = [torch.randn(1, 3), torch.randn(1, 3, D)]
    return dict(representatives=representatives, queries=queries, gains=gains, partials=partials,
                partial_sum=partial_sum, query=queries[0], gain=gains[0])


def replace_partial(index: int, make):
    def bad(args):
        partials = list(args["partials"])
        partials[index] = make(partials[index])
        return partials
    return bad


@pytest.mark.parametrize("function,name,bad,message", [
    ("partials", "representatives", lambda a: a["representatives"][0], "expected shape [n, B, T, D], got [1, 3, 48]"),
    ("partials", "representatives", lambda a: a["representatives"].double(), "expected dtype"),
    ("partials", "representatives", lambda a: a["representatives"][:0], "expected 1 to 8 sources (dim 0), got 0"),
    ("partials", "queries", lambda a: a["queries"][:, :-1], "expected shape [Q, D] with D = 48, got [5, 47]"),
    ("partials", "gains", lambda a: a["gains"][:-1], "expected shape [Q, D] with Q = 5, D = 48, got [4, 48]"),
    ("partials", "gains", lambda a: a["gains"].to("meta"), "expected a tensor on cpu (as representatives), got meta"),
    ("partials", "queries", lambda a: a["queries"].tolist(), "expected a tensor [Q, D], got list"),
    ("merge", "partials", lambda a: a["partials"][:1], "expected (block_lse, block_mix) of one query, got a list of 1"),
    ("merge", "partial_sum", lambda a: a["partial_sum"].int(), "expected dtype"),
    ("merge", "query", lambda a: a["query"][:-1], "expected shape [D] with D = 48, got [47]"),
    ("merge", "block_lse", replace_partial(0, lambda p: p[:, :-1]), "expected shape [B, T] with B = 1, T = 3"),
    ("merge", "block_lse", replace_partial(0, lambda p: p.bfloat16()), "expected dtype torch.float32"),
    ("merge", "block_mix", replace_partial(1, lambda p: p[..., :-1]),
     "expected shape [B, T, D] with B = 1, T = 3, D = 48"),
    ("merge", "block_mix", replace_partial(1, lambda p: p.to("meta")),
     "expected a tensor on cpu (as partial_sum), got meta"),
])
def test_ops_refuse_bad_input(ops_cache, function, name, bad, message):
    from k3compile.ops.attnres import attnres_block_merge, attnres_block_partials

    args = ops_arguments()
    args["partials" if name.startswith("block_") else name] = bad(args)
    with pytest.raises(ValueError) as err:
        if function == "partials":
            attnres_block_partials(args["representatives"], args["queries"], args["gains"])
        else:
            attnres_block_merge(args["partials"], args["partial_sum"], args["query"], args["gain"])
    text = str(err.value)
    assert one_line(text) and text.startswith(f"{name}:") and message in text, text


# --- bytes -----------------------------------------------------------------------------------


def test_bytes_at_k3():
    """docs/attnres.md's figures: K3's width, 8 representatives, 24 aggregation points a block, bf16."""
    from k3compile.passes.derive_block_attnres import block_attnres_bytes, default_queries_per_program

    assert default_queries_per_program(7168) == 2
    figures = block_attnres_bytes()  # the normalised partials: an fp32 log-sum-exp and a bf16 row
    assert figures["one_phase"] == 10 * 7168 * 2  # 9 rows read, h written
    assert figures["block_merge"] == 4 + 7168 * 2 + 2 * 7168 * 2
    assert figures["block_partials"] == 8 * 7168 * 2 * 12 / 24 + 4 + 7168 * 2  # 12 programs a row read its 8
    assert round(figures["two_phase"]) == 114696 and round(figures["two_phase_one_read"]) == 62131
    numerator = block_attnres_bytes(partials="numerator")  # max and normaliser fp32, an fp32 row
    assert numerator["block_merge"] == 8 + 7168 * 4 + 2 * 7168 * 2
    assert round(numerator["two_phase"]) == 143376 and round(numerator["two_phase_one_read"]) == 90811
    # every query in one program: the representatives are read once a block either way
    whole = block_attnres_bytes(hidden_size=48, queries_per_program=32)
    assert whole["block_partials"] == whole["block_partials_one_read"]


def test_k3c_verify_runs_both_phases_against_the_one_pass_reference(monkeypatch):
    """`k3c verify` of an attnres spec checks the two phases too: the partials against the
    reference's and every query's merged h against the one-pass aggregate; a wrong phase fails
    its rows (here the reference's partials made off by a factor: the comparison is live)."""
    from k3compile.spec import spec_from_table
    from k3compile.checking.verify import verify

    spec = spec_from_table({"name": "verify_blocks", "kind": "attnres", "hidden_size": 48, "num_blocks": 3,
                            "block_size": 4}, source="<test>")
    results = verify(spec, device="cpu", seed=3)
    merged = [r for r in results if r.entry == "block_merge"]
    assert {r.tensor for r in merged} == {"block_lse", "block_mix", "out"}
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    partials = reference.attnres_block_partials
    monkeypatch.setattr(reference, "attnres_block_partials",
                        lambda *args: (lambda m, z, a: (m, z, a * 1.01))(*partials(*args)))
    broken = [r for r in verify(spec, device="cpu", seed=3, quick=True) if r.entry == "block_merge"]
    assert [r.tensor for r in broken if not r.passed] == ["block_mix"]


def test_verify_checks_the_partials_in_the_layers_form(layer):
    """k3c verify's block_merge case reads which form of the partials the module has from its
    block_merge entry and checks them against the reference's in that form (here every build of
    this file's fixture, both forms), then every h against the one-pass aggregate."""
    from k3compile.checking.verify import AttnResCase, compare, run_attnres_case

    rows = run_attnres_case(layer, "block_merge", layer_op(layer), AttnResCase("two phases", NUM_BLOCKS, 2, 5),
                            torch.float32, "cpu", torch.Generator().manual_seed(5))
    assert [name for name, _, _ in rows] == [*partial_names(layer), "out"]
    for name, got, want in rows:
        _, rms = compare(got, want)
        assert rms < RTOL, f"{name}: RMS ratio {rms:.1e}"
