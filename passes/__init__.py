"""Module passes over the k3/k3s IR, registered by name and imported lazily.

Each pass is one idea, named for what it derives:
- lower-recurrent: k3.recurrence -> a token-by-token schedule with the state on chip;
- lower-decode: the same token stages over a slot-indexed state pool, updated in place;
- fuse-attnres: k3.attnres -> one kernel that scores and mixes each row in a single read;
- derive-chunkwise: k3.recurrence -> its chunkwise (WY/UT) schedule of stages;
- fuse-chunkwise: a chunkwise schedule -> kernels (which stages run together, what is spilled);
- derive-replay: k3.recurrence -> its speculative-decoding schedule (verify with a cache of the
  projected updates, replay of any accepted prefix), proved;
- lower-speculative: that schedule -> a `verify` entry (outputs + cache) and a `commit` entry
  (replay of the accepted tokens into the pool).
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


def _lower_recurrent() -> type[ModulePass]:
    from k3compile.passes.lower_recurrent import LowerRecurrentPass

    return LowerRecurrentPass


def _fuse_attnres() -> type[ModulePass]:
    from k3compile.passes.fuse_attnres import FuseAttnResPass

    return FuseAttnResPass


def _derive_chunkwise() -> type[ModulePass]:
    from k3compile.passes.derive_chunkwise import DeriveChunkwisePass

    return DeriveChunkwisePass


def _fuse_chunkwise() -> type[ModulePass]:
    from k3compile.passes.fuse_chunkwise import FuseChunkwisePass

    return FuseChunkwisePass


def _derive_replay() -> type[ModulePass]:
    from k3compile.passes.derive_replay import DeriveReplayPass

    return DeriveReplayPass


def _lower_decode() -> type[ModulePass]:
    from k3compile.passes.lower_decode import LowerDecodePass

    return LowerDecodePass


def _lower_speculative() -> type[ModulePass]:
    from k3compile.passes.lower_speculative import LowerSpeculativePass

    return LowerSpeculativePass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "lower-recurrent": _lower_recurrent,
    "fuse-attnres": _fuse_attnres,
    "derive-chunkwise": _derive_chunkwise,
    "fuse-chunkwise": _fuse_chunkwise,
    "derive-replay": _derive_replay,
    "lower-decode": _lower_decode,
    "lower-speculative": _lower_speculative,
}
