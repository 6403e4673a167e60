"""The public path k3compile.pipeline_plan (docs/block-stack.md before the runtime/ folder), kept for
existing imports: the module is k3compile.runtime.pipeline_plan, and this name is bound to that module
object itself (not a copy)."""

import sys

from k3compile.runtime import pipeline_plan

sys.modules[__name__] = pipeline_plan
