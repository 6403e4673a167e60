"""What the Triton kernels can hold, checked before a module is printed.

The IR and the reference run a layer of any size; these bounds belong to this backend's tiles
and launch grids. Each is read off the kernels of the scheduled module (a recurrent-only
pipeline has no chunk tiles, so no bound on V), and the shared-memory and register figures
were measured by compiling the kernels for sm_90 (bench/sm90_resources.py, Triton 3.9).
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from k3compile.backends.triton.printer.common import chunk_rows, next_power_of_2
from k3compile.errors import UnsupportedError
from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp

MAX_TENSOR_NUMEL = 2**20  # triton.language: TRITON_MAX_TENSOR_NUMEL, the most elements of a block
MAX_GRID_AXIS = 65535  # CUDA caps grid axes 1 and 2 (axis 0: 2**31 - 1)
# key rows are held whole (next_pow2(K) wide) by every kernel: fla's chunk_kda has the same
# bound; at K = 512 the decode kernel's state tile spills (3.5 KB of stack per thread) and the
# chunk scan needs 130 KB of shared memory
MAX_HEAD_K_DIM = 256
# a chunk kernel's [chunk, next_pow2(V)] tiles (V whole) go through shared memory: 128 KB at
# 16 x 4096 on sm_90, of the 227 KB a program may have; 8192 columns would not fit
MAX_CHUNK_TILE = 16 * 4096
CHUNK_SIZES = (16, 32, 64)  # tl.dot tiles: powers of two, at least 16
# value blocks of fewer columns than this in a kernel of 64-row chunks: Triton 3.6 lowers their
# Hopper (wgmma) products to a shared-memory read out of bounds (compute-sanitizer: "Invalid
# __shared__ read of size 512 bytes" in the backward's gradients kernel; the same launch runs with
# wgmma off, with value blocks of 64, and at 32-row chunks; bench/results/backward_fault_h100_*.md)
MIN_VALUE_BLOCK_AT_64_ROWS = 64
# the MoE router's top-k programs take blocks of at most 16 token rows and hold their
# [rows, next_pow2(E)] fp32 logits (summed over the hidden slices), then scores, whole in
# registers: at most k3s.MAX_ROW_PER_WARP elements per warp, AttnRes's bound for its rows (not
# measured for the router); K3's 896 experts need 8 warps
ROUTER_ROWS = 16


def exceeds(source: str, key: str, value: int, limit: int, why: str) -> UnsupportedError:
    return UnsupportedError(f"{source}: key '{key}' = {value} exceeds the Triton kernels' limit of {limit} ({why})")


def check_kernel(kernel: k3s.KernelOp, source: str) -> None:
    name = f"@{kernel.sym_name.data}"
    for op in kernel.walk():
        if isinstance(op, (k3s.StateTileOp, k3s.ChunkTileOp)) and op.head_k_dim.value.data > MAX_HEAD_K_DIM:
            raise exceeds(source, "head_k_dim", op.head_k_dim.value.data, MAX_HEAD_K_DIM,
                          "every kernel holds whole key rows on chip, as fla's chunk_kda does")
        if isinstance(op, k3s.StateTileOp):
            shape = (next_power_of_2(op.head_k_dim.value.data),
                     min(next_power_of_2(op.head_v_dim.value.data), op.block_v.value.data))
            if shape[0] * shape[1] > MAX_TENSOR_NUMEL:
                raise UnsupportedError(f"{source}: the state tile {list(shape)} of kernel {name} exceeds Triton's "
                                       f"{MAX_TENSOR_NUMEL} elements per block; lower its pass's block-v")
        if isinstance(op, k3s.ChunkTileOp):
            chunk, V = op.chunk_size.value.data, op.head_v_dim.value.data
            if chunk * next_power_of_2(V) > MAX_CHUNK_TILE:
                most = MAX_CHUNK_TILE // chunk
                raise exceeds(source, "head_v_dim", V, most,
                              f"at chunk size {chunk}, kernel {name} holds [chunk, V] tiles with V whole, "
                              f"{MAX_CHUNK_TILE} elements at most in shared memory; a smaller chunk-size allows more")
        if isinstance(op, (k3s.ChunkTileOp, k3s.ChunkLoopOp)) and op.chunk_size.value.data not in CHUNK_SIZES:
            raise UnsupportedError(f"Triton backend: chunk size must be 16, 32 or 64, got {op.chunk_size.value.data}")
        if isinstance(op, k3s.ValueBlockLoopOp) and chunk_rows(op) >= 64 \
                and op.block_v.value.data < MIN_VALUE_BLOCK_AT_64_ROWS:
            raise UnsupportedError(
                f"{source}: block-v {op.block_v.value.data} at chunk size {chunk_rows(op)} (kernel {name}): Triton 3.6 "
                f"lowers these tiles' Hopper products to an out-of-bounds shared-memory read; use block-v "
                f"{MIN_VALUE_BLOCK_AT_64_ROWS} or smaller chunks")
        blocks = {k3s.BlockGatesOp: ("sub-chunk", lambda o: o.sub_chunk.value.data),
                  k3s.ForwardSubstitutionOp: ("forward-substitution block", lambda o: o.block.value.data),
                  k3s.UnitLowerInverseOp: ("forward-substitution block", lambda o: o.block.value.data)}
        if type(op) in blocks:  # row blocks of a chunk's [C, C] tiles
            what, size = blocks[type(op)][0], blocks[type(op)][1](op)
            if not k3s.is_power_of_two(size) or chunk_rows(op) % size:
                raise UnsupportedError(f"Triton backend: {what} {size} must be a power of two dividing the chunk "
                                       f"size {chunk_rows(op)}")
        # a fold in a column loop holds only the loop's block of columns, whatever the row's width
        if isinstance(op, k3s.FoldQueryOp) and not isinstance(op.parent_op(), k3s.ColumnLoopOp):
            most = k3s.MAX_ROW_PER_WARP * kernel.num_warps.value.data
            if next_power_of_2(op.hidden_size.value.data) > most:
                raise exceeds(source, "hidden_size", op.hidden_size.value.data, most,
                              f"kernel {name} holds its rows in the registers of its {kernel.num_warps.value.data} "
                              f"warps, {k3s.MAX_ROW_PER_WARP} columns per warp; fuse-attnres{{num-warps=...}} allows more")
        if isinstance(op, k3s.SumPartialLogitsOp):
            most = k3s.MAX_ROW_PER_WARP * kernel.num_warps.value.data // ROUTER_ROWS
            if next_power_of_2(op.num_experts.value.data) > most:
                raise exceeds(source, "num_experts", op.num_experts.value.data, most,
                              f"kernel {name} holds the logits of {ROUTER_ROWS} rows for every expert (padded to a "
                              f"power of two) in the registers of its {kernel.num_warps.value.data} warps, "
                              f"{k3s.MAX_ROW_PER_WARP} per warp; lower-moe-routing{{num-warps=...}} allows more")


def check_heads(layer: RecurrenceOp, kernels: list[k3s.KernelOp], source: str) -> None:
    """A kernel of one program per value head (or per sequence and value head) on grid axis 1
    launches at least num_v_heads programs there."""
    heads = layer.num_v_heads.value.data
    on_axis_1 = [k for k in kernels if {k3s.GridAxis.VALUE_HEAD, k3s.GridAxis.SEQUENCE_HEAD} & set(k.axes[1:])]
    if on_axis_1 and heads > MAX_GRID_AXIS:
        raise exceeds(source, "num_v_heads", heads, MAX_GRID_AXIS,
                      f"num_heads when not given; kernel @{on_axis_1[0].sym_name.data} launches a program per "
                      "value head on grid axis 1, which CUDA caps")


def check_limits(module: ModuleOp, source: str) -> None:
    """Raise UnsupportedError ("<source>: key 'head_k_dim' = ... exceeds ...") if a kernel of the
    scheduled module cannot hold its layer."""
    for entry in [op for op in module.ops if isinstance(op, k3s.EntryOp)]:
        kernels = k3s.entry_kernels(entry)
        for kernel in kernels:
            check_kernel(kernel, source)
        if isinstance(layer := entry.layer(), RecurrenceOp):
            check_heads(layer, kernels, source)
