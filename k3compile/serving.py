"""The public path k3compile.serving (README.md, docs/prefix-cache.md before the runtime/ folder), kept for
existing imports: the module is k3compile.runtime.serving, and this name is bound to that module
object itself (not a copy)."""

import sys

from k3compile.runtime import serving

sys.modules[__name__] = serving
