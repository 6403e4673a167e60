"""The chunk entry as a differentiable function: forward by the compiled layer's `chunk`, backward
by its `chunk_backward` (derive-backward's schedule: the forward's chunk-local stages recomputed,
the states re-scanned, nothing but the inputs saved), with fla's gradient layouts: each input's
gradient in its own dtype and shape, dh0 only when the initial state needs one."""

from __future__ import annotations

import torch

# the inputs of the chunk entry that have gradients, in the order chunk_backward returns theirs
DIFFERENTIABLE = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")


class ChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, scale, cu_seqlens, output_final_state, names, initial_state, *tensors):
        inputs = dict(zip(names, tensors, strict=True))
        o, final_state = module.chunk(**inputs, scale=scale, initial_state=initial_state,
                                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        ctx.module, ctx.scale, ctx.names, ctx.cu_seqlens = module, scale, names, cu_seqlens
        ctx.save_for_backward(initial_state, *tensors)
        if final_state is None:
            return o
        return o, final_state

    @staticmethod
    def backward(ctx, do, dht=None):
        initial_state, *tensors = ctx.saved_tensors
        inputs = dict(zip(ctx.names, tensors, strict=True))
        wants_dh0 = initial_state is not None and ctx.needs_input_grad[5]
        grads = ctx.module.chunk_backward(**inputs, scale=ctx.scale, initial_state=initial_state,
                                          cu_seqlens=ctx.cu_seqlens, do=do.contiguous(),
                                          dht=None if dht is None else dht.contiguous(), output_dh0=wants_dh0)
        read = [name for name in DIFFERENTIABLE if inputs.get(name) is not None]
        by_name = dict(zip(read, grads, strict=False))
        dh0 = grads[-1]
        tensor_grads = [None if inputs[name] is None else by_name[name].to(inputs[name].dtype) for name in ctx.names]
        return (None, None, None, None, None, dh0, *tensor_grads)


def needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors)


def differentiable_chunk(module, tensors: dict, *, scale, initial_state, output_final_state, cu_seqlens):
    """(o, final_state) of module.chunk, through ChunkFunction (so that backward reaches every
    input that requires grad)."""
    names = tuple(tensors)
    out = ChunkFunction.apply(module, scale, cu_seqlens, bool(output_final_state), names, initial_state,
                              *tensors.values())
    return (out[0], out[1]) if output_final_state else (out, None)
