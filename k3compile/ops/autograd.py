"""The chunk entry as a differentiable torch operator: one `torch.library` custom op per compiled
layer (`k3compile::chunk_<layer>`), its forward the layer's `chunk`, its backward another
custom op running the layer's `chunk_backward` (derive-backward's schedule: the chunk-local
stages recomputed, the states re-scanned, nothing but the inputs saved). With save_forward
(fla's disable_recompute) the forward is `chunk_saving`, which also returns what the backward's
first kernel would recompute, and the backward `chunk_backward_saved` takes it
(save-forward-values). Both have fake (meta)
implementations, so `torch.compile(fullgraph=True)` captures a training step without graph
breaks, and gradients come back in fla's layouts: each input's in its own dtype and shape, dh0
only when the initial state needs one."""

from __future__ import annotations

from dataclasses import astuple
from functools import cache

import torch

from k3compile.ops.layers import LayerKey, entry_shape, layer_module
from k3compile.ops.windows import backward_window, windowed_backward

# the inputs of the chunk entry that have gradients, in the order chunk_backward returns theirs
DIFFERENTIABLE = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")


def needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors)


def _nothing(like: torch.Tensor) -> torch.Tensor:
    """What an op returns for an output the call did not ask for (custom ops return tensors)."""
    return like.new_empty((0,), dtype=torch.float32)


@cache
def chunk_operator(key):
    """The custom ops of the layer of `key` (a k3compile.ops.layers.LayerKey): (chunk, its backward)."""
    name = key.module_name()

    def inputs(q, k, v, g, beta, A_log, dt_bias) -> dict:
        named = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        return {n: x for n, x in named.items() if x is not None or n in ("g", "beta")}

    @torch.library.custom_op(f"k3compile::chunk_{name}", mutates_args=())
    def chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor | None,
              A_log: torch.Tensor | None, dt_bias: torch.Tensor | None, initial_state: torch.Tensor | None,
              cu_seqlens: torch.Tensor | None, scale: float, output_final_state: bool, save_forward: bool,
              window: int) -> list[torch.Tensor]:
        """[o, final_state (empty unless asked for), the states at every window's end (a windowed
        backward's, k3compile/ops/windows.py; empty for window 0), what the forward saves for the
        backward (with save_forward, where the module has a saving forward: save-forward-values)]."""
        module = layer_module(key)
        entry = module.chunk_saving if save_forward and saves_forward(module) else module.chunk
        o, final_state, *rest = entry(**inputs(q, k, v, g, beta, A_log, dt_bias), scale=scale,
                                      initial_state=initial_state, output_final_state=output_final_state,
                                      cu_seqlens=cu_seqlens, **({"checkpoint_every": window} if window else {}))
        checkpoints, saved = (rest[0], rest[1:]) if window else (_nothing(q), rest)
        return [o, _nothing(q) if final_state is None else final_state, checkpoints, *saved]

    @chunk.register_fake
    def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, output_final_state, save_forward,
          window):
        B, T, HV, V = v.shape
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        state = (HV, V, key.head_k_dim) if key.state_layout == "vk" else (HV, key.head_k_dim, V)
        module = layer_module(key)
        saved = saved_like(module, q, B, T, N) if save_forward and saves_forward(module) else []
        checkpoints = q.new_empty((N, T // window, *state), dtype=torch.float32) if window else _nothing(q)
        return [v.new_empty(v.shape), q.new_empty((N, *state), dtype=torch.float32) if output_final_state
                else _nothing(q), checkpoints, *saved]

    @torch.library.custom_op(f"k3compile::chunk_backward_{name}", mutates_args=())
    def chunk_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                       beta: torch.Tensor | None, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
                       initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, do: torch.Tensor,
                       dht: torch.Tensor | None, scale: float, output_dh0: bool, saved: list[torch.Tensor],
                       checkpoints: torch.Tensor, window: int) -> list[torch.Tensor]:
        """The gradient of each input of DIFFERENTIABLE (an empty tensor for one the layer does not
        read; dtypes as the fake below says), then dh0 (empty unless asked for). saved: what the
        saving forward returned (chunk_backward_saved then skips its first kernel), or none.
        window > 0: in windows of that many tokens from the forward's checkpoints (windows.py)."""
        given = inputs(q, k, v, g, beta, A_log, dt_bias)
        module = layer_module(key)
        entry, names = (module.chunk_backward_saved, saved_names(module)) if saved else (module.chunk_backward, [])
        if window:
            grads = windowed_backward(entry, given, scale=scale, initial_state=initial_state,
                                      checkpoints=checkpoints, window=window, do=do, dht=dht, output_dh0=output_dh0)
        else:
            grads = entry(**given, **dict(zip(names, saved, strict=True)), scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, do=do, dht=dht, output_dh0=output_dh0)
        read = iter(grads[:-1])
        by_name = {n: next(read) if given.get(n) is not None else _nothing(q) for n in DIFFERENTIABLE}
        return [*by_name.values(), _nothing(q) if grads[-1] is None else grads[-1]]

    @chunk_backward.register_fake
    def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, do, dht, scale, output_dh0, saved, checkpoints,
          window):
        named = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        # each gradient's dtype as the compiled entry declares it (derive-backward decides)
        declared = layer_module(key).OUTPUT_DTYPES["chunk_backward"]
        dtype = {n: q.dtype if declared[f"d{n}"] == "float" else getattr(torch, declared[f"d{n}"])
                 for n, x in named.items() if x is not None}
        grads = [_nothing(q) if x is None else x.new_empty(x.shape, dtype=dtype[n]) for n, x in named.items()]
        dh0 = initial_state.new_empty(initial_state.shape) if output_dh0 and initial_state is not None else _nothing(q)
        return [*grads, dh0]

    def setup_context(ctx, inputs, output):
        *tensors, scale, output_final_state, _, window = inputs
        ctx.save_for_backward(*tensors, *output[2:])  # the inputs, the checkpoints, the saved values
        ctx.scale, ctx.output_final_state, ctx.window = scale, output_final_state, window

    def backward(ctx, grads_of_outputs):
        do, dht = grads_of_outputs[:2]  # the saved values are not differentiated
        (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens) = ctx.saved_tensors[:9]
        checkpoints, saved = ctx.saved_tensors[9], ctx.saved_tensors[10:]
        wants_dh0 = initial_state is not None and ctx.needs_input_grad[7]
        grads = chunk_backward(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, do.contiguous(),
                               dht.contiguous() if ctx.output_final_state else None, ctx.scale, wants_dh0,
                               list(saved), checkpoints, ctx.window)
        primals = (q, k, v, g, beta, A_log, dt_bias)
        cast = [None if x is None else grad.to(x.dtype) for x, grad in zip(primals, grads[:-1], strict=True)]
        return (*cast, grads[-1] if wants_dh0 else None, None, None, None, None, None)

    chunk.register_autograd(backward, setup_context=setup_context)
    return chunk


def saves_forward(module) -> bool:
    """Whether the layer's module has a saving forward (save-forward-values found the backward's
    first kernel to be the forward's: the same chunk size)."""
    return "chunk_saving" in module.OUTPUT_DTYPES


def saved_names(module) -> list[str]:
    """What chunk_saving returns beyond chunk's outputs (after them), in order: chunk_backward_saved's inputs."""
    return [name for name in module.OUTPUT_DTYPES["chunk_saving"] if name not in module.OUTPUT_DTYPES["chunk"]]


def saved_like(module, q: torch.Tensor, B: int, T: int, N: int) -> list[torch.Tensor]:
    """Empty tensors shaped and typed as chunk_saving's saved outputs, for a call on q [B, T, ...]."""
    dtypes, shapes = module.OUTPUT_DTYPES["chunk_saving"], module.OUTPUT_SHAPES["chunk_saving"]
    return [q.new_empty(entry_shape(module, "chunk_saving", shapes[name], B, T, N),
                        dtype=q.dtype if dtypes[name] == "float" else getattr(torch, dtypes[name]))
            for name in saved_names(module)]


def operator_name(*fields) -> str:
    """The name of the chunk op of the layer whose LayerKey has these fields, under
    torch.ops.k3compile, registering its ops: run, not traced, by torch.compile (the name a
    constant of the graph; plain fields, as dynamo passes constants)."""
    key = LayerKey(*fields)
    chunk_operator(key)
    return f"chunk_{key.module_name()}"


# torch.compiler.assume_constant_result(operator_name), without importing torch._dynamo (4 s of
# every `import k3compile.ops`, where nothing may ever compile): the mark the decorator sets,
# which tests/test_ops_training.py checks is still the one it sets
operator_name._dynamo_marked_constant = True


def run_chunk(key, tensors: dict, *, scale, initial_state, output_final_state, cu_seqlens, save_forward=False):
    """(o, final_state) of the layer's chunk entry through its custom op (differentiable, and
    opaque to torch.compile). save_forward: the forward keeps what the backward's first kernel
    would recompute (fla's disable_recompute; where the module has a saving forward)."""
    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")
    chunk = getattr(torch.ops.k3compile, operator_name(*astuple(key)))
    q = tensors["q"]
    window = backward_window(q.shape[0], q.shape[1], q.element_size(), str(q.device), cu_seqlens is not None,
                             bool(save_forward), *astuple(key))
    o, final_state, *_ = chunk(*(tensors.get(n) for n in names), initial_state, cu_seqlens, float(scale),
                               bool(output_final_state), bool(save_forward), window)
    return o, final_state if output_final_state else None
