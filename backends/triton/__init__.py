"""The Triton backend: its passes (legalize.py, lower.py), the printer and the runtime prelude."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from xdsl.passes import ModulePass

# the backend's passes by name, imported when a pipeline names them (`k3c ir -p ...,lower-to-triton`
# shows what the printer reads); a compile runs them after the pipeline (driver.schedule_for_triton)
_WHERE = {
    "legalize-triton": ("legalize", "LegalizeTritonPass"),
    "lower-to-triton": ("lower", "LowerToTritonPass"),
}


def _loader(module: str, cls: str) -> Callable[[], type[ModulePass]]:
    return lambda: getattr(importlib.import_module(f"k3compile.backends.triton.{module}"), cls)


BACKEND_PASSES: dict[str, Callable[[], type[ModulePass]]] = {name: _loader(*where) for name, where in _WHERE.items()}
