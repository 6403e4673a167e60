"""`k3c prove`: the derived chunkwise schedules equal the token recurrence in exact arithmetic,
deliberately wrong schedules do not, and the two oracles (k3compile/checking/exact.py's token recurrence and
ir/reference.py's float64 one) agree with each other."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from sympy import Matrix
from xdsl.dialects.builtin import i1

import k3compile.passes.derive_backward as derive_backward
import k3compile.passes.derive_chunkwise as derive_chunkwise
import k3compile.passes.fuse_chunkwise as fuse_chunkwise
from conftest import (run_cli, DELTA_OF_KIND, EXAMPLES, GATE_OF_KIND, RECURRENCE_KINDS, as_tensor, exact_as_torch,
                      one_line, recurrence_table)
from k3compile.errors import IRError
from k3compile.frontend import spec_to_module
from k3compile.checking import exact
from k3compile.ir import k3s, reference
from k3compile.passes.common import make, props
from k3compile.checking.prove import checked, prove_chunkwise, prove_fused_chunkwise, prove_replay
from k3compile.spec import load_spec, spec_from_table

DELTA_KINDS = [kind for kind in RECURRENCE_KINDS if DELTA_OF_KIND[kind]]


def spec_of(kind: str):
    return load_spec(EXAMPLES / f"{kind}.toml")


run = run_cli


# --- the derived schedules hold -----------------------------------------------------------


def proved_lengths(kind: str, lengths) -> list[int]:
    """The lengths of the proofs of an example's chunkwise schedule: the channel-gated examples
    (unbounded log gates: guarded Gram diagonals) prove each for both outcomes of the span checks."""
    return [length for length in lengths for _ in range(2 if GATE_OF_KIND[kind] == "channel" else 1)]


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_derived_schedule_proved(kind, chunk_size, fresh_seed):
    results = prove_chunkwise(spec_of(kind), chunk_size, seed=fresh_seed)
    # by default: one partial chunk, an exact multiple, and several chunks with a partial tail
    assert [r.length for r in results] == proved_lengths(kind, [max(1, chunk_size - 1), 2 * chunk_size,
                                                                2 * chunk_size + 1])
    for r in results:
        assert f"chunk-size={chunk_size}" in r.schedule
        assert r.holds, f"T={r.length}: {r.first_mismatch}"
        assert r.first_mismatch == ""


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_derived_schedule_proved_at_other_lengths(kind, chunk_size, fresh_seed):
    """Lengths the defaults skip: a single token, exactly one chunk, several chunks plus 2."""
    lengths = (1, chunk_size, 3 * chunk_size + 2)
    results = prove_chunkwise(spec_of(kind), chunk_size, lengths=lengths, seed=fresh_seed)
    assert [r.length for r in results] == proved_lengths(kind, lengths)
    assert all(r.holds for r in results), [r.first_mismatch for r in results]


@pytest.mark.parametrize("kind", DELTA_KINDS)
def test_negative_eigenvalue_schedules_proved_with_beta_up_to_two(kind, fresh_seed):
    """beta_input = logits_neg_eigval: the proofs draw beta in (0, 2), so they cover the
    transitions I - beta k k^T with a negative eigenvalue; chunkwise, fused, replay, segment scan."""
    from k3compile.checking.prove import proof_inputs, prove_segment_scan

    spec = spec_from_table(recurrence_table(kind, beta_input="logits_neg_eigval", name=f"neg_{kind}"))
    op = next(iter(spec_to_module(spec).ops))
    betas = [b for _ in range(20) for b in proof_inputs(random.Random(fresh_seed), op, 8).beta]
    assert max(betas) > 1 and min(betas) > 0 and max(betas) < 2
    results = (prove_chunkwise(spec, 3, seed=fresh_seed) + prove_fused_chunkwise(spec, 3, seed=fresh_seed)
               + prove_replay(spec, 3, seed=fresh_seed) + prove_segment_scan(spec, 3, seed=fresh_seed))
    assert results and all(r.holds for r in results), [r.first_mismatch for r in results if not r.holds]


def test_derived_schedule_proved_chunk_64(fresh_seed):
    """The production chunk size, for the richest member only (sympy is slow at 129 tokens)."""
    results = prove_chunkwise(spec_of("kda"), 64, seed=fresh_seed)
    assert [r.length for r in results] == proved_lengths("kda", [63, 128, 129])
    assert all(r.holds for r in results), [r.first_mismatch for r in results]


@pytest.mark.parametrize("gate_input", ["log", "clamped"])  # the diagonal blocks guarded, factored
@pytest.mark.parametrize("chunk_size, sub_chunk", [(4, 2), (6, 2), (4, 1)])
def test_gram_row_blocks_proved(gate_input, chunk_size, sub_chunk, fresh_seed):
    """A channel gate's Grams as the kernels form them: per row block the references, the left,
    right and diagonal factors, the blocks below the diagonal bridged between references; with
    several blocks per chunk and a partial last chunk (and block). An unbounded gate's guarded
    diagonal is proved for both outcomes of its span check."""
    spec = spec_from_table(recurrence_table("kda", gate_input=gate_input, name=f"kda_{gate_input}"))
    module = spec_to_module(spec)
    diagonal = derive_chunkwise.gram_diagonal(next(iter(module.ops)), sub_chunk)
    assert diagonal == ("factored" if gate_input == "clamped" else "guarded")
    results = prove_chunkwise(spec, chunk_size, lengths=(chunk_size - 1, 2 * chunk_size + 1), seed=fresh_seed,
                              sub_chunk=sub_chunk)
    assert all(r.holds for r in results), [r.first_mismatch for r in results]
    assert all(f"sub-chunk={sub_chunk}" in r.schedule for r in results)
    branches = {r.schedule.rpartition(", ")[2] for r in results if "span checks" in r.schedule}
    assert branches == (set() if gate_input == "clamped" else {"span checks hold (factored diagonal)",
                                                              "span checks fail (elementwise diagonal)"})


# --- the kernels fuse-chunkwise makes of the schedule ----------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 3, 16])
@pytest.mark.parametrize("grouping", fuse_chunkwise.GROUPINGS)
@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_fused_kernels_proved(kind, grouping, chunk_size, fresh_seed):
    """The lowered kernels, run one after the other and handing over only what they spill and
    reload, equal the token recurrence (a partial chunk, and several chunks with a tail)."""
    results = prove_fused_chunkwise(spec_of(kind), chunk_size, grouping, seed=fresh_seed)
    assert [r.length for r in results] == proved_lengths(kind, [max(1, chunk_size - 1), 2 * chunk_size + 1])
    assert all(f"grouping={grouping}" in r.schedule for r in results)
    assert all(r.holds for r in results), [r.first_mismatch for r in results]


@pytest.mark.parametrize("kind", ["kda", "gated_deltanet", "deltanet"])
def test_summary_prepare_skips_the_guarded_stages(kind, fresh_seed):
    """Sharing the chunk prepare's code (guard-spill-only-stages, merge-identical-kernels), the
    summary prepare's launch skips the guarded stages: it spills what it spilled with its own
    code, no more, the same values as the chunk prepare; the chunk entry, guard on, still equals
    the token recurrence."""
    from xdsl.context import Context

    from k3compile.backends.triton.guard_spill_only_stages import GuardSpillOnlyStagesPass
    from k3compile.backends.triton.merge_identical_kernels import MergeIdenticalKernelsPass
    from k3compile.checking.prove import derived, entry_kernels, proof_inputs

    layer_op, module = derived(spec_of(kind), "derive-chunkwise{chunk-size=3},fuse-chunkwise,"
                                              "derive-segment-scan{chunk-size=3},lower-segment-scan,outline-kernels")
    own_code = module.clone()
    GuardSpillOnlyStagesPass().apply(Context(), module)
    MergeIdenticalKernelsPass().apply(Context(), module)
    summary, chunk = entry_kernels(module, "segment_summary")[0], entry_kernels(module, "chunk")[0]
    (flag,) = summary.flags.data
    assert summary.code_name() == chunk.sym_name.data
    assert not summary.flag_on(flag) and chunk.flag_on(flag)
    x = proof_inputs(random.Random(fresh_seed), layer_op, 7)

    def spills(prepare: k3s.KernelOp) -> dict:
        workspaces: dict = {}
        exact.run_prepare_kernel(prepare, x, 3, workspaces)
        return workspaces

    own, shared, full = spills(entry_kernels(own_code, "segment_summary")[0]), spills(summary), spills(chunk)
    assert own.keys() == shared.keys() < full.keys()
    assert all(shared[key] == own[key] == full[key] for key in shared)
    result = checked(kind, "chunk", exact.token_recurrence(x, DELTA_OF_KIND[kind]),
                     lambda: exact.run_lowered_entry(entry_kernels(module, "chunk"), x))
    assert result.holds, result.first_mismatch


def patch_fusion(monkeypatch, mutate) -> list:
    """Make fuse-chunkwise produce its real kernels with `mutate(kernels)` applied to them."""
    original = fuse_chunkwise.split_kernels
    mutated = []

    def wrong_kernels(*args, **kwargs):
        workspaces, kernels = original(*args, **kwargs)
        mutated.append(mutate(kernels))
        return workspaces, mutated[-1]

    monkeypatch.setattr(fuse_chunkwise, "split_kernels", wrong_kernels)
    return mutated


def drop_spill(value):
    def mutate(kernels):
        spill = next(op for kernel in kernels for op in kernel.body.ops
                     if isinstance(op, k3s.SpillOp) and k3s.argument_name(op.workspace) == k3s.workspace_name(value))
        spill.detach()
        spill.erase()
        return kernels

    return mutate


@pytest.mark.parametrize("grouping, value", [("split", "W"), ("split", "U"), ("split", "P"), ("split-prepare", "T")])
def test_fused_kernels_missing_a_spill_not_proved(monkeypatch, grouping, value, fresh_seed):
    """A kernel that reloads what no earlier kernel spilled is a wrong fusion: reported with the
    value's name, never 'holds'."""
    mutated = patch_fusion(monkeypatch, drop_spill(value))
    results = prove_fused_chunkwise(spec_of("kda"), 3, grouping, seed=fresh_seed)
    assert mutated, "the proof did not go through fuse_chunkwise.split_kernels"
    assert results and not any(r.holds for r in results)
    assert all(f"reloads {value}," in r.first_mismatch for r in results)


def test_fused_kernels_in_the_wrong_order_not_proved(monkeypatch, fresh_seed):
    """split-prepare's wy kernel launched before the gram kernel reloads a T not yet spilled."""
    patch_fusion(monkeypatch, lambda kernels: [kernels[1], kernels[0], *kernels[2:]])
    results = prove_fused_chunkwise(spec_of("gated_deltanet"), 3, "split-prepare", seed=fresh_seed)
    assert results and not any(r.holds for r in results)
    assert all("reloads T," in r.first_mismatch for r in results)


def test_fused_kernels_of_a_wrong_schedule_not_proved(monkeypatch, fresh_seed):
    """A wrong derivation stays wrong after fusion: the fused proof sees it too."""
    patch_schedule(monkeypatch, query_gram_strict)
    results = prove_fused_chunkwise(spec_of("gla"), 3, seed=fresh_seed)
    assert not all(r.holds for r in results)


# --- k3c prove ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_cli_prove_passes(capsys, kind, fresh_seed):
    code, out, err = run(capsys, "prove", EXAMPLES / f"{kind}.toml", "--chunk-size", 3, "--draft-tokens", 1,
                         "--seed", fresh_seed)
    assert code == 0, f"exit code {code}: {out}\n{err}"
    # 3 chunkwise lengths, the fused kernels of both groupings at 2 lengths each (the channel
    # gates': both outcomes of the span checks at each), replay of 0 and 1 accepted tokens,
    # spec_step after 0 and 1 accepted, the same two for verify=chunked, segment scan:
    # associativity and 5 splits; the backward's gradients at the 3 chunkwise lengths, and its
    # stores' chain rules (q, k, v, and g and beta where the member reads them); the saving
    # forward's values against the backward prepare's at 2 lengths
    chunkwise = len(proved_lengths(kind, [2, 6, 7])) + 2 * len(proved_lengths(kind, [2, 7]))
    backward = len(proved_lengths(kind, [2, 6, 7])) + 3 + (GATE_OF_KIND[kind] != "none") + DELTA_OF_KIND[kind]
    assert f"{chunkwise + 14 + backward + 2} passed, 0 failed" in out
    assert "save-forward-values: " in out
    assert "fuse-chunkwise{grouping=split-prepare}" in out
    assert "derive-backward{chunk-size=3}" in out
    assert "lower-speculative{verify=chunked}: spec_step, accept 1" in out
    assert "spec_step, accept 1" in out
    assert "FAILED" not in out


@pytest.mark.parametrize("spec", ["attnres", "latent_moe"])
def test_cli_prove_without_derived_schedule_is_bad_input(capsys, spec):
    code, out, err = run(capsys, "prove", EXAMPLES / f"{spec}.toml", "--chunk-size", 3)
    assert code == 2, f"exit code {code}: {out}\n{err}"
    assert "Traceback" not in err
    assert one_line(err) and "no derived schedule" in err


# --- deliberately wrong schedules fail ------------------------------------------------------


def the_stage(chunked: k3s.ChunkedOp, op_type, result: str | None = None):
    """The one stage of op_type (whose result is named `result`, when given)."""
    found = [op for op in chunked.walk() if isinstance(op, op_type)
             and (result is None or op.results[0].name_hint == result)]
    assert len(found) == 1, f"expected one {op_type.name} {result or ''} in the schedule, found {len(found)}"
    return found[0]


def key_gram_inclusive(chunked):
    the_stage(chunked, k3s.GramOp, "A").properties.update(props(k3s.GramOp, mask="inclusive"))


def query_gram_strict(chunked):
    the_stage(chunked, k3s.GramOp, "P").properties.update(props(k3s.GramOp, mask="strict"))


def wy_key_ungated(chunked):
    """W = T K instead of T (Gamma K): the gate operand dropped."""
    wy = the_stage(chunked, k3s.WYApplyOp, "W")
    wy.operands = wy.operands[:2]
    wy.properties.update(props(k3s.WYApplyOp, gate="none"))


def drop(op_type):
    """The stage removed while its result is still read (the IR verifier would refuse it: the
    proof must not say 'holds' of it either)."""
    def mutate(chunked):
        stage = the_stage(chunked, op_type)
        stage.detach()
        stage.erase(safe_erase=False)

    mutate.__name__ = f"drop_{op_type.name.split('.')[-1]}"
    return mutate


def output_after_advance(chunked):
    """The output read from the state the chunk leaves instead of the one it enters."""
    output = the_stage(chunked, k3s.ChunkOutputOp)
    advance = the_stage(chunked, k3s.StateAdvanceOp)
    advance.detach()
    output.parent_block().insert_op_before(advance, output)
    output.operands = (output.queries, advance.advanced, output.scores, output.values, output.destination, output.scale)


def right_factor_from_the_wrong_reference(chunked):
    """The keys' right factor rescaled to the block's start instead of its end."""
    right = the_stage(chunked, k3s.BlockRescaleOp, "kr")
    blocks = the_stage(chunked, k3s.BlockGatesOp)
    right.operands = (right.rows, right.cumulative_gate, blocks.gate_start)


def left_factor_inverted(chunked):
    """The queries' left factor decayed the wrong way (reference over row)."""
    left = the_stage(chunked, k3s.BlockRescaleOp, "ql")
    left.properties.update(props(k3s.BlockRescaleOp, decay="reference_over_row"))


def diagonal_factor_from_the_wrong_reference(chunked):
    """The keys' diagonal factor rescaled to the block's end instead of its start."""
    diagonal = the_stage(chunked, k3s.BlockRescaleOp, "kd")
    blocks = the_stage(chunked, k3s.BlockGatesOp)
    diagonal.operands = (diagonal.rows, diagonal.cumulative_gate, blocks.gate_end)


def patch_schedule(monkeypatch, mutate) -> list:
    """Make derive-chunkwise produce the real schedule with `mutate` applied to it."""
    original = derive_chunkwise.chunkwise_schedule
    mutated = []

    def wrong_schedule(*args, **kwargs):
        chunked = original(*args, **kwargs)
        mutate(chunked)
        mutated.append(chunked)
        return chunked

    monkeypatch.setattr(derive_chunkwise, "chunkwise_schedule", wrong_schedule)
    # derive-backward differentiates the same (wrong) forward, whenever it was imported
    monkeypatch.setattr(derive_backward, "chunkwise_schedule", wrong_schedule)
    return mutated


MUTATIONS = (
    [(key_gram_inclusive, kind) for kind in DELTA_KINDS]
    + [(query_gram_strict, kind) for kind in RECURRENCE_KINDS]
    + [(wy_key_ungated, kind) for kind in ("kda", "gated_deltanet")]
    + [(output_after_advance, kind) for kind in RECURRENCE_KINDS]
)
# wrong Gram factors show only with several row blocks per chunk
BLOCK_MUTATIONS = [(right_factor_from_the_wrong_reference, "kda"), (left_factor_inverted, "kda"),
                   (left_factor_inverted, "gla")]


@pytest.mark.parametrize("mutate, kind", BLOCK_MUTATIONS, ids=[f"{m.__name__}-{k}" for m, k in BLOCK_MUTATIONS])
def test_wrong_gram_factors_not_proved(monkeypatch, mutate, kind, fresh_seed):
    mutated = patch_schedule(monkeypatch, mutate)
    results = prove_chunkwise(spec_of(kind), 4, lengths=(7,), seed=fresh_seed, sub_chunk=2)
    assert mutated, "the proof did not go through derive_chunkwise.chunkwise_schedule"
    assert not any(r.holds for r in results), "a deliberately wrong Gram factor was proved"


@pytest.mark.parametrize("nats_per_token, fits", [(20, True), (46, False)])
def test_span_check_decides_by_the_largest_block_span(nats_per_token, fits, fresh_seed):
    """k3s.block_span_check's exact meaning: a block of two tokens whose one channel decays by
    10^-8 or 10^-20 a token (exact rationals: e^-18.4, e^-46) spans 37 or 92 nats, within or
    past the limit of 80; the other channels and blocks decay by little (at most 9x a token)."""
    import sympy

    rng = random.Random(fresh_seed)
    x = exact.random_inputs(rng, 4, 3, 2, "channel")
    x.a[2, 1] = x.a[3, 1] = sympy.Rational(1, 10) ** (nats_per_token * 10 // 23)  # 10^-(n/2.3): e^-n
    run = exact.ChunkRun(x)
    run.chunk = exact.Chunk(x, 0, 4)
    gamma = exact.SEMANTICS[k3s.GateCumsumOp](run, None, x.a)
    blocks = make(k3s.BlockGatesOp, sub_chunk=2, results=[("Gstart", k3s.tile("NB", "K")), ("Gend", k3s.tile("NB", "K"))])
    start, end = exact.SEMANTICS[k3s.BlockGatesOp](run, blocks, gamma)
    check = make(k3s.BlockSpanCheckOp, limit=80.0, result=("factorable", i1))
    assert exact.SEMANTICS[k3s.BlockSpanCheckOp](run, check, start, end) is fits
    for forced in (True, False):  # a proof takes each outcome in every chunk
        run.x = exact.replace(x, guards=forced)
        assert exact.SEMANTICS[k3s.BlockSpanCheckOp](run, check, start, end) is forced


@pytest.mark.parametrize("kind", ["kda", "gla"])
def test_wrong_diagonal_factor_fails_where_the_guard_takes_it(monkeypatch, kind, fresh_seed):
    """A guarded Gram's factored diagonal is proved on its own: a wrong diagonal factor fails
    every proof in which the span checks hold, and only those (the elementwise blocks never read
    it)."""
    mutated = patch_schedule(monkeypatch, diagonal_factor_from_the_wrong_reference)
    results = prove_chunkwise(spec_of(kind), 4, lengths=(3, 9), seed=fresh_seed, sub_chunk=2)
    assert mutated, "the proof did not go through derive_chunkwise.chunkwise_schedule"
    held = [r for r in results if "span checks hold" in r.schedule]
    failed = [r for r in results if "span checks fail" in r.schedule]
    assert len(held) == len(failed) == 2
    assert not any(r.holds for r in held), "a deliberately wrong diagonal factor was proved"
    assert all(r.holds for r in failed), [r.first_mismatch for r in failed]


@pytest.mark.parametrize("chunk_size", [1, 3])
@pytest.mark.parametrize("mutate, kind", MUTATIONS, ids=[f"{m.__name__}-{k}" for m, k in MUTATIONS])
def test_wrong_schedule_not_proved(monkeypatch, mutate, kind, chunk_size, fresh_seed):
    mutated = patch_schedule(monkeypatch, mutate)
    results = prove_chunkwise(spec_of(kind), chunk_size, seed=fresh_seed)
    assert mutated, "the proof did not go through derive_chunkwise.chunkwise_schedule"
    assert not all(r.holds for r in results), "a deliberately wrong schedule was proved"
    for r in results:
        assert r.holds or r.first_mismatch


DANGLING = [(drop(op_type), kind) for op_type in (k3s.ForwardSubstitutionOp, k3s.DeltaResidualOp)
            for kind in DELTA_KINDS]


@pytest.mark.parametrize("mutate, kind", DANGLING, ids=[f"{m.__name__}-{k}" for m, k in DANGLING])
def test_schedule_missing_a_stage_is_refused_before_any_proof(monkeypatch, mutate, kind, fresh_seed):
    """Without forward_substitution, wy_apply reads a T that nothing makes; without
    delta_residual, chunk_output reads a vr. As values, such a schedule is not well formed: the
    verifier after the pass refuses it, so it can never be proved (or printed)."""
    patch_schedule(monkeypatch, mutate)
    with pytest.raises(IRError, match="derive-chunkwise.*Erased SSA value"):
        prove_chunkwise(spec_of(kind), 3, seed=fresh_seed)


def test_cli_prove_of_a_schedule_missing_a_stage_is_an_error(capsys, monkeypatch, fresh_seed):
    patch_schedule(monkeypatch, drop(k3s.ForwardSubstitutionOp))
    code, out, err = run(capsys, "prove", EXAMPLES / "kda.toml", "--chunk-size", 3, "--draft-tokens", 1,
                         "--seed", fresh_seed)
    assert code == 2 and "Erased SSA value" in err and "Traceback" not in err


def test_cli_prove_wrong_schedule_exits_1(capsys, monkeypatch, fresh_seed):
    patch_schedule(monkeypatch, query_gram_strict)
    code, out, err = run(capsys, "prove", EXAMPLES / "gla.toml", "--chunk-size", 3, "--draft-tokens", 1,
                         "--seed", fresh_seed)
    assert code == 1, f"exit code {code}: {out}\n{err}"
    # the chunkwise, fused and backward proofs fail, each for both outcomes of the span checks;
    # the stores' chain rules hold (symbolic, of the loads alone), and so do the saving forward's
    # values (both prepares derive from the same wrong schedule, so they still agree)
    assert "FAILED" in out and "11 passed, 29 failed" in out


# --- the two oracles agree ------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_exact_token_recurrence_matches_reference(kind, layout, fresh_seed):
    """k3compile/checking/exact.py's rational token recurrence (decays as factors a = exp g) and ir/reference.py's
    float64 one (log-space gates), on the same inputs: two independent oracles agree."""
    K, V, T = 2, 3, 7
    op = next(iter(spec_to_module(spec_from_table(
        recurrence_table(kind, layout, H=1, K=K, V=V, name=f"{kind}_{layout}_oracle"))).ops))
    gate, delta_rule = GATE_OF_KIND[kind], DELTA_OF_KIND[kind]
    x = exact.random_inputs(random.Random(fresh_seed), T, K, V, gate)
    want_o, want_s = exact.token_recurrence(x, delta_rule)

    t = exact_as_torch(x, gate, delta_rule)
    initial = (t["S0"] if layout == "kv" else t["S0"].T).contiguous()[None, None]
    o, final = reference.recurrence(op, t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], scale=float(x.scale),
                                    initial_state=initial, output_final_state=True)
    final = final[0, 0] if layout == "kv" else final[0, 0].T
    for got, want, what in ((o[0, :, 0, :], as_tensor(want_o), "o"), (final, as_tensor(want_s), "final state")):
        assert got.shape == want.shape, what
        scale = max(want.abs().max().item(), 1.0)
        error = (got - want).abs().max().item()
        assert error <= 1e-9 * scale, f"{what}: max abs error {error:.3e} at magnitude {scale:.3e}"


# --- GLA's key blocks (k3compile.ops.gla.over_key_blocks) -----------------------------------------


@pytest.mark.parametrize("gate", ["channel", "none"])
def test_key_blocks_of_a_recurrence_without_the_delta_rule_sum_exactly(gate, fresh_seed):
    """Without the delta rule a recurrence of K keys is the sum of the outputs of the recurrences on
    its key blocks (same v and scale), its state their key rows stacked: k3compile.ops' chunk_gla /
    fused_recurrent_gla run K > 256 so. With the delta rule the same split is wrong."""
    from k3compile.ops.gla import key_blocks

    rng = random.Random(fresh_seed)
    x = exact.random_inputs(rng, length=5, K=5, V=2, gate=gate)
    blocks = key_blocks(5, most=2)  # three blocks of 2, 2 and 1 key channels
    assert [(b.start, b.stop) for b in blocks] == [(0, 2), (2, 4), (4, 5)]
    for delta_rule in (False, True):
        whole_o, whole_S = exact.token_recurrence(x, delta_rule)
        parts = [exact.token_recurrence(replace(x, q=x.q[:, b], k=x.k[:, b], a=x.a[:, b], S0=x.S0[b, :]), delta_rule)
                 for b in blocks]
        o = sum((part_o for part_o, _ in parts[1:]), parts[0][0])
        S = Matrix.vstack(*(part_S for _, part_S in parts))
        holds = (o - whole_o).is_zero_matrix and (S - whole_S).is_zero_matrix
        assert holds == (not delta_rule), f"delta_rule={delta_rule}: the split {'fails' if not holds else 'holds'}"
