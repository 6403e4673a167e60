"""k3compile/checking/cost.py and ir/cost.py (`k3c cost`): each kernel's bytes and FLOPs against counts
written out here from the chunkwise schedule's math (docs/backward.md, docs/schedule-ir.md), not
from the code; every kernel of every recurrence entry has a rule; bad input is one line."""

from __future__ import annotations

import math

import pytest

from conftest import EXAMPLES, bad_input, run_cli
from k3compile.checking.cost import CEILINGS, entry_costs
from k3compile.driver import schedule_for_triton
from k3compile.spec import load_spec

C, K, V, H = 16, 128, 128, 32  # examples/kda.toml's chunk, head dims and heads


@pytest.fixture(scope="module")
def kda_module():
    return schedule_for_triton(load_spec(EXAMPLES / "kda.toml"), None, verify="off").scheduled


@pytest.mark.parametrize("batch,tokens", [(2, 100), (1, 4096), (3, 17)])
def test_chunk_prepare_counts_its_loads_spills_and_products(kda_module, batch, tokens):
    """A (chunk, head) program loads q, k, v, g [C, K] and beta [C], spills KG, QG, W [C, K],
    U [C, V], P [C, C] in the input dtype and gamma [K] in fp32; it forms the Grams A and P
    (C x C x K each), W and U (T applied: C x C x K and C x C x V) and T (a C x C triangular solve)."""
    chunks = batch * math.ceil(tokens / C)
    (prepare, _) = entry_costs(kda_module, "chunk", batch, tokens, "bfloat16")
    per_program_bytes = 2 * (4 * C * K + C) + 2 * (3 * C * K + C * V + C * C) + 4 * K
    per_program_flops = 2 * C * C * K * 3 + 2 * C * C * V + 2 * C**3 / 3
    assert prepare.programs == chunks * H
    assert prepare.total.bytes == pytest.approx(per_program_bytes * chunks * H)
    assert prepare.total.flops == pytest.approx(per_program_flops * chunks * H)


def test_chunk_scan_counts_a_state_pass_per_value_block(kda_module):
    """A (value block, sequence head) program reads the initial state block [K, bv] (fp32), then per
    chunk reloads KG, QG, W [C, K], U [C, bv], P [C, C] and gamma [K] (fp32), stores o [C, bv], and
    computes W S, QG S + P vr and KG^T vr; it stores the final state block."""
    batch, tokens = 2, 100
    (_, scan) = entry_costs(kda_module, "chunk", batch, tokens, "float32")
    kernel = next(op for op in kda_module.ops if op.name == "k3s.kernel" and op.sym_name.data == "kda_chunk_scan")
    block_v = next(op for op in kernel.walk() if op.name == "k3s.state_tile").block_v.value.data
    per_chunk_bytes = 4 * (3 * C * K + C * block_v + C * C) + 4 * K + 4 * C * block_v
    per_chunk_flops = 2 * C * K * block_v + 2 * C * block_v * (K + C) + 2 * K * C * block_v
    programs = (V // block_v) * batch * H
    chunks = math.ceil(tokens / C)
    assert scan.programs == programs
    assert scan.total.bytes == pytest.approx(programs * (chunks * per_chunk_bytes + 2 * 4 * K * block_v))
    assert scan.total.flops == pytest.approx(programs * chunks * per_chunk_flops)


def test_bytes_follow_the_input_dtype(kda_module):
    """Only the input-dtype tensors double from bf16 to fp32; the fp32 workspaces do not."""
    half = entry_costs(kda_module, "chunk", 1, 64, "bfloat16")[0].total
    full = entry_costs(kda_module, "chunk", 1, 64, "float32")[0].total
    fp32_part = 4 * K * 4 * H  # gamma_C of 4 chunks
    assert full.bytes - fp32_part == pytest.approx(2 * (half.bytes - fp32_part))
    assert full.flops == half.flops


@pytest.mark.parametrize("spec", ["kda", "gated_deltanet", "deltanet", "gla"])
def test_every_recurrence_entry_has_a_cost(capsys, spec):
    for entry in ("recurrent", "decode", "chunk", "chunk_backward", "chunk_segments", "chunk_backward_segments"):
        code, out, err = run_cli(capsys, "cost", EXAMPLES / f"{spec}.toml", "--shape", "2,33", "--entry", entry)
        assert code == 0, err
        assert f"entry {entry} on" in out and "| total |" in out


def test_the_backward_costs_more_than_the_forward_and_is_hbm_bound_at_training_shapes(kda_module):
    forward = entry_costs(kda_module, "chunk", 4, 4096)
    backward = entry_costs(kda_module, "chunk_backward", 4, 4096)
    assert sum(c.total.flops for c in backward) > 2 * sum(c.total.flops for c in forward)
    assert all(c.bound(CEILINGS["h200"]) == "HBM" for c in backward if c.total.bytes)


def test_measured_times_give_the_fraction_of_the_roof(capsys):
    code, out, err = run_cli(capsys, "cost", EXAMPLES / "kda.toml", "--shape", "4,4096", "--entry", "chunk",
                             "--measured", "kda_chunk_prepare=0.5", "--measured", "kda_chunk_scan=0.5")
    assert code == 0, err
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| kda_")}
    roof = float(rows["kda_chunk_prepare"][6])
    assert rows["kda_chunk_prepare"][8].strip() == "0.500"
    assert rows["kda_chunk_prepare"][9].strip() == f"{roof / 0.5:.0%}"


@pytest.mark.parametrize("argv,expected", [
    (["examples/attnres.toml", "--shape", "1,16"], "no entry 'chunk'"),
    (["examples/kda.toml", "--shape", "0,16"], "B and T must be positive"),
    (["examples/kda.toml", "--shape", "1,16", "--entry", "nope"], "no entry 'nope'"),
    (["examples/kda.toml", "--shape", "1,16", "--measured", "kda_chunk_scan"], "KERNEL=MS"),
    (["examples/kda.toml", "--shape", "1,16", "--measured", "kda_chunk_scan=-1"], "positive finite number"),
    (["examples/kda.toml", "--shape", "1,16", "--gpu", "a100"], "invalid choice"),
    (["examples/no_such.toml", "--shape", "1,16"], "no_such.toml"),
])
def test_bad_input_is_one_line(capsys, argv, expected):
    argv = [str(EXAMPLES.parent / a) if a.endswith(".toml") else a for a in argv]
    assert expected in bad_input(capsys, "cost", *argv)
