"""The `k3s` schedule dialect: how a layer runs, as Python entry points launching kernels of stages.

A lowered module is a list of entries:

    k3s.entry @recurrent {                         the Python function of the compiled module
      k3s.tensor_arg @q <shape = "B,T,4,64", ...>  its arguments, with shapes and dtype classes
      k3s.kernel @kda_recurrent <...> {            one Triton kernel it launches
        k3s.state_tile ...                         stages, in program order; nested loops are
        k3s.token_loop { k3s.decay ... }           region ops
      }
    }

Passes in passes/ build these from `k3` ops; the Triton backend prints one block of code per
stage. Shape strings use the symbols B (batch), T (tokens per sequence), N (sequences: B, or
len(cu_seqlens) - 1), R (rows), S (sources), P (state pool rows) and NC (per-chunk slots of a
chunk entry: cdiv(B T, C) + N, enough for every chunk of any varlen split); everything else is a
number.
"""

from xdsl.ir import Dialect

from k3compile.ir.k3s.attnres import *  # noqa: F403
from k3compile.ir.k3s.chunk import *  # noqa: F403
from k3compile.ir.k3s.core import *  # noqa: F403
from k3compile.ir.k3s.segments import *  # noqa: F403
from k3compile.ir.k3s.token import *  # noqa: F403

K3S = Dialect(
    "k3s",
    [
        EntryOp,
        TensorArgOp,
        ScalarArgOp,
        CheckpointArgOp,
        SpeculativeOp,
        CacheUpdateOp,
        ReplayOp,
        SnapshotStateOp,
        RestoreSnapshotOp,
        KernelOp,
        StateTileOp,
        TokenLoopOp,
        NextTokenOp,
        LoadTokenOp,
        DecayOp,
        DeltaCorrectOp,
        Rank1UpdateOp,
        ReadoutOp,
        StoreStateOp,
        FoldQueryOp,
        SourceLoopOp,
        NextSourceOp,
        LoadSourceOp,
        RmsScoreOp,
        OnlineSoftmaxOp,
        MixAccumulateOp,
        NormalizeStoreOp,
        *CHUNK_STAGES,
        *SEGMENT_SCAN_OPS,
    ],
    [
        TileType,
        ArgDtypeAttr,
        ArgRoleAttr,
        TokenTensorAttr,
        KernelDotsAttr,
        StateHomeAttr,
        StateStartAttr,
        MaskAttr,
        GateAnchorAttr,
        GramDiagonalAttr,
        BlockDecayAttr,
        SpilledAttr,
        TransitionAttr,
    ],
)
