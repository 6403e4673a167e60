"""fla.ops.delta_rule, compiled by k3compile (DeltaNet: the delta rule, no decay). Same signatures
as fla-core 0.6.0; docs/fla-compat.md maps every keyword. chunk_* is differentiable.
"""

from __future__ import annotations

import torch

from k3compile.ops.calls import (check_chunk_size, check_head_first, check_keywords, check_varlen, entry_inputs,
                                 forward_only, fp32_state, head_dims, run, run_recurrent, wants_grad)
from k3compile.ops.layers import LayerKey

__all__ = ["chunk_delta_rule", "fused_recurrent_delta_rule"]


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs,
):
    r"""DeltaNet, chunkwise (prefill): the compiled layer's `chunk` entry.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V] (fla: HV = H; k3compile also takes grouped value
            heads). beta: [B, T, HV] in (0, 1). q, k, v of one dtype, as fla asserts; float32
            too (fla's chunk_delta_rule refuses it, our kernels do not).
        scale: default K ** -0.5. initial_state: [N, HV, K, V], read as fp32.
        output_final_state: also return the final states (fp32).
        use_qk_l2norm_in_kernel: q, k L2-normalised in the kernel.
        cu_seqlens: [N + 1] offsets (B = 1); cu_seqlens_cpu: its host copy (checked).
        **kwargs: chunk_size 16, 32 or 64 (checked; the kernels' chunks are the compiled
            schedule's, the result the same); head_first=True: NotImplementedError (removed in
            fla). Any other keyword is a TypeError.

    Returns:
        (o [B, T, HV, V] in the input dtype, final_state float32 or None).
    """
    check_keywords("chunk_delta_rule", kwargs, ("head_first", "chunk_size"))
    dtypes = [getattr(x, "dtype", None) for x in (q, k, v)]
    if len(set(dtypes)) > 1:
        raise ValueError(f"q, k, v: expected one dtype (as fla's chunk_delta_rule asserts), got "
                         f"{', '.join(map(str, dtypes))}")
    if isinstance(beta, torch.Tensor) and beta.dim() != 3:
        raise ValueError(f"beta: must be of shape [B, T, H] (3 dims), got {list(beta.shape)}")
    check_head_first(kwargs)
    check_chunk_size("the delta rule", kwargs.get("chunk_size", 64), (16, 32, 64))
    check_varlen(q, cu_seqlens, initial_state, cu_seqlens_cpu)
    H, HV, K, V = head_dims(q, v)
    key = LayerKey("deltanet", H, HV, K, V, qk_l2norm=bool(use_qk_l2norm_in_kernel))
    return run("chunk", key, entry_inputs(key, q, k, v, None, beta), scale=scale,
               initial_state=fp32_state(initial_state), output_final_state=bool(output_final_state),
               cu_seqlens=cu_seqlens)


def fused_recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor = None,
    scale: float = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""DeltaNet, token by token (decode): the compiled layer's `recurrent` entry.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V]. beta: [B, T, HV]; None: ones (as fla).
        scale: default K ** -0.5; must be > 0 (as fla asserts). initial_state: [N, HV, K, V] of
            any float dtype, read as fp32. output_final_state, use_qk_l2norm_in_kernel,
            cu_seqlens: as chunk_delta_rule. fla takes no other keyword; neither do we.

    Returns:
        (o [B, T, HV, V] in the input dtype, final_state float32 or None).
    """
    if wants_grad(q=q, k=k, v=v, beta=beta, initial_state=initial_state):
        # the recurrent entry has no backward: the chunk entry computes the same function and has one
        return chunk_delta_rule(q, k, v, v.new_ones(v.shape[:3]) if beta is None else beta, scale=scale,
                                initial_state=fp32_state(initial_state), output_final_state=output_final_state,
                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
    forward_only(q=q, k=k, v=v, beta=beta, initial_state=initial_state)
    if scale is not None and not scale > 0:
        raise ValueError(f"scale: must be positive, got {scale!r}")
    check_varlen(q, cu_seqlens, initial_state)
    H, HV, K, V = head_dims(q, v)
    if beta is None:
        beta = v.new_ones(v.shape[:3])
    key = LayerKey("deltanet", H, HV, K, V, qk_l2norm=bool(use_qk_l2norm_in_kernel))
    return run_recurrent(key, entry_inputs(key, q, k, v, None, beta), scale=scale, initial_state=initial_state,
                         output_final_state=bool(output_final_state), cu_seqlens=cu_seqlens)
