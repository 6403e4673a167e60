"""The compiled modules' host runtime (backends/triton/runtime/) as the real modules it is:
imported and called directly, and emitted verbatim into every compiled module."""

from __future__ import annotations

import pytest
import torch

from conftest import recurrence_table
from k3compile.backends.triton.runtime import checks, emitted
from k3compile.backends.triton.runtime.context_parallel import _ContextParallel
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import spec_from_table


def test_compiled_modules_carry_the_runtime_verbatim(compile_layer):
    layer = compile_layer(**recurrence_table("kda", name="runtime_kda"))
    source = layer.path.read_text()
    for module in ("checks", "context_parallel"):
        lines = emitted(module)
        assert len(lines) > 50 and "\n".join(lines) in source, module
    assert "from k3compile" not in source and "import k3compile" not in source  # torch and triton only


@pytest.mark.parametrize("slots,problem", [([0, 5, -1], None), ([0, 6], "outside the pool"),
                                           ([0, -2], "outside the pool"), ([3, 1, 3], "slot 3 is in rows 0 and 2")])
def test_check_slots(slots, problem):
    indices = torch.tensor(slots)
    if problem is None:
        checks._check_slots("state_indices", indices, 6, True)
    else:
        with pytest.raises(ValueError, match=problem):
            checks._check_slots("state_indices", indices, 6, True)
        checks._check_slots("state_indices", indices, 6, False)  # the opt-out reads nothing


def test_check_tensor_binds_symbols_and_names_the_tensor():
    dims = {}
    checks._check_tensor("q", torch.zeros(2, 5, 3, 4), "B,T,3,4", "float", dims, None)
    assert dims == {"B": 2, "T": 5}
    with pytest.raises(ValueError, match=r"^k: dim 1 of shape \[B,T,3,4\] must be T = 5"):
        checks._check_tensor("k", torch.zeros(2, 6, 3, 4), "B,T,3,4", "float", dims, None)
    with pytest.raises(ValueError, match=r"^beta: expected dtype"):
        checks._check_tensor("beta", torch.zeros(2, 5, 3, dtype=torch.int32), "B,T,3", "float", dims, None)


@pytest.mark.parametrize("value", ["abc", float("nan"), float("inf"), True, torch.ones(2)])
def test_scalar_names_the_argument(value):
    with pytest.raises(ValueError, match="^scale: expected a finite number"):
        checks._scalar("scale", value, 1.0)


def test_chunk_table_lists_every_chunk_of_every_sequence():
    offsets = torch.tensor([0, 5, 5, 21, 22])
    count, table = checks._chunks(offsets, {"B": 1, "T": 22}, 8, "cpu")
    want = [(n, start) for n, (a, b) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:]))
            for start in range(a, b, 8)]
    assert count == len(want) and table.tolist() == [list(row) for row in want]


@pytest.mark.parametrize("kind,layout", [("kda", "kv"), ("kda", "vk"), ("gla", "kv"), ("gated_deltanet", "vk"),
                                         ("deltanet", "kv")])
def test_context_parallel_combine_is_the_reference_one(kind, layout):
    """apply / compose against ir/reference.py's summaries, in every transition form."""
    op = next(iter(spec_to_module(spec_from_table(recurrence_table(kind, layout, H=1, K=3, V=4))).ops))
    form = {"kda": "full", "deltanet": "full", "gated_deltanet": "full", "gla": "diagonal"}[kind]
    K, V = 3, 4
    state_shape = (1, K, V) if layout == "kv" else (1, V, K)
    runtime = _ContextParallel(None, None, form, layout == "vk", state_shape, 16, 1, None)
    M_shape = {"full": (1, K, K), "diagonal": (1, K)}[form]
    draw = lambda *shape: torch.randn(*shape, dtype=torch.float64)  # noqa: E731
    later, earlier, S = (draw(*M_shape), draw(*state_shape)), (draw(*M_shape), draw(*state_shape)), draw(*state_shape)
    torch.testing.assert_close(runtime.apply(*later, S), reference.apply_summary(op, later, S))
    got, want = runtime.compose(later, earlier), reference.combine_summaries(op, later, earlier)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
