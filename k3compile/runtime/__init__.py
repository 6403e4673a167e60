"""Runtime: what runs beside and above the compiled modules (k3compile.ops, the fla-compatible
functions, is this floor's public face and keeps its path).

- serving.py: the hybrid prefix cache (docs/prefix-cache.md);
- autotune/: the schedule search on the GPU and its on-disk cache (docs/autotuning.md);
- stack.py (+ stack_spec, stack_two_phase, stack_pipeline, pipeline_plan, pipeline_plan_cli): a
  Block AttnRes model stack from a `[model]` spec and its pipeline-parallel plan (docs/block-stack.md).
"""
