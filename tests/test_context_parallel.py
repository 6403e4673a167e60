"""Context parallelism at run time (docs/context-parallel.md): `chunk(..., segments=P)` on one
device and `chunk(..., cp_group=group)` over the ranks of a real torch.distributed gloo group
(2 and 3 processes on the CPU: the cases here, run by tests/test_context_parallel_backward.py in
the groups of its backward cases), against the float64 recurrence of the unsplit input and the
plain single-process chunk entry. Kernels run in Triton's interpreter with NaN-poisoned outputs;
every call draws fresh random inputs (K3C_TEST_SEED replays one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from conftest import (REPO, RecurrenceShape, assert_rms, layer_op, one_line, recurrence_inputs, recurrence_table,
                      run_worker_ranks)
from k3compile.ir import reference

C = 16
PIPELINE = (f"lower-recurrent,derive-chunkwise{{chunk-size={C}}},fuse-chunkwise{{block-v=16}},"
            f"derive-segment-scan{{chunk-size={C}}},lower-segment-scan{{block-v=16}}")
H, HV, K, V = 1, 2, 16, 16  # grouped value heads: two per query/key head
RMS_TOL = 1e-4  # fp32 kernels against the float64 recurrence (as tests/test_chunk.py)
WORKER = REPO / "tests" / "cp_worker.py"


def cp_layer(compile_layer, kind: str, layout: str = "kv"):
    layer = compile_layer(pipeline=PIPELINE, **recurrence_table(kind, layout, H=H, HV=HV, K=K, V=V))
    layer.module.POISON_OUTPUTS = True
    return layer


def gentle(inputs: dict) -> dict:
    """Decays near 1 (log-decays / 20): a segment's M and its entering state still matter at
    its end, so a wrong combine shows (with the conftest decays, exp(-0.8) a token on average,
    a 16-token segment forgets its entering state to ~1e-6)."""
    if "g" in inputs:
        inputs["g"] = inputs["g"] / 20
    return inputs


def inputs_of(kind: str, layout: str, shape: RecurrenceShape, initial_state: bool = True) -> dict:
    return gentle(recurrence_inputs(kind, layout, shape, initial_state=initial_state))


def varlen(kind: str, layout: str, seqlens, initial_state: bool = True) -> dict:
    return inputs_of(kind, layout, RecurrenceShape(1, sum(seqlens), H, HV, K, V, seqlens=tuple(seqlens)),
                     initial_state=initial_state)


def check_against_recurrence(layer, inputs, out, what: str) -> None:
    o, final = out[0], out[1]
    ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    assert_rms(o, ref_o, f"{what}: o", RMS_TOL)
    assert_rms(final, ref_final, f"{what}: final_state", RMS_TOL)


# --- segments on one device -------------------------------------------------------------------


def test_split_cuts_at_chunks_where_it_can():
    from k3compile.backends.triton.runtime.context_parallel import _ContextParallel

    split = _ContextParallel.split
    assert split(0, 100, 3, 16, False) == [0, 32, 64, 100]  # 7 chunks: 2 + 2 + 3 (the last partial)
    assert split(10, 40, 3, 16, False) == [10, 20, 30, 40]  # 2 chunks < 3 segments: single tokens
    assert split(5, 7, 5, 16, False) == [5, 6, 7]  # at most a token per segment
    assert split(4, 4, 3, 16, False) == [4, 4]  # an empty sequence: one empty segment
    assert split(0, 40, 3, 32, True) == [0, 32, 40]  # checkpoints: whole units only
    assert split(0, 100, 1, 16, False) == [0, 100]


@pytest.mark.parametrize("segments", [1, 2, 3, 5])
def test_segments_match_the_recurrence(compile_layer, segments):
    """KDA, varlen: two chunks and a partial one, a 3-token sequence (P = 5: one token per
    segment), an empty one, one of 30 tokens (2 chunks: P >= 3 cuts it at single tokens, into
    segments shorter than a chunk); initial and final states."""
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (2 * C + 5, 3, 0, 30))
    out = layer.chunk(**inputs, output_final_state=True, segments=segments)
    check_against_recurrence(layer, inputs, out, f"P = {segments}")
    plain = layer.module._chunk_single(**inputs, output_final_state=True)
    assert torch.equal(out[1][2], inputs["initial_state"][2]), "the empty sequence keeps its initial state"
    if segments == 1:  # exactly the plain entry, bit for bit
        assert all(torch.equal(a, b) for a, b in zip(out, plain))
    else:
        assert_rms(out[0], plain[0], "o against the plain entry", 1e-5)
        assert_rms(out[1], plain[1], "final_state against the plain entry", 1e-5)


@pytest.mark.parametrize("kind, layout", [("gated_deltanet", "vk"), ("deltanet", "kv"), ("gla", "vk")])
def test_segments_every_member(compile_layer, kind, layout):
    """The other transition forms' combine (full with a scalar gate and without a gate,
    diagonal) in both state layouts, P = 3, no initial state."""
    layer = cp_layer(compile_layer, kind, layout)
    inputs = varlen(kind, layout, (2 * C + 3, 9), initial_state=False)
    out = layer.chunk(**inputs, output_final_state=True, segments=3)
    check_against_recurrence(layer, inputs, out, f"{kind} P = 3")


def test_segments_batch_rows_and_checkpoints(compile_layer):
    """B = 2 rows (no cu_seqlens) split in two, checkpoints every chunk: the segments are cut at
    checkpoint multiples and the checkpoints come back in the plain entry's [N, T // every, ...]."""
    layer = cp_layer(compile_layer, "kda", "vk")
    inputs = inputs_of("kda", "vk", RecurrenceShape(2, 3 * C + 5, H, HV, K, V))
    o, final, kept = layer.chunk(**inputs, output_final_state=True, checkpoint_every=C, segments=2)
    ref_o, ref_final, ref_kept = reference.recurrence(layer_op(layer), **inputs, output_final_state=True,
                                                      checkpoint_every=C)
    assert kept.shape == (2, 3, HV, V, K)
    assert_rms(o, ref_o, "o", RMS_TOL)
    assert_rms(final, ref_final, "final_state", RMS_TOL)
    assert_rms(kept, ref_kept.reshape(kept.shape), "checkpoints", RMS_TOL)


def test_segments_varlen_checkpoints(compile_layer):
    layer = cp_layer(compile_layer, "gla", "kv")
    inputs = varlen("gla", "kv", (C + 3, 4 * C, 2 * C))
    o, final, kept = layer.chunk(**inputs, output_final_state=True, checkpoint_every=C, segments=3)
    ref_o, ref_final, ref_kept = reference.recurrence(layer_op(layer), **inputs, output_final_state=True,
                                                      checkpoint_every=C)
    assert kept.shape == (1 + 4 + 2, HV, K, V)
    assert_rms(o, ref_o, "o", RMS_TOL)
    assert_rms(kept, ref_kept, "checkpoints", RMS_TOL)


def test_a_wrong_combine_fails(compile_layer, monkeypatch):
    """The comparisons catch a broken runtime: M applied transposed, M dropped, and entering
    states left at the sequence's initial state each change the result."""
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (2 * C + 1,))
    cp = layer.module._CHUNK_CP
    right = cp.apply
    wrongs = {
        "M transposed": lambda M, N, S: right(M.transpose(-1, -2), N, S),
        "M dropped": lambda M, N, S: S + N,
        "no combine": lambda M, N, S: S,
    }
    for what, wrong in wrongs.items():
        monkeypatch.setattr(cp, "apply", wrong)
        out = layer.chunk(**inputs, output_final_state=True, segments=2)
        with pytest.raises(AssertionError, match="RMS ratio"):
            check_against_recurrence(layer, inputs, out, what)


def forbid_kernels(monkeypatch, module, suffix: str) -> None:
    """Make every kernel of `module` whose name ends in `suffix` fail when launched."""
    class Forbidden:
        def __getitem__(self, grid):
            raise AssertionError(f"a *{suffix} kernel was launched")

    for name in [n for n in dir(module) if n.endswith(suffix)]:
        monkeypatch.setattr(module, name, Forbidden())


def test_segments_one_never_summarises(compile_layer, monkeypatch):
    """P = 1 is the plain entry; a sequence of one token is never cut (so none needs a summary)."""
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (1, 1, 1))
    forbid_kernels(monkeypatch, layer.module, "_summary_scan_N_kernel")
    for segments in (1, 2):
        o, final = layer.chunk(**inputs, output_final_state=True, segments=segments)
        check_against_recurrence(layer, inputs, (o, final), f"P = {segments}")


def test_segments_prepare_once(compile_layer, monkeypatch):
    """One device: the summaries come from chunk_segments' one prepare, never from a second
    (segment_summary's: the prepare code they share, with its query stages off)."""
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (2 * C + 3, 7))
    name = next(n for n in dir(layer.module) if n.endswith("_chunk_prepare_kernel"))
    prepare, flags = getattr(layer.module, name), []

    class Recorded:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                flags.append(kwargs["SPILL_P_QG"])
                return prepare[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(layer.module, name, Recorded())
    check_against_recurrence(layer, inputs, layer.chunk(**inputs, output_final_state=True, segments=3), "P = 3")
    assert flags == [True]


def test_auto_segments(compile_layer, monkeypatch):
    """segments='auto' is the plain entry, bit for bit, where the GPU is full (here: one
    multiprocessor), and splits, matching the recurrence, where programs are wanted."""
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (3 * C + 2, 2 * C))
    cp = layer.module._CHUNK_CP
    o_auto, s_auto = layer.chunk(**inputs, output_final_state=True, segments="auto")
    o_plain, s_plain = layer.chunk(**inputs, output_final_state=True)
    assert torch.equal(o_auto, o_plain) and torch.equal(s_auto, s_plain)
    assert cp.auto_segments([3 * C + 2, 2 * C], torch.device("cpu")) == 1
    monkeypatch.setattr(cp, "PROGRAMS_PER_SM", 64)
    monkeypatch.setattr(cp, "MIN_SEGMENT_TOKENS", C)
    # min(64 programs // (2 sequences * 2 value heads), the longest holds 3 segments of C tokens)
    assert cp.auto_segments([3 * C + 2, 2 * C], torch.device("cpu")) == 3
    check_against_recurrence(layer, inputs, layer.chunk(**inputs, output_final_state=True, segments="auto"), "auto")


def test_chunk_segments_checks_its_combine(compile_layer):
    """chunk_segments rejects a combine that is not callable (before any kernel) and entering
    states of the wrong shape, naming them."""
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (C + 1, 5), initial_state=False)
    with pytest.raises(ValueError, match="entering_states: expected a callable") as error:
        layer.chunk_segments(**inputs, entering_states=None)
    assert one_line(str(error.value))
    with pytest.raises(ValueError, match="initial_state: expected dtype") as error:
        layer.chunk_segments(**inputs, entering_states=lambda M, N: N.double())
    assert one_line(str(error.value))
    with pytest.raises(ValueError, match="initial_state: dim 0") as error:
        layer.chunk_segments(**inputs, entering_states=lambda M, N: N[:1].contiguous())
    assert one_line(str(error.value))


@pytest.mark.parametrize("arguments, match", [
    (dict(segments=0), "segments: expected a positive int"),
    (dict(segments=-2), "segments: expected a positive int"),
    (dict(segments=True), "segments: expected a positive int"),
    (dict(segments=2.0), "segments: expected a positive int"),
    (dict(segments=2, initial_state="bad"), "initial_state: expected \\[2,2,16,16\\]"),
    (dict(segments=2, cu_seqlens=torch.tensor([0, 3])), "cu_seqlens: must start at 0 and end at T"),
    (dict(segments=2, checkpoint_every=C + 1), "checkpoint_every: expected a positive multiple"),
    (dict(segments=2, cp_group=object()), "cp_group: torch.distributed is not initialized"),
])
def test_bad_arguments_one_line(compile_layer, arguments, match):
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (C + 1, 5), initial_state=False)
    with pytest.raises(ValueError, match=match) as error:
        layer.chunk(**{**inputs, **arguments})
    assert one_line(str(error.value))


def test_bad_initial_state_count(compile_layer):
    layer = cp_layer(compile_layer, "kda")
    inputs = varlen("kda", "kv", (C + 1, 5))
    with pytest.raises(ValueError, match="initial_state: expected 2 states \\(one per sequence\\), got 1"):
        layer.chunk(**{**inputs, "initial_state": inputs["initial_state"][:1]}, segments=3)
    with pytest.raises(ValueError, match="beta: dim 2"):
        layer.chunk(**{**inputs, "beta": inputs["beta"][..., :1].contiguous()}, segments=3)


# --- ranks of a gloo group (real torch.distributed, one process per rank) ------------------------


def rank_inputs(inputs: dict, world: int, sequences_given: bool = True) -> list[dict]:
    """Every rank's arguments: its T tokens of the packed stream, the global cu_seqlens, the
    initial states of the sequences that start on it."""
    total = inputs["q"].shape[1]
    T = total // world
    offsets = inputs["cu_seqlens"].tolist() if "cu_seqlens" in inputs else [0, total]
    per_rank = []
    for r in range(world):
        mine = {name: x[:, r * T:(r + 1) * T].contiguous() for name, x in inputs.items()
                if name in ("q", "k", "v", "g", "beta")}
        if "cu_seqlens" in inputs and sequences_given:
            mine["cu_seqlens"] = inputs["cu_seqlens"]
        if "initial_state" in inputs:
            starting = [n for n, s in enumerate(offsets[:-1]) if min(s // T, world - 1) == r]
            mine["initial_state"] = inputs["initial_state"][starting].contiguous()
        per_rank.append(mine)
    return per_rank


def ending_on(inputs: dict, world: int, rank: int) -> list[int]:
    total = inputs["q"].shape[1]
    T = total // world
    offsets = inputs["cu_seqlens"].tolist() if "cu_seqlens" in inputs else [0, total]
    owner = [min(s // T, world - 1) if s == e else (e - 1) // T for s, e in zip(offsets, offsets[1:])]
    return [n for n, r in enumerate(owner) if r == rank]


def run_ranks(world: int, cases: list[dict], workdir: Path, timeout: float = 300) -> list[list]:
    """Run tests/cp_worker.py in `world` processes (a gloo group) over `cases`; per rank, per
    case: the returned tensors or a ValueError's message."""
    torch.save(cases, workdir / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1", "K3C_POISON_OUTPUTS": "1", "OMP_NUM_THREADS": "1"}
    return run_worker_ranks(WORKER, world, workdir, env, timeout)


def expect(layer, inputs: dict, world: int, options: dict) -> dict:
    """A case of run_ranks and its expected results: the plain chunk entry on the unsplit input
    (one process) and the float64 recurrence."""
    plain = layer.module._chunk_single(**inputs, output_final_state=True)
    ref = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    return dict(case=dict(module=str(layer.path), inputs=rank_inputs(inputs, world), options=options),
                inputs=inputs, plain=plain, ref=ref)


def check_ranks(world: int, expected: list[dict], results: list[list]) -> None:
    for i, e in enumerate(expected):
        T = e["inputs"]["q"].shape[1] // world
        for r in range(world):
            out = results[r][i]
            assert not isinstance(out, str), f"case {i}, rank {r}: {out}"
            o, final = out
            ends = ending_on(e["inputs"], world, r)
            what = f"case {i} ({e['case']['options']}), rank {r}"
            for name, (want_o, want_final), tol in (("plain chunk", e["plain"], 1e-5), ("recurrence", e["ref"], RMS_TOL)):
                assert_rms(o, want_o[:, r * T:(r + 1) * T], f"{what}: o against the {name}", tol)
                if ends:
                    assert_rms(final, want_final[ends], f"{what}: final_state against the {name}", tol)
            assert final.shape[0] == len(ends), f"{what}: {final.shape[0]} final states, {len(ends)} sequences end here"


# The gloo runs themselves are in tests/test_context_parallel_backward.py: one group of 2 and one
# of 3 processes each run these forward cases and the backward's (a rank's process spends seconds
# importing torch and triton; one spawn, not two).


def two_ranks_forward(compile_layer) -> tuple[list, list, Callable]:
    """2 gloo ranks of 24 tokens. KDA: a 5-token sequence, a 30-token one across the boundary,
    an empty one, 13 tokens to the end; initial and final states. Gated DeltaNet (vk): one
    sequence over both ranks (no cu_seqlens), its initial state on rank 0, each rank's piece in
    2 segments. Then two bad calls: ranks with different T (every rank raises, none hangs) and a
    bad initial_state on rank 1 only (rank 1 names it, rank 0 names rank 1). Returns (the good
    cases, the bad ones, check(results of the good, results of the bad)), results per rank."""
    world = 2
    kda, gdn = cp_layer(compile_layer, "kda"), cp_layer(compile_layer, "gated_deltanet", "vk")
    expected = [
        expect(kda, varlen("kda", "kv", (5, 30, 0, 13)), world, dict(output_final_state=True)),
        expect(gdn, inputs_of("gated_deltanet", "vk", RecurrenceShape(1, 48, H, HV, K, V)), world,
               dict(output_final_state=True, segments=2)),
    ]
    uneven = [{n: x[:, : 20 + 4 * r].contiguous() for n, x in case.items() if n != "initial_state"}
              for r, case in enumerate(expected[1]["case"]["inputs"])]
    bad_state = [dict(case) for case in expected[0]["case"]["inputs"]]
    bad_state[1]["initial_state"] = bad_state[1]["initial_state"][:1].contiguous()
    bad = [dict(module=str(gdn.path), inputs=uneven, options={}), dict(module=str(kda.path), inputs=bad_state, options={})]

    def check(good_results: list[list], bad_results: list[list]) -> None:
        check_ranks(world, expected, good_results)
        assert all("cp_group: the ranks disagree on T" in bad_results[r][0] for r in range(world)), bad_results
        assert "initial_state: expected 2 states (one per sequence starting on this rank), got 1" in bad_results[1][1]
        assert "cp_group: rank 1 rejected its arguments" in bad_results[0][1]

    return [e["case"] for e in expected], bad, check


def three_ranks_forward(compile_layer) -> tuple[list, Callable]:
    """3 gloo ranks of 20 tokens. KDA: a sequence over all three ranks (the middle rank lies
    inside it), initial and final states. GLA (diagonal M, vk): a sequence that starts exactly
    on rank 1's first token and continues into rank 2, 2 segments per rank. Returns (the cases,
    check(their results per rank))."""
    world = 3
    kda, gla = cp_layer(compile_layer, "kda"), cp_layer(compile_layer, "gla", "vk")
    expected = [
        expect(kda, varlen("kda", "kv", (7, 45, 8)), world, dict(output_final_state=True)),
        expect(gla, varlen("gla", "vk", (20, 25, 15)), world, dict(output_final_state=True, segments=2)),
    ]
    return [e["case"] for e in expected], lambda results: check_ranks(world, expected, results)


@pytest.mark.slow
def test_torchrun_example(tmp_path):
    """examples/cp_torchrun.py under torchrun on the CPU (gloo, 2 processes, on-device segments
    inside each rank): every rank's slice and final states equal the single-device call."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    env.pop("TRITON_INTERPRET", None)  # the example sets it for --device cpu
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           str(REPO / "examples" / "cp_torchrun.py"), "--device", "cpu", "--segments", "2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "RMS vs one device" in line]
    assert len(lines) == 2, done.stdout
    for line in lines:
        errors = [float(x.split()[-1].rstrip(",")) for x in line.split("RMS vs one device: ")[1].split(", final")]
        assert all(e < 1e-5 for e in errors), line
