"""fla's functions, compiled on demand: `from k3compile.ops.kda import chunk_kda` in place of
`from fla.ops.kda import chunk_kda` (and likewise gated_delta_rule, delta_rule, gla).

Each call derives the layer its arguments describe (kind, heads, head dims, state layout, what
the inputs mean), compiles it once — cached in process and on disk under
$K3C_CACHE_DIR/modules/ops (default ~/.cache/k3compile) — and runs the generated module's
`chunk`, `recurrent` or `decode` entry. A new batch size, sequence length, dtype or scale never
recompiles; a warm disk cache imports the module without xDSL. The chunk_* functions are
differentiable (their backward: the layer's derived chunk_backward), and fused_recurrent_* through
the chunk function of the same arguments (not over a state pool).
docs/fla-compat.md maps every keyword of fla-core 0.6.0.

Tuned kernels: a layer's module embeds the winners that `k3c tune` (of a spec of the same layer)
or `with k3compile.ops.tuning():` (the calls' own layers and shapes) cached on this GPU, forward
and backward; an untuned shape runs the heuristic defaults, and nothing is tuned unless asked
(docs/autotuning.md, "k3compile.ops").

Chosen schedules: `with k3compile.ops.pass_options("derive-block-attnres{partials-schedule=columns}"):`
(or $K3C_PASS_OPTIONS) compiles the layers called inside with those passes' options in place of
the defaults (k3compile/ops/pipeline_options.py).
"""

from k3compile.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
from k3compile.ops.gated_delta_rule import (chunk_gated_delta_rule, chunk_gdn, fused_recurrent_gated_delta_rule,
                                            fused_recurrent_gdn)
from k3compile.ops.gla import chunk_gla, fused_recurrent_gla
from k3compile.ops.kda import chunk_kda, fused_recurrent_kda
# k3compile's own, beside fla's functions (not in __all__: `import *` gives fla's names only)
from k3compile.ops.autotuning import tuning
from k3compile.ops.pipeline_options import pass_options

__all__ = [
    "chunk_delta_rule",
    "chunk_gated_delta_rule",
    "chunk_gdn",
    "chunk_gla",
    "chunk_kda",
    "fused_recurrent_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gdn",
    "fused_recurrent_gla",
    "fused_recurrent_kda",
]
