"""Autotuning of the chunk entry's schedule choices on the GPU, and of the chunk_backward
entry's, with an on-disk cache.

The search spaces are SEARCH_SPACE (the forward, `chunk`) and BACKWARD_SEARCH_SPACE (the
backward, `chunk_backward`, tuned with tune(..., entry="chunk_backward") / `k3c tune --entry`):
tables of pass options that change the entry. For every shape bucket (tune) each candidate
pipeline is compiled, run with NaN-filled outputs (the module's POISON_OUTPUTS) and checked
against the float64 reference (k3compile.ir.reference; the backward's gradients against its
float64 autograd) on a small shape, checked to write every output at the target shape, and only
then timed there; compile failures, out-of-resources and wrong results score infinity and are
reported.
The result of a bucket is cached on disk (TuneCache) under a key of the schedule (the layer's
semantics, not its name, + pipeline), the bucket, the dtype, the GPU, and the triton and
k3compile versions, so a later tune or compile times nothing, and k3compile.ops' module of the
same layer embeds it. compile_tuned() turns cached results into a module: per entry one
kernel code for the module (the chunk size among its choices), and a launch table per bucket
(block sizes, num_warps, num_stages) that the entry's generated launches read.
docs/autotuning.md has the design.

The timer and the GPU name are parameters (defaults: `time_candidate`, `gpu_name`) so that the
CPU tests run the whole search in Triton's interpreter with a fake timer.

    space.py    what is searched: Choice, SEARCH_SPACE, SEGMENTS, Bucket, the candidates
    cache.py    the on-disk cache: TuneCache, its keys, the versions they hold
    measure.py  one candidate: its inputs, the poisoned check against the reference, the timer
    search.py   tune(): the loop over a bucket's candidates
    compile.py  compile_tuned(): a module from the cached records
    moe.py      tune_moe(): a latent_moe layer's dispatch table per token bucket (`k3c tune --tokens`)

The names below are re-exported for `from k3compile.runtime.autotune import X`. A test that replaces
a function patches the submodule that looks it up (tune looks up gpu_name in search.py,
compile_tuned in compile.py), not this package.
"""

from k3compile.runtime.autotune.cache import TuneCache, cache_root, key_digest, key_for
from k3compile.runtime.autotune.compile import ModulePlan, compile_tuned
from k3compile.runtime.autotune.measure import precompile, run_backward
from k3compile.runtime.autotune.search import TuneResult, TuningError, tune
from k3compile.runtime.autotune.space import (
                                              BACKWARD_ENTRY,
                                              BACKWARD_SEARCH_SPACE,
                                              ENTRIES,
                                              SEARCH_SPACE,
                                              SEGMENTS,
                                              Bucket,
                                              Candidate,
                                              Choice,
                                              backward_entry_pipeline,
                                              base_pipeline,
                                              bucket,
                                              candidates,
                                              entry_pipeline,
                                              kernel_code_hash,
                                              launch_configs,
                                              split_pipeline,
                                              tuned_entry_pipeline,
                                              )

__all__ = [
    "BACKWARD_ENTRY",
    "BACKWARD_SEARCH_SPACE",
    "ENTRIES",
    "SEARCH_SPACE",
    "SEGMENTS",
    "Bucket",
    "Candidate",
    "Choice",
    "ModulePlan",
    "TuneCache",
    "TuneResult",
    "TuningError",
    "backward_entry_pipeline",
    "base_pipeline",
    "bucket",
    "cache_root",
    "candidates",
    "compile_tuned",
    "entry_pipeline",
    "kernel_code_hash",
    "key_digest",
    "key_for",
    "launch_configs",
    "precompile",
    "run_backward",
    "split_pipeline",
    "tuned_entry_pipeline",
    "tune",
]
