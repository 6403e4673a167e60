"""The Triton backend: what a scheduled module becomes on the target, run by
k3compile.driver.schedule_for_triton after the pipeline (which ends in outline-kernels).

- legalize.py (legalize-triton) checks that the kernels fit (limits.py) and fixes their block sizes;
- lower.py (lower-to-triton) writes the target's choices into the IR (the dot precision, the
  triangular inverse's form, load dtypes, unrolling): what the printer reads;
- guard_spill_only_stages.py, merge_identical_kernels.py: the backend's own passes, run after
  those, so that kernels whose code agrees once their sizes are fixed are printed and compiled once;
- launch.py reads a kernel's launch config (what a launch table may set) off its op, for the
  printer and the autotuner;
- printer/ prints one block of Triton per op (and a module's context-parallel wrappers);
  runtime/ is the host code every compiled module carries.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from xdsl.passes import ModulePass

# pass name -> (module in k3compile.backends.triton, class): imported only when named; `-p` takes
# them as it takes the pipeline's passes (k3compile.pipeline.available_passes; `k3c ir -p
# ...,legalize-triton,lower-to-triton` shows what the printer reads)
_WHERE = {
    "legalize-triton": ("legalize", "LegalizeTritonPass"),
    "lower-to-triton": ("lower", "LowerToTritonPass"),
    "guard-spill-only-stages": ("guard_spill_only_stages", "GuardSpillOnlyStagesPass"),
    "merge-identical-kernels": ("merge_identical_kernels", "MergeIdenticalKernelsPass"),
}


def _loader(module: str, cls: str) -> Callable[[], type[ModulePass]]:
    return lambda: getattr(importlib.import_module(f"{__name__}.{module}"), cls)


BACKEND_PASSES: dict[str, Callable[[], type[ModulePass]]] = {name: _loader(*where) for name, where in _WHERE.items()}
