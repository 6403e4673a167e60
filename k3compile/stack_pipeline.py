"""The public path k3compile.stack_pipeline (docs/block-stack.md before the runtime/ folder), kept for
existing imports: the module is k3compile.runtime.stack_pipeline, and this name is bound to that module
object itself (not a copy)."""

import sys

from k3compile.runtime import stack_pipeline

sys.modules[__name__] = stack_pipeline
