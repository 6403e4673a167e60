"""`moe`'s dispatch table (lower-moe-experts{dispatch=...}, passes/moe_dispatch.py): each row
bucket runs its plan's kernels at its tiles, outputs against reference.latent_moe in float64 at
the token counts on both sides of every bound (interpreter, fp32, outputs poisoned); the default
table; bad tables refused with one-line messages."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_matches, layer_op
from k3compile.ir import reference
from k3compile.passes.moe_dispatch import H100_TABLE, Bucket, parse_table, spell_table
from test_moe import inputs_of

# every plan, warp in two buckets at different tiles, prefill between decode buckets and above
TABLE = "1=warp/8x16,2=split,3=prefill,5=warp/4x32"
# the plan each token count runs under TABLE, and a warp bucket's (BN, BD)
EXPECTED = {1: ("warp", (8, 16)), 2: ("split", None), 3: ("prefill", None), 4: ("warp", (4, 32)),
            5: ("warp", (4, 32)), 6: ("prefill", None)}
# the kernel that only each plan launches, after the layer's name
PLAN_KERNELS = {"decode_warp_token_gate_up_kernel": "warp", "decode_pair_gate_up_kernel": "split",
                "prefill_expert_gate_up_kernel": "prefill"}
LAYER = dict(kind="latent_moe", hidden_size=40, latent_dim=16, num_experts=12, top_k=3, expert_ffn_dim=32,
             num_shared_experts=1, shared_ffn_dim=24, activation="situ_glu", dtype="float32")


def compile_moe(compile_layer, options: str = "", name: str = "mlp"):
    pipeline = f"lower-moe-routing,lower-moe-experts{{{options}}}" if options else None
    return compile_layer(pipeline=pipeline, name=name, **LAYER)


class Launches:
    """Stands in for the module's expert kernels: records which plan's kernel each call launched
    and its BN, BD, then launches it."""

    def __init__(self, layer, monkeypatch) -> None:
        self.seen: list[tuple[str, tuple[int, int]]] = []
        for suffix, plan in PLAN_KERNELS.items():
            name = f"{layer.spec.name}_{suffix}"
            monkeypatch.setattr(layer.module, name, self.recording(getattr(layer.module, name), plan))

    def recording(self, kernel, plan: str):
        launches = self

        class Recorded:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launches.seen.append((plan, (kwargs.get("BN"), kwargs.get("BD"))))
                    return kernel[grid](*args, **kwargs)
                return launch
        return Recorded()


@pytest.fixture(scope="module")
def layer(compile_layer):
    return compile_moe(compile_layer, f'dispatch="{TABLE}"', name="mlp")


@pytest.mark.parametrize("R", sorted(EXPECTED))
def test_each_bucket_runs_its_plan(layer, R, monkeypatch):
    launches = Launches(layer, monkeypatch)
    torch.manual_seed(R)
    arguments = inputs_of(layer.spec.params, R)
    (out,) = layer.moe(**arguments)
    plan, tiles = EXPECTED[R]
    assert [seen_plan for seen_plan, _ in launches.seen] == [plan]
    if tiles is not None:
        assert launches.seen[0][1] == tiles
    ref = reference.latent_moe(layer_op(layer), **arguments)
    assert_matches(out, ref, f"moe out at R={R} ({plan})", rms_tol=1e-5, atol=1e-4, rtol=1e-4)


def test_table_is_in_the_ir(layer):
    """The table is the entry_by_rows op's (its buckets), written by the pass."""
    from k3compile.ir import k3s

    (choice,) = [op for op in layer.compilation.scheduled.walk() if isinstance(op, k3s.EntryByRowsOp)]
    assert choice.buckets() == [(1, "decode_warp"), (2, "decode"), (3, "prefill"), (5, "decode_warp"),
                                (None, "prefill")]


def test_default_table(compile_layer, monkeypatch):
    """Without the option: the H100 table (split at 1 token, warp up to 4, prefill above)."""
    assert parse_table(H100_TABLE) == [Bucket(1, "split"), Bucket(4, "warp"), Bucket(None, "prefill")]
    layer = compile_moe(compile_layer, name="mlp_default")
    launches = Launches(layer, monkeypatch)
    for R in (1, 2, 4, 5):
        layer.moe(**inputs_of(layer.spec.params, R))
    assert [plan for plan, _ in launches.seen] == ["split", "warp", "warp", "prefill"]


def test_spelling_round_trips():
    buckets = parse_table(TABLE)
    assert spell_table(buckets) == TABLE and parse_table(spell_table(buckets)) == buckets


@pytest.mark.parametrize("table, message", [
    ("4=fast", "bucket '4=fast': plan must be one of split, warp, prefill, got 'fast'"),
    ("0=split", "bucket '0=split': expected MAX=PLAN with MAX a positive row count"),
    ("split", "bucket 'split': expected MAX=PLAN with MAX a positive row count"),
    ("4=split,2=warp", "bucket '2=warp': row bounds must increase \\(after 4\\)"),
    ("4=split/4x32", "bucket '4=split/4x32': only warp takes tiles, as warp/BNxBD"),
    ("4=warp/4x", "bucket '4=warp/4x': only warp takes tiles, as warp/BNxBD"),
    ("4=warp/4x100", "bucket '4=warp/4x100': BD must be a power of two up to 1024, got 100"),
])
def test_bad_tables_are_refused(table, message):
    with pytest.raises(ValueError, match=f"^dispatch: {message}$"):
        parse_table(table)


def test_bad_table_refused_by_the_pass(compile_layer):
    with pytest.raises(Exception, match="lower-moe-experts: dispatch: bucket '4=fast': plan must be one of"):
        compile_moe(compile_layer, 'dispatch="4=fast"', name="mlp_bad")
