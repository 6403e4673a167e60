"""A kernel's launch config: what a launch table (docs/autotuning.md) may set for it, read off
the k3s.kernel op as schedule_for_triton's passes leave it (legalize-triton fixes block_v; the
passes set num_warps, num_stages, maxnreg). The printer's launch code and the autotuner
(k3compile.runtime.autotune.space.launch_configs) both read it here: neither needs a printer.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from k3compile.ir import k3s

# the kernel properties a launch table sets as the kernel's block-size constexprs: property ->
# constexpr (legalize-triton fixes block_v exactly for the kernels with a chunk or state tile,
# whose code reads BV)
LAUNCH_CONSTANTS = {"block_v": "BV"}


def launch_config(kernel: k3s.KernelOp) -> dict[str, int]:
    """What a launch table may set for `kernel` (its block-size constexprs, num_warps,
    num_stages, maxnreg), with the IR's values: the heuristic default, or a tuned candidate's."""
    config = {name: getattr(kernel, prop).value.data for prop, name in LAUNCH_CONSTANTS.items()
              if getattr(kernel, prop) is not None}
    config["num_warps"] = kernel.num_warps.value.data
    for optional in ("num_stages", "maxnreg"):
        if (value := getattr(kernel, optional)) is not None:
            config[optional] = value.value.data
    return config


def entry_launch_configs(module: ModuleOp, entry_name: str) -> dict[str, dict[str, int]]:
    """kernel name -> launch config of each kernel the entry `entry_name` of `module` runs."""
    entry = next(op for op in module.ops if isinstance(op, k3s.EntryOp) and op.sym_name.data == entry_name)
    return {kernel.sym_name.data: launch_config(kernel) for kernel in k3s.entry_kernels(entry)}
