"""The public path k3compile.stack (README.md, docs/block-stack.md before the runtime/ folder), kept for
existing imports: the module is k3compile.runtime.stack, and this name is bound to that module
object itself (not a copy)."""

import sys

from k3compile.runtime import stack

sys.modules[__name__] = stack
