"""What tests/test_ops.py and test_ops_arguments.py share: the oracle's ops (spec tables written out
per case), fresh inputs, the reference's outputs, and fla-core 0.6.0's signatures and module layout."""

from __future__ import annotations

import functools

import torch

from conftest import RecurrenceShape, assert_rms
from conftest import recurrence_inputs as conftest_inputs
from k3compile.ir import reference

H, K, V = 2, 20, 12
CHUNK_TOL, RECURRENT_TOL = 1e-4, 1e-5
SEQLENS = (5, 0, 1, 13)  # an empty and a one-token sequence, T = 19

@functools.cache
def op_of(kind: str, HV: int = 2, layout: str = "kv", head_k_dim: int = K, **options):
    """The k3 op of a spec table written out in the test (the oracle's side of the mapping)."""
    from k3compile.frontend import spec_to_module
    from k3compile.spec import spec_from_table

    table = dict(name="oracle", kind=kind, num_heads=H, num_v_heads=HV, head_k_dim=head_k_dim, head_v_dim=V,
                 state_layout=layout, **options)
    return next(iter(spec_to_module(spec_from_table(table)).ops))


def draw(kind: str, B: int = 1, T: int = 19, HV: int = 2, seqlens=None, layout: str = "kv",
         initial_state: bool = True, head_k_dim: int = K) -> dict:
    """conftest's fresh inputs: unit q, k, log-sigmoid decays (>= -5), beta in (0, 1), 0.5 randn states."""
    if seqlens:
        B, T = 1, sum(seqlens)
    return conftest_inputs(kind, layout, RecurrenceShape(B, T, H, HV, head_k_dim, V, seqlens), initial_state)


def expected(op, x: dict, **extra):
    """The reference's (o, final_state) on the inputs of x (the names of the module's entries)."""
    names = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias", "scale")
    return reference.recurrence(op, **{n: x[n] for n in names if n in x}, output_final_state=True, **extra)


def assert_close(got, want, tol):
    (o, final), (ref_o, ref_final) = got, want
    assert_rms(o, ref_o, "o", tol)
    assert_rms(final, ref_final, "final_state", tol)


def raw_gate_inputs(x: dict, channel: bool, HV: int = 2) -> dict:
    """Raw gate projections and the in-kernel gate's parameters in place of log-decays."""
    x = dict(x)
    x["g"] = torch.randn_like(x["g"])
    x["A_log"] = -0.5 + 0.3 * torch.randn(HV)
    x["dt_bias"] = 0.5 * torch.randn(HV * K if channel else HV)
    return x


def raw_qk(x: dict) -> dict:
    """q, k not unit (for use_qk_l2norm_in_kernel)."""
    return {**x, "q": 3 * torch.randn_like(x["q"]), "k": 0.5 * torch.randn_like(x["k"])}


def raw_beta(x: dict) -> dict:
    """beta as logits (for use_beta_sigmoid_in_kernel)."""
    return {**x, "beta": 2 * torch.randn_like(x["beta"])}


# --- signatures: fla-core 0.6.0's, written out from its source ---------------------------------

FLA_SIGNATURES = {
    "chunk_kda": "q k v g beta scale=None initial_state=None output_final_state=False use_qk_l2norm_in_kernel=False "
                 "use_gate_in_kernel=False use_beta_sigmoid_in_kernel=False allow_neg_eigval=False safe_gate=False "
                 "lower_bound=None disable_recompute=False return_intermediate_states=False state_v_first=False "
                 "cu_seqlens=None cu_seqlens_cpu=None cp_context=None use_graph=False max_num_seqs=None **kwargs",
    "fused_recurrent_kda": "q k v g beta A_log=None dt_bias=None scale=None initial_state=None output_final_state=False "
                           "use_qk_l2norm_in_kernel=False use_gate_in_kernel=False use_beta_sigmoid_in_kernel=False "
                           "allow_neg_eigval=False lower_bound=None state_v_first=False cu_seqlens=None **kwargs",
    "chunk_gated_delta_rule": "q k v g beta scale=None initial_state=None output_final_state=False "
                              "use_qk_l2norm_in_kernel=False use_beta_sigmoid_in_kernel=False allow_neg_eigval=False "
                              "state_v_first=False cu_seqlens=None cu_seqlens_cpu=None chunk_indices=None "
                              "cp_context=None **kwargs",
    "fused_recurrent_gated_delta_rule": "q k v g=None gk=None gv=None beta=None scale=None initial_state=None "
                                        "output_final_state=False use_qk_l2norm_in_kernel=False "
                                        "use_gate_in_kernel=False A_log=None dt_bias=None "
                                        "use_beta_sigmoid_in_kernel=False allow_neg_eigval=False state_v_first=False "
                                        "cu_seqlens=None **kwargs",
    "chunk_delta_rule": "q k v beta scale=None initial_state=None output_final_state=False "
                        "use_qk_l2norm_in_kernel=False cu_seqlens=None cu_seqlens_cpu=None **kwargs",
    "fused_recurrent_delta_rule": "q k v beta=None scale=None initial_state=None output_final_state=False "
                                  "use_qk_l2norm_in_kernel=False cu_seqlens=None",
    "chunk_gla": "q k v g scale=None initial_state=None output_final_state=False state_v_first=False "
                 "cu_seqlens=None cu_seqlens_cpu=None",
    "fused_recurrent_gla": "q k v gk=None gv=None scale=None initial_state=None output_final_state=False reverse=False "
                           "state_v_first=False cu_seqlens=None **kwargs",
}
ALIASES = {"chunk_gdn": "chunk_gated_delta_rule", "fused_recurrent_gdn": "fused_recurrent_gated_delta_rule"}
MODULES = {"kda": ("chunk_kda", "fused_recurrent_kda"),
           "gated_delta_rule": ("chunk_gated_delta_rule", "chunk_gdn", "fused_recurrent_gated_delta_rule",
                                "fused_recurrent_gdn"),
           "delta_rule": ("chunk_delta_rule", "fused_recurrent_delta_rule"),
           "gla": ("chunk_gla", "fused_recurrent_gla")}


def reversed_sequences(x: torch.Tensor, lengths) -> torch.Tensor:
    pieces, start = [], 0
    for length in lengths:
        pieces.append(x[:, start:start + length].flip(1))
        start += length
    return torch.cat(pieces, 1)
