"""The pipeline planner (k3compile.runtime.pipeline_plan) and `k3c plan-pipeline`: balanced cuts against
brute force over every partition, the send rule against a walk of the stages that tracks what
each rank holds, K3's 93 layers in blocks of 12, and the refusals (one line, exit 2)."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch

from conftest import EXAMPLES, bad_input, one_line, run_cli
from k3compile.errors import ArgumentError
from k3compile.runtime.pipeline_plan import cut_points, plan_pipeline
from k3compile.runtime.stack_spec import model_spec_from_table

K3 = dict(hidden_size=7168, num_layers=93, block_size=12, layer_pattern="kda,kda,kda,attn", kda_heads=64,
          kda_head_dim=128, attn_heads=64, attn_head_dim=128, ffn_hidden_size=18432)


def spec(**overrides):
    return model_spec_from_table({**K3, **overrides})


@pytest.mark.parametrize("layers, stages, block", [(7, 3, 2), (9, 4, 3), (10, 2, 4), (6, 6, 2), (9, 3, 1)])
def test_cuts_minimise_the_largest_stage_then_cuts_inside_blocks(layers, stages, block):
    costs = [random.choice([0.5, 1.0, 1.5, 2.0]) for _ in range(layers)]  # ties: the block rule decides
    extra = random.choice([0.0, 0.5]), random.choice([0.0, 1.0])

    def largest(cuts):
        loads = [sum(costs[a:b]) for a, b in zip(cuts, cuts[1:])]
        loads[0] += extra[0]
        loads[-1] += extra[1]
        return max(loads)

    def inside(cuts):
        return sum(c % block != 0 for c in cuts[1:-1])

    every = [[0, *inner, layers] for inner in itertools.combinations(range(1, layers), stages - 1)]
    best = min(largest(cuts) for cuts in every)
    fewest = min(inside(cuts) for cuts in every if largest(cuts) <= best + 1e-9)
    cuts = cut_points(costs, stages, *extra, block_size=block)
    assert cuts[0] == 0 and cuts[-1] == layers and all(a < b for a, b in zip(cuts, cuts[1:]))
    assert abs(largest(cuts) - best) <= 1e-9 and inside(cuts) == fewest
    assert abs(largest(cut_points(costs, stages, *extra)) - best) <= 1e-9


def walk(model, ranks: int, cuts: list[int]) -> list[tuple[tuple, tuple, bool]]:
    """The send rule by simulation: per boundary (cached, sent, partial sum) from the set of
    representatives each rank has seen (received or made), stage by stage."""
    held: dict[int, set] = {r: set() for r in range(ranks)}
    out = []
    for s in range(len(cuts) - 1):
        done = set(range(1 + cuts[s + 1] // model.block_size))  # b_0 and the blocks ended by the cut
        held[s % ranks] |= done
        if s + 2 < len(cuts):
            there = held[(s + 1) % ranks]
            out.append((tuple(sorted(done & there)), tuple(sorted(done - there)), cuts[s + 1] % model.block_size != 0))
    return out


@pytest.mark.parametrize("ranks, v", [(2, 1), (4, 1), (4, 2), (4, 4), (8, 2), (16, 4), (3, 3)])
def test_sends_are_what_the_receiving_rank_lacks(ranks, v):
    model = spec()
    costs = {"kda": random.uniform(0.5, 2), "attn": random.uniform(0.5, 2)}
    plan = plan_pipeline(model, ranks, v, costs=costs, first_extra=0.3, last_extra=0.8)
    cuts = [stage.start for stage in plan.stages] + [93]
    assert [(b.cached, b.sent, b.partial) for b in plan.boundaries] == walk(model, ranks, cuts)
    assert [stage.rank for stage in plan.stages] == [s % ranks for s in range(ranks * v)]
    sent = sum(b.tensors for b in plan.boundaries)
    resend = sum(b.resend_all_tensors for b in plan.boundaries)
    assert sent < resend if v > 1 else sent == resend
    for r in range(ranks):  # a rank receives each representative at most once
        received = [rep for b in plan.boundaries if b.target_rank == r for rep in b.sent]
        assert len(received) == len(set(received))


def test_k3_plan_and_its_table():
    plan = plan_pipeline(spec(), 4, 2, costs={"kda": 1.0, "attn": 1.0})
    # 93 / 8 stages: 12 layers at most, reached with every cut at a block's end (no partial sum sent)
    assert max(s.cost for s in plan.stages) == 12 and not any(b.partial for b in plan.boundaries)
    text = plan.table(tokens=8192)
    assert "112.00 MiB a tensor" in text  # 8192 x 7168 bf16
    assert text.count("\n| ") == 9  # the header and 8 stages


def test_plain_residuals_send_the_stream_only():
    plan = plan_pipeline(spec(attnres="none"), 4, 2)
    assert all(b.sent == () and b.cached == () and b.partial for b in plan.boundaries)


@pytest.mark.parametrize("call, words", [
    (dict(ranks=1), "ranks: expected at least 2"),
    (dict(ranks=2, stages_per_rank=0), "stages_per_rank: expected a positive integer"),
    (dict(ranks=64, stages_per_rank=2), "128 stages for 93 layers"),
    (dict(ranks=2, costs={"kda": 1.0}), "costs: no cost for mixer 'attn'"),
    (dict(ranks=2, costs={"kda": 1.0, "attn": -1.0}), "costs: expected positive finite numbers"),
    (dict(ranks=2, costs=[1.0] * 92), "costs: expected one cost a layer (93), got 92"),
    (dict(ranks=2, cuts=[0, 50, 50, 93]), "cuts: expected 3 increasing layer indices from 0 to 93"),
])
def test_plan_refusals(call, words):
    with pytest.raises(ArgumentError) as err:
        plan_pipeline(spec(), **call)
    assert words in str(err.value) and one_line(str(err.value))


def test_cli_prints_the_plan(capsys):
    code, out, err = run_cli(capsys, "plan-pipeline", EXAMPLES / "models" / "k3_stack.toml", "--ranks", "4",
                             "--stages-per-rank", "2", "--cost", "kda=1", "--cost", "attn=1.5", "--tokens", "64")
    assert code == 0 and err == ""
    assert "4 ranks x 2 stages" in out and "| 7 | 3 |" in out and "resending every block" in out


@pytest.mark.parametrize("argv, words", [
    (("--ranks", "1"), "ranks: expected at least 2"),
    (("--ranks", "8", "--stages-per-rank", "2"), "16 stages for 8 layers"),
    (("--ranks", "2", "--cost", "kda=x"), "expected KIND=COST"),
    (("--ranks", "2", "--cost", "moe=1"), "'moe' is not a mixer of the pattern"),
    (("--ranks", "2", "--tokens", "0"), "--tokens: expected a positive integer"),
])
def test_cli_errors(capsys, argv, words):
    assert words in bad_input(capsys, "plan-pipeline", EXAMPLES / "models" / "k3_stack.toml", *argv)


def test_cli_reads_measured_layer_costs(capsys, tmp_path):
    """k3compile.runtime.stack_pipeline.measure_layer_costs on a small stack, written as JSON, cuts the plan."""
    from k3compile.runtime.stack import build_stack
    from k3compile.runtime.stack_pipeline import measure_layer_costs

    table = dict(hidden_size=16, num_layers=5, block_size=2, layer_pattern="attn", attn_heads=2, attn_head_dim=8,
                 ffn_hidden_size=24, attnres="torch", dtype="float32")
    path = tmp_path / "m.toml"
    path.write_text("[model]\n" + "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in table.items()))
    costs = measure_layer_costs(build_stack(model_spec_from_table(table)), torch.randn(1, 6, 16), repeats=1)
    assert len(costs) == 5 and all(c > 0 for c in costs)
    (tmp_path / "costs.json").write_text(json.dumps([1, 1, 1, 1, 8]))  # the last layer alone in its stage
    code, out, err = run_cli(capsys, "plan-pipeline", path, "--ranks", "2", "--layer-costs", tmp_path / "costs.json")
    assert code == 0 and "| 0 | 0 | 0-3 | 4 |" in out and "| 1 | 1 | 4-4 | 8 |" in out
    (tmp_path / "bad.json").write_text("{}")
    assert "expected a JSON list" in bad_input(capsys, "plan-pipeline", path, "--ranks", "2", "--layer-costs",
                                               tmp_path / "bad.json")
    assert "not allowed with" in bad_input(capsys, "plan-pipeline", path, "--ranks", "2", "--layer-costs",
                                           tmp_path / "costs.json", "--cost", "attn=1")


def test_cli_refuses_a_layer_spec(capsys):
    assert "a model spec holds one [model] table" in bad_input(capsys, "plan-pipeline", EXAMPLES / "kda.toml",
                                                               "--ranks", "2")
