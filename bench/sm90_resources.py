"""Compile a generated module's kernels for sm_90 on a machine without a GPU, with the Triton
(and its bundled ptxas) installed here, and report what decides speed before any device time:
shared memory, registers, spill traffic (STL/LDL), tensor-core instructions, the static
instruction count, and the size of each loop body in SASS.

    python bench/sm90_resources.py bench/generated/kda_h16_clamped.py --num-warps 8 --num-stages 2

Pointer arguments are taken as bf16 except those named in --fp32 (default: the states and g),
and as 16-byte aligned, as the launches on the GPU specialise them. Use the Triton version of
the GPU (3.6 on the H200 machine) for figures that match it: shared memory differs by version.
"""

import argparse
import importlib.util
import os
import re
import subprocess

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

RUNTIME_INTS = {"T", "S", "R"}
FLAGS_TRUE = {"HAS_INITIAL_STATE", "HAS_FINAL_STATE"}
DOT = "bf16"  # the chunked kernels' product precision for bf16 inputs (runtime prelude _DOT_OF_DTYPE)


def sass_loops(sass: str) -> list[int]:
    """Instruction counts of the bodies of backward branches (loops)."""
    sizes = []
    for line in sass.splitlines():
        match = re.search(r"/\*([0-9a-f]{4,})\*/.*?BRA\s+0x([0-9a-f]+)", line)
        if match and int(match.group(2), 16) < int(match.group(1), 16):
            sizes.append((int(match.group(1), 16) - int(match.group(2), 16)) // 16 + 1)
    return sizes


def compile_kernel_sm90(kernel, signature: dict, constexprs: dict, aligned: dict, options: dict) -> tuple:
    """`kernel` compiled for sm_90 here (no GPU): (the compiled kernel, cuobjdump's resource usage,
    its SASS); the cubin, PTX and TTGIR left in /tmp/<kernel name>.*"""
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options=options)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    name = kernel.fn.__name__
    cubin = f"/tmp/{name}.cubin"
    with open(cubin, "wb") as handle:
        handle.write(compiled.asm["cubin"])
    for form in ("ptx", "ttgir"):
        with open(f"/tmp/{name}.{form}", "w") as handle:
            handle.write(compiled.asm[form])
    usage = subprocess.run([f"{tools}/cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
    sass = subprocess.run([f"{tools}/cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
    return compiled, usage, sass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("--num-warps", type=int, default=8)
    parser.add_argument("--num-stages", type=int, default=2)
    parser.add_argument("--fp32", default="initial_state,final_state,g,gamma_C", help="pointer args that are fp32")
    parser.add_argument("--kernels", default="", help="only kernels whose name contains one of these (comma-separated)")
    parser.add_argument("--launch-constants", default="", help="override constexprs, e.g. BV=32")
    parser.add_argument("--maxnreg", type=int, default=None, help="cap the registers per thread (ptxas)")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("generated", args.module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = open(args.module).read()
    fp32 = set(args.fp32.split(","))
    overrides = dict(kv.split("=") for kv in args.launch_constants.split(",") if kv)
    for name in re.findall(r"^def (\w+_kernel)\(", source, flags=re.M):
        if args.kernels and not any(part in name for part in args.kernels.split(",")):
            continue
        kernel = getattr(module, name)
        # the constexpr values printed at the kernel's launch site
        launch = source[source.index(f"{name}[grid]") - 2000 : source.index(f"{name}[grid]")]
        values = {k: int(v) for k, v in re.findall(r"^\s+(\w+) = (\d+)$", launch, flags=re.M)}
        values.update({k: int(v) for k, v in overrides.items()})
        signature, constexprs = {}, {}
        for index, arg in enumerate(kernel.arg_names):
            if arg in values:
                signature[arg], constexprs[(index,)] = "constexpr", values[arg]
            elif arg.startswith("HAS_"):
                signature[arg], constexprs[(index,)] = "constexpr", arg in FLAGS_TRUE
            elif arg == "DOT":
                signature[arg], constexprs[(index,)] = "constexpr", DOT
            elif arg == "scale":
                signature[arg] = "fp32"
            elif arg in fp32:  # a pointer, whatever its name (a backward's S workspace is no source count)
                signature[arg] = "*fp32"
            elif (arg in RUNTIME_INTS or arg == "NSLOTS") and not re.search(rf"tl\.\w+\({arg} \+", kernel.src):
                signature[arg] = "i32"  # NSLOTS: pool rows; a size, unless the kernel addresses it (the S workspace)
            elif arg in ("cu_seqlens", "chunk_table"):
                signature[arg] = "*i32"
            else:
                signature[arg] = "*fp32" if arg in fp32 else "*bf16"
        aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names)
                   if signature[a].startswith("*") or signature[a] == "i32"}
        compiled, usage, sass = compile_kernel_sm90(kernel, signature, constexprs, aligned,
                                             {"num_warps": args.num_warps, "num_stages": args.num_stages,
                                              **({"maxnreg": args.maxnreg} if args.maxnreg else {})})
        registers = re.search(r"REG:(\d+)", usage)
        stack = re.search(r"STACK:(\d+)", usage)
        print(f"{name}: warps {args.num_warps}, stages {args.num_stages}: shared {compiled.metadata.shared} B, "
              f"registers {registers.group(1) if registers else '?'}, stack {stack.group(1) if stack else '?'} B, "
              f"STL {sass.count('STL')}, LDL {sass.count('LDL')}, MMA {sass.count('HMMA') + sass.count('HGMMA')}, "
              f"instructions {len(re.findall(r'/[*][0-9a-f]{4,}[*]/', sass))}, "
              f"loops (instructions per iteration) {sass_loops(sass)}")


if __name__ == "__main__":
    main()
