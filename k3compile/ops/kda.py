"""fla.ops.kda, compiled by k3compile: `from k3compile.ops.kda import chunk_kda` in place of
`from fla.ops.kda import chunk_kda`. Same signatures, defaults, returns and layouts as
fla-core 0.6.0; each call compiles (once, cached) the KDA layer its arguments describe and runs
its `chunk`, `recurrent` or `decode` entry; chunk_kda is differentiable. docs/fla-compat.md maps every keyword.
"""

from __future__ import annotations

import torch

from k3compile.ops.calls import (NO_CUDA_GRAPH, NO_FLA_CP, beta_input, check_chunk_size, check_keywords, check_varlen,
                                 entry_inputs, forward_only, fp32_state, gate_parameters, head_dims, host_offsets,
                                 negative_bound, no_gate_parameters, reject, require_fp32_state, run, run_recurrent,
                                 state_layout, state_v_first_of, states_at_chunk_starts, wants_grad)
from k3compile.ops.layers import LayerKey

__all__ = ["chunk_kda", "fused_recurrent_kda"]


def kda_gate(use_gate_in_kernel: bool, safe_gate: bool, lower_bound, A_log, dt_bias) -> tuple[str, float]:
    """The spec's (gate_input, gate_lower_bound) of fla's KDA gate options."""
    if not use_gate_in_kernel:
        no_gate_parameters(A_log, dt_bias)
        if safe_gate:  # fla's contract: g >= lower_bound already; we clamp, equal on every valid input
            return "clamped", -5.0 if lower_bound is None else negative_bound(lower_bound)
        return "log", -5.0  # fla reads lower_bound only for the in-kernel gate
    if lower_bound is None:
        if A_log is None:
            raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set.")
        if safe_gate:
            raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
        return "softplus", -5.0
    bound = negative_bound(lower_bound)
    if safe_gate and bound < -5:
        raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    return "bounded", bound


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
):
    r"""KDA, chunkwise (prefill): the compiled layer's `chunk` entry.

    Args:
        q, k: [B, T, H, K] (K <= 256, as in fla). v: [B, T, HV, V], HV a multiple of H (grouped
            value heads). g: [B, T, HV, K], the log-decay, or with use_gate_in_kernel the raw gate
            projection. beta: [B, T, HV], in (0, 1), or logits with use_beta_sigmoid_in_kernel.
        scale: the query scale, default K ** -0.5 (a run-time argument: never recompiles).
        initial_state: [N, HV, K, V] float32 ([N, HV, V, K] with state_v_first), N sequences.
        output_final_state: also return the final states, float32, in the same layout.
        use_qk_l2norm_in_kernel: q, k divided by sqrt(|x|^2 + 1e-6) in the kernel (spec qk_l2norm).
        use_gate_in_kernel: g is raw; the kernel applies -exp(A_log) softplus(g + dt_bias)
            (gate_input softplus; A_log required) or, with lower_bound set,
            lower_bound sigmoid(exp(A_log) (g + dt_bias)) (gate_input bounded; A_log None: exp(A_log) = 1).
        use_beta_sigmoid_in_kernel: beta = sigmoid(beta) in the kernel (beta_input logits).
        allow_neg_eigval: beta = 2 sigmoid(beta) (beta_input logits_neg_eigval); needs the above.
        safe_gate: fla's bounded-gate fast path. With use_gate_in_kernel it needs lower_bound in
            [-5, 0) (the bounded gate); without, g must already be >= lower_bound (default -5):
            k3compile clamps g at it (gate_input clamped), which equals fla on every input fla
            allows and stays defined on the others.
        lower_bound: the gate's lower bound (log space), read with use_gate_in_kernel or safe_gate.
        disable_recompute: fla's memory-for-time switch of its backward: under gradients the
            forward keeps what the backward's first kernel would recompute (the decayed keys and
            queries, the WY factors, the query Gram, the chunk decays: about four times q's bytes
            at K = V = 128) and the backward skips that kernel (save-forward-values; where the
            tuned forward and backward run different chunk sizes it recomputes). The gradients
            are the same values either way. As in fla, it cannot be combined with
            return_intermediate_states.
        return_intermediate_states: also return h [B, NT, HV, K, V] in the input dtype, the
            state at the start of every chunk of chunk_size tokens (NT = ceil(T / chunk_size);
            varlen: [1, all sequences' chunks, ...]); inference mode only, as in fla.
        state_v_first: states as [V, K] (spec state_layout vk); transpose_state_layout is its
            deprecated alias (a DeprecationWarning, as in fla).
        cu_seqlens: [N + 1] offsets of N packed sequences (B = 1). cu_seqlens_cpu: its host copy,
            checked against it and used where the offsets are needed on the host.
        cp_context, use_graph, max_num_seqs: NotImplementedError (see docs/fla-compat.md).
        **kwargs: A_log [HV] and dt_bias [HV * K] (in-kernel gate only), chunk_size (32 or 64;
            the spacing of h — the kernels' own chunks are the compiled schedule's).
            Any other keyword is a TypeError.

    Returns:
        (o, final_state), or (o, final_state, h) with return_intermediate_states: o [B, T, HV, V]
        in the input dtype, final_state or None.
    """
    check_keywords("chunk_kda", kwargs, ("transpose_state_layout", "A_log", "dt_bias", "chunk_size"))
    state_v_first = state_v_first_of(state_v_first, kwargs)
    A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    if cp_context is not None:
        reject("cp_context", NO_FLA_CP)
    if use_graph or max_num_seqs is not None:
        reject("use_graph" if use_graph else "max_num_seqs", NO_CUDA_GRAPH)
    if disable_recompute and return_intermediate_states:
        raise ValueError("return_intermediate_states: must be used with disable_recompute=False, as in fla")
    check_varlen(q, cu_seqlens, initial_state, cu_seqlens_cpu)
    require_fp32_state("chunk_kda", initial_state)
    gate_input, bound = kda_gate(use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias)
    chunk_size = check_chunk_size("KDA", kwargs.get("chunk_size", 64), (32, 64))
    beta_form = beta_input(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    H, HV, K, V = head_dims(q, v)
    if K > 256:
        raise ValueError(f"Currently we only support key headdim <=256 for KDA, got {K}.")
    key = LayerKey("kda", H, HV, K, V, state_layout(state_v_first), bool(use_qk_l2norm_in_kernel), gate_input,
                   bound, beta_form)
    if use_gate_in_kernel:
        A_log, dt_bias = gate_parameters(A_log, dt_bias, HV, K, q.device)
    tensors = entry_inputs(key, q, k, v, g, beta, A_log, dt_bias)
    options = dict(initial_state=initial_state, output_final_state=bool(output_final_state), cu_seqlens=cu_seqlens)
    if not return_intermediate_states:
        return run("chunk", key, tensors, scale=scale, save_forward=bool(disable_recompute), **options)
    if not torch.is_inference_mode_enabled():
        raise ValueError("return_intermediate_states: only allowed in inference mode (torch.inference_mode()), "
                         "as in fla")
    o, final_state, checkpoints = run("chunk", key, tensors, scale=scale, checkpoint_every=chunk_size, **options)
    if cu_seqlens is None:
        lengths = [q.shape[1]] * q.shape[0]
    else:
        bounds = host_offsets(cu_seqlens, cu_seqlens_cpu)
        lengths = [end - start for start, end in zip(bounds, bounds[1:])]
    h = states_at_chunk_starts(checkpoints, initial_state, lengths, chunk_size, cu_seqlens is not None, q.dtype)
    return o, final_state, h


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""KDA, token by token (decode): the compiled layer's `recurrent` entry, or with
    ssm_state_indices its `decode` entry over a state pool.

    Args:
        q, k, v, g, beta, scale, output_final_state, use_qk_l2norm_in_kernel,
            use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens: as chunk_kda.
        A_log: [HV], dt_bias: [HV * K]: the in-kernel gate's parameters (use_gate_in_kernel only).
        initial_state: [N, HV, K, V] (any float dtype, read as fp32 like fla), or with
            ssm_state_indices the state pool [P, HV, K, V] (fp32 or bf16), updated in place.
        use_gate_in_kernel: g is raw: -exp(A_log) softplus(g + dt_bias) (A_log required) or,
            with lower_bound, lower_bound sigmoid(exp(A_log) (g + dt_bias)) (A_log None: exp(A_log) = 1).
        lower_bound: read only with use_gate_in_kernel (as in fla).
        **kwargs: transpose_state_layout (deprecated alias of state_v_first);
            ssm_state_indices [N] (vLLM's continuous batching, as fla's fused_recurrent_kda_fwd):
            sequence n starts from initial_state[ssm_state_indices[n]] and its final state is
            written back there (-1: padding, read as zeros, never written; other rows are not
            touched); returns (o, initial_state). Varlen batches run when their non-empty
            sequences have one length (else NotImplementedError).
            num_accepted_tokens: NotImplementedError (k3compile replays speculative drafts).
            Any other keyword is a TypeError.

    Returns:
        (o [B, T, HV, V] in the input dtype, final_state float32 or None).
    """
    check_keywords("fused_recurrent_kda", kwargs, ("transpose_state_layout", "ssm_state_indices",
                                                   "num_accepted_tokens"))
    state_v_first = state_v_first_of(state_v_first, kwargs)
    ssm_state_indices = kwargs.get("ssm_state_indices")
    if (wants_grad(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state)
            and ssm_state_indices is None and kwargs.get("num_accepted_tokens") is None):
        # the recurrent entry has no backward: the chunk entry computes the same function and has one
        return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=fp32_state(initial_state),
                         output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                         use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                         allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, state_v_first=state_v_first,
                         cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias)
    forward_only(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state)
    check_varlen(q, cu_seqlens, initial_state, pool=ssm_state_indices is not None)
    beta_form = beta_input(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    gate_input, bound = kda_gate(use_gate_in_kernel, False, lower_bound, A_log, dt_bias)
    H, HV, K, V = head_dims(q, v)
    key = LayerKey("kda", H, HV, K, V, state_layout(state_v_first), bool(use_qk_l2norm_in_kernel), gate_input,
                   bound, beta_form)
    if use_gate_in_kernel:
        A_log, dt_bias = gate_parameters(A_log, dt_bias, HV, K, q.device)
    return run_recurrent(key, entry_inputs(key, q, k, v, g, beta, A_log, dt_bias), scale=scale,
                         initial_state=initial_state, output_final_state=bool(output_final_state),
                         cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                         num_accepted_tokens=kwargs.get("num_accepted_tokens"))
