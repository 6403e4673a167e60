"""fla.ops.gated_delta_rule, compiled by k3compile (Gated DeltaNet: a scalar gate per token and
value head, and the delta rule). Same signatures as fla-core 0.6.0; docs/fla-compat.md maps every
keyword. chunk_* is differentiable.
"""

from __future__ import annotations

import torch

from k3compile.ops.calls import (NO_FLA_CP, beta_input, check_chunk_size, check_head_first, check_keywords,
                                 check_varlen, described, entry_inputs, forward_only, fp32_state, gate_parameters,
                                 head_dims, host_offsets, no_gate_parameters, reject, run, run_recurrent,
                                 state_layout, state_v_first_of, wants_grad)
from k3compile.ops.kda import chunk_kda
from k3compile.ops.layers import LayerKey

__all__ = ["chunk_gated_delta_rule", "chunk_gdn", "fused_recurrent_gated_delta_rule", "fused_recurrent_gdn"]


def scalar_gate(use_gate_in_kernel: bool, A_log, dt_bias, HV: int, device):
    """(gate_input, A_log, dt_bias) of a scalar gate: -exp(A_log) softplus(g + dt_bias) in the
    kernel (A_log required, dt_bias [HV] or None), or g as the log-decay."""
    if not use_gate_in_kernel:
        no_gate_parameters(A_log, dt_bias)
        return "log", None, None
    if A_log is None:
        raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
    return ("softplus", *gate_parameters(A_log, dt_bias, HV, 1, device))


def check_chunk_indices(chunk_indices, cu_seqlens, cu_seqlens_cpu, chunk_size: int) -> None:
    """fla's precomputed [chunks, 2] table of (sequence, chunk) for its own chunking; our kernels
    build theirs, so it is only checked against cu_seqlens."""
    if chunk_indices is None:
        return
    if cu_seqlens is None:
        raise ValueError("chunk_indices: given without cu_seqlens (it indexes the chunks of packed sequences)")
    bounds = host_offsets(cu_seqlens, cu_seqlens_cpu)
    chunks = sum(-(-(end - start) // chunk_size) for start, end in zip(bounds, bounds[1:]))
    if not isinstance(chunk_indices, torch.Tensor) or tuple(chunk_indices.shape) != (chunks, 2):
        raise ValueError(f"chunk_indices: expected shape [{chunks}, 2] (the chunks of {chunk_size} tokens of "
                         f"cu_seqlens), got {described(chunk_indices)}")


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context=None,
    **kwargs,
):
    r"""Gated DeltaNet, chunkwise (prefill): the compiled layer's `chunk` entry.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H. g: [B, T, HV], the log-decay,
            or the raw gate with use_gate_in_kernel. beta: [B, T, HV] (logits with
            use_beta_sigmoid_in_kernel).
        scale: default K ** -0.5 (run time). initial_state: [N, HV, K, V] ([N, HV, V, K] with
            state_v_first), read as fp32. output_final_state: also return the final states (fp32).
        use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
            cu_seqlens, cu_seqlens_cpu: as k3compile.ops.kda.chunk_kda.
        chunk_indices: fla's precomputed chunk table; checked against cu_seqlens (our kernels
            build their own).
        cp_context: NotImplementedError (use the compiled layer's chunk(..., cp_group=...)).
        **kwargs: use_gate_in_kernel (g = -exp(A_log) softplus(g + dt_bias) in the kernel),
            A_log [HV] (required with it), dt_bias [HV]; chunk_size 16, 32 or 64 (checked; the
            kernels' chunks are the compiled schedule's, the result the same);
            transpose_state_layout (deprecated alias of state_v_first); head_first=True:
            NotImplementedError (removed in fla). Any other keyword is a TypeError.

    Returns:
        (o [B, T, HV, V] in the input dtype, final_state float32 or None).
    """
    check_keywords("chunk_gated_delta_rule", kwargs, ("transpose_state_layout", "head_first", "chunk_size",
                                                      "use_gate_in_kernel", "A_log", "dt_bias"))
    state_v_first = state_v_first_of(state_v_first, kwargs)
    A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    H, HV, K, V = head_dims(q, v)
    check_head_first(kwargs)
    chunk_size = check_chunk_size("Gated Delta Rule", kwargs.get("chunk_size", 64), (16, 32, 64))
    if cp_context is not None:
        reject("cp_context", NO_FLA_CP)
    check_varlen(q, cu_seqlens, initial_state, cu_seqlens_cpu)
    check_chunk_indices(chunk_indices, cu_seqlens, cu_seqlens_cpu, chunk_size)
    gate_input, A_log, dt_bias = scalar_gate(kwargs.get("use_gate_in_kernel", False), A_log, dt_bias, HV, q.device)
    key = LayerKey("gated_deltanet", H, HV, K, V, state_layout(state_v_first), bool(use_qk_l2norm_in_kernel),
                   gate_input, beta_input=beta_input(use_beta_sigmoid_in_kernel, allow_neg_eigval))
    return run("chunk", key, entry_inputs(key, q, k, v, g, beta, A_log, dt_bias), scale=scale,
               initial_state=fp32_state(initial_state), output_final_state=bool(output_final_state),
               cu_seqlens=cu_seqlens)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The delta rule token by token (decode), with fla's optional gates: the compiled
    `recurrent` entry (with ssm_state_indices `decode` over a state pool) of the layer they
    describe — g alone: Gated DeltaNet; gk [B, T, HV, K] alone: a channel gate (KDA); g and gk:
    KDA with the log-decay gk + g (their decays multiply); neither: DeltaNet.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V]. g: [B, T, HV] log-decay (raw with
            use_gate_in_kernel). gk: [B, T, HV, K] log-decay. gv: NotImplementedError (k3compile's
            recurrences have no decay over the value dimension). beta: [B, T, HV]; None: ones.
        scale, output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
            allow_neg_eigval, state_v_first, cu_seqlens: as k3compile.ops.kda.fused_recurrent_kda.
        initial_state: [N, HV, K, V] (read as fp32), or the pool of ssm_state_indices.
        use_gate_in_kernel: g = -exp(A_log) softplus(g + dt_bias) in the kernel; needs g and
            A_log [HV]; dt_bias [HV] or None. With gk as well: NotImplementedError.
        **kwargs: transpose_state_layout; ssm_state_indices and num_accepted_tokens as in
            k3compile.ops.kda.fused_recurrent_kda. Any other keyword is a TypeError.

    Returns:
        (o [B, T, HV, V] in the input dtype, final_state float32 or None); with
        ssm_state_indices (o, initial_state).
    """
    check_keywords("fused_recurrent_gated_delta_rule", kwargs, ("transpose_state_layout", "ssm_state_indices",
                                                                "num_accepted_tokens"))
    state_v_first = state_v_first_of(state_v_first, kwargs)
    ssm_state_indices = kwargs.get("ssm_state_indices")
    # under autograd the chunk function of the same arguments runs: the recurrent entry has no backward
    as_chunk = (wants_grad(q=q, k=k, v=v, g=g, gk=gk, beta=beta, initial_state=initial_state, A_log=A_log,
                           dt_bias=dt_bias)
                and ssm_state_indices is None and kwargs.get("num_accepted_tokens") is None and gv is None
                and (g is not None or gk is not None))
    if not as_chunk:
        forward_only(q=q, k=k, v=v, g=g, gk=gk, gv=gv, beta=beta, initial_state=initial_state, A_log=A_log,
                     dt_bias=dt_bias)
    given_A_log, given_dt_bias = A_log, dt_bias
    if gv is not None:
        reject("gv", "k3compile's recurrences have no decay over the value dimension")
    check_varlen(q, cu_seqlens, initial_state, pool=ssm_state_indices is not None)
    H, HV, K, V = head_dims(q, v)
    if use_gate_in_kernel:
        if g is None:
            raise ValueError("`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`.")
        if gk is not None:
            reject("gk", "with use_gate_in_kernel the kernel transforms one gate, g; pass gk + the gate of g "
                         "as gk instead")
    gate_input, A_log, dt_bias = scalar_gate(use_gate_in_kernel, A_log, dt_bias, HV, q.device)
    beta_form = beta_input(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if gk is not None:
        kind = "kda"
        if g is not None:  # one channel log-decay, in fp32 (the kernels read any float dtype)
            if not (isinstance(g, torch.Tensor) and isinstance(gk, torch.Tensor) and g.shape == gk.shape[:3]):
                raise ValueError(f"g: with gk, expected g [B, T, HV] and gk [B, T, HV, K] of one B, T, HV, got "
                                 f"{described(g)} and {described(gk)}")
            gk = gk.float() + g.float()[..., None]
        g = gk
    else:
        kind = "gated_deltanet" if g is not None else "deltanet"
    if beta is None:
        beta = v.new_ones(v.shape[:3])
    if as_chunk:
        shared = dict(scale=scale, initial_state=fp32_state(initial_state), output_final_state=output_final_state,
                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                      use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                      state_v_first=state_v_first, cu_seqlens=cu_seqlens)
        if kind == "kda":  # g is the channel log-decay (gk, plus the scalar g where both came)
            return chunk_kda(q, k, v, g, beta, **shared)
        return chunk_gated_delta_rule(q, k, v, g, beta, **shared, use_gate_in_kernel=use_gate_in_kernel,
                                      A_log=given_A_log, dt_bias=given_dt_bias)
    key = LayerKey(kind, H, HV, K, V, state_layout(state_v_first), bool(use_qk_l2norm_in_kernel), gate_input,
                   beta_input=beta_form)
    return run_recurrent(key, entry_inputs(key, q, k, v, g, beta, A_log, dt_bias), scale=scale,
                         initial_state=initial_state, output_final_state=bool(output_final_state),
                         cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                         num_accepted_tokens=kwargs.get("num_accepted_tokens"))


# fla-core 0.6.0's short names, exported beside the long ones (fla.ops and fla.ops.gated_delta_rule)
chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
