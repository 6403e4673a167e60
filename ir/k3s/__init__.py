"""The `k3s` schedule dialect: how a layer runs, as Python entry points launching kernels of stages.

A lowered module is a list of kernels and the entries that launch them:

    k3s.kernel @kda_recurrent <...> {           one Triton kernel, a symbol of the module
    ^bb0(%q: !k3s.tensor<B x T x 4 x 64, float>, ...):
                                                its arguments: exactly the tensors it uses
      k3s.state_tile %initial_state ...         stages, in program order; memory is an operand,
      k3s.token_loop %cu_seqlens { ... }        nested loops are region ops
    }
    k3s.entry @recurrent {                      the Python function of the compiled module
      %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 4 x 64, float>
                                                its arguments, with shapes and dtype classes
      k3s.launch @kda_recurrent %q, ...         a kernel it runs, on its values
    }

The lowering passes build each kernel inside its entry; outline-kernels makes it a symbol.
Passes in passes/ build these from `k3` ops; the Triton backend prints one block of code per
stage. A tensor argument's shape (its `!k3s.tensor` type) uses the symbols B (batch), T (tokens
per sequence), N (sequences: B, or len(cu_seqlens) - 1), N+1 (offsets), S (sources), P (state
pool rows), NC (per-chunk slots of a chunk entry: cdiv(B T, C) + N, enough for every chunk of
any varlen split) and R (token rows of a [tokens, hidden] input: MoE routing); every other
dimension is a positive integer.
"""

from xdsl.ir import Dialect

from k3compile.ir.k3s.adjoint import *  # noqa: F403
from k3compile.ir.k3s.attnres import *  # noqa: F403
from k3compile.ir.k3s.attnres_blocks import *  # noqa: F403
from k3compile.ir.k3s.attnres_columns import *  # noqa: F403
from k3compile.ir.k3s.attnres_columns_backward import *  # noqa: F403
from k3compile.ir.k3s.chunk import *  # noqa: F403
from k3compile.ir.k3s.chunk_loops import *  # noqa: F403
from k3compile.ir.k3s.core import *  # noqa: F403
from k3compile.ir.k3s.experts import *  # noqa: F403
from k3compile.ir.k3s.kernels import *  # noqa: F403
from k3compile.ir.k3s.gram import *  # noqa: F403
from k3compile.ir.k3s.host import *  # noqa: F403
from k3compile.ir.k3s.moe import *  # noqa: F403
from k3compile.ir.k3s.moe_backward import *  # noqa: F403
from k3compile.ir.k3s.segments import *  # noqa: F403
from k3compile.ir.k3s.target import *  # noqa: F403
from k3compile.ir.k3s.token import *  # noqa: F403
from k3compile.ir.k3s.types import *  # noqa: F403

K3S = Dialect(
    "k3s",
    [
        EntryOp,
        EntryByRowsOp,
        TensorArgOp,
        ScalarArgOp,
        CheckpointArgOp,
        SpeculativeOp,
        CacheUpdateOp,
        ReplayOp,
        SnapshotStateOp,
        RestoreSnapshotOp,
        KernelOp,
        LaunchOp,
        ForkStreamsOp,
        JoinStreamsOp,
        AbsentTensorOp,
        LaunchByRowsOp,
        WhenOp,
        FlagOp,
        StateTileOp,
        TokenLoopOp,
        NextTokenOp,
        LoadTokenOp,
        DecayOp,
        DeltaCorrectOp,
        Rank1UpdateOp,
        ReadoutOp,
        StoreStateOp,
        *ATTNRES_STAGES,
        *BLOCK_ATTNRES_STAGES,
        *BLOCK_ATTNRES_COLUMNS_STAGES,
        *BLOCK_ATTNRES_COLUMNS_BACKWARD_STAGES,
        *CHUNK_LOOPS,
        *CHUNK_STAGES,
        *ADJOINT_STAGES,
        *GATE_AND_GRAM_STAGES,
        *SEGMENT_SCAN_OPS,
        *MOE_ROUTING_STAGES,
        *MOE_EXPERT_STAGES,
        *MOE_BACKWARD_STAGES,
        *HOST_SIZE_OPS,
    ],
    [
        TileType,
        TileDimAttr,
        TensorType,
        ArgDtypeAttr,
        ShapeSymbolAttr,
        ArgRoleAttr,
        ArgPurposeAttr,
        KernelDotsAttr,
        RegisterDtypeAttr,
        DiagonalRowsAttr,
        LayoutAxisAttr,
        TensorLayoutAttr,
        RuntimeBlockAttr,
        GridAxisAttr,
        LaunchParamAttr,
        StateHomeAttr,
        StateStartAttr,
        MaskAttr,
        GateAnchorAttr,
        GramDiagonalAttr,
        BlockDecayAttr,
        AlongAttr,
        SideAttr,
        LoadedInputAttr,
        TransitionAttr,
        *MOE_EXPERT_ATTRS,
    ],
)
