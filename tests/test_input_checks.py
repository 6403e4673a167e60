"""Inputs the public entry points must refuse with a one-line ValueError naming the problem,
where they once gave a silent wrong answer or a stray exception: a host copy cu_seqlens_cpu that
disagrees with cu_seqlens (k3compile.ops' chunk functions), zero-size heads (every
k3compile.ops recurrence function), malformed offsets given to split_checkpoints (which assigned
checkpoints to the wrong sequences). Each refusal comes before anything compiles.
"""

from __future__ import annotations

import pytest
import torch

from conftest import one_line
from k3compile import ops
from k3compile.runtime.serving import split_checkpoints

H, K, V = 2, 8, 8


pytestmark = pytest.mark.usefixtures("own_ops_cache")


def arguments(function: str, T: int = 9, B: int = 1, H: int = H, HV: int = H, K: int = K, V: int = V) -> dict:
    """Fresh random inputs of `function`'s layer (channel gates for KDA and GLA, a scalar gate
    for the gated delta rule), as keywords."""
    x = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, HV, V))
    if "gla" in function:
        x["gk" if function == "fused_recurrent_gla" else "g"] = -torch.rand(B, T, HV, K)
    elif "kda" in function:
        x["g"] = -torch.rand(B, T, HV, K)
    elif "gated" in function:
        x["g"] = -torch.rand(B, T, HV)
    if "gla" not in function:
        x["beta"] = torch.rand(B, T, HV)
    return x


CHUNK_FUNCTIONS = ("chunk_kda", "chunk_gated_delta_rule", "chunk_delta_rule", "chunk_gla")
FUNCTIONS = (*CHUNK_FUNCTIONS, "fused_recurrent_kda", "fused_recurrent_gated_delta_rule",
             "fused_recurrent_delta_rule", "fused_recurrent_gla")


def refusal(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert one_line(message), message
    return message


@pytest.mark.parametrize("function", CHUNK_FUNCTIONS)
def test_host_copy_of_other_offsets_is_refused(function):
    """A host copy with other values once gave another h (chunk_kda's intermediate states) of the
    same shape, and another chunk_indices check (the gated delta rule)."""
    offsets = torch.tensor([0, 4, 9])
    host_copy = torch.tensor([0, 5, 9])
    with torch.inference_mode():
        message = refusal(lambda: getattr(ops, function)(**arguments(function), cu_seqlens=offsets,
                                                         cu_seqlens_cpu=host_copy))
    assert message.startswith("cu_seqlens_cpu: ") and "cu_seqlens [0, 4, 9]" in message and "[0, 5, 9]" in message


def test_host_copy_with_intermediate_states_is_refused():
    """The issue's case: chunk_kda's h with return_intermediate_states."""
    with torch.inference_mode():
        message = refusal(lambda: ops.chunk_kda(**arguments("chunk_kda"), cu_seqlens=torch.tensor([0, 4, 9]),
                                                cu_seqlens_cpu=torch.tensor([0, 8, 9]), chunk_size=32,
                                                return_intermediate_states=True))
    assert message.startswith("cu_seqlens_cpu: ")


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("dims,tensor,dim", [(dict(K=0), "q", "K"), (dict(V=0), "v", "V"),
                                             (dict(H=0, HV=0), "q", "H"), (dict(HV=0), "v", "HV")],
                         ids=["K", "V", "H", "HV"])
def test_zero_size_heads_are_refused(function, dims, tensor, dim):
    """K = 0 once raised ZeroDivisionError (the default scale K ** -0.5); the others a SpecError
    naming a spec key the caller never wrote."""
    message = refusal(lambda: getattr(ops, function)(**arguments(function, **dims)))
    assert message.startswith(f"{tensor}: expected {dim} >= 1") and f"got {dim} = 0" in message


def test_split_checkpoints_refuses_non_monotonic_offsets():
    """[0, 6, 2, 8] once split 3 states as 1, -2 (nothing) and 3 per sequence: checkpoints of the
    third sequence handed to the first."""
    message = refusal(lambda: split_checkpoints(torch.randn(3, 2, 3, 3), 2, torch.tensor([0, 6, 2, 8])))
    assert message == "cu_seqlens: expected non-decreasing offsets from 0, got [0, 6, 2, 8]"


@pytest.mark.parametrize("offsets,names", [
    (torch.tensor([2, 6, 8]), "from 0, got [2, 6, 8]"),
    (torch.tensor([0, 4, 8], dtype=torch.int16), "int16 tensor of shape (3,)"),
    (torch.tensor([0.0, 4.0, 8.0]), "float32 tensor"),
    (torch.tensor([False, True]), "bool tensor"),
    (torch.tensor([[0, 4, 8]]), "shape (1, 3)"),
    (torch.tensor([0]), "shape (1,)"),
    ([0, 4, 8], "got list"),
], ids=["not_from_0", "int16", "float", "bool", "2d", "no_sequence", "list"])
def test_split_checkpoints_refuses_malformed_offsets(offsets, names):
    message = refusal(lambda: split_checkpoints(torch.randn(4, 2, 3, 3), 2, offsets))
    assert message.startswith("cu_seqlens: expected ") and names in message
