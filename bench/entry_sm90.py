"""Compile the kernels one entry of a generated module launches for sm_90 without a GPU (as
bench/sm90_resources.py does) with each pointer typed from the entry's docstring (float -> bf16,
float32 -> fp32, index -> int32) and each kernel's constexprs, num_warps and num_stages read off
its launch in that entry; report shared memory, registers, spills (STL/LDL), the tensor-core
instructions by kind (HGMMA: wgmma, Hopper's; HMMA: mma.sync, Ampere's), the asynchronous
global loads (LDGSTS: cp.async; UTMALDG: TMA) and the SASS loop bodies' sizes.

    .venv/bin/python bench/entry_sm90.py /tmp/shard/latent_moe.py moe_backward [--kernels wgrad,dgrad]

A kernel with HMMA and no HGMMA runs its products on Ampere's instructions (about half an
H100's bf16 rate); one whose loop body has no LDGSTS/UTMALDG loads its tiles synchronously (no
software pipeline). Use the device's Triton version for shared-memory figures that match it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90_resources import compile_kernel_sm90, sass_loops  # noqa: E402

POINTER = {"float": "*bf16", "float32": "*fp32", "index": "*i32"}


def entry_source(source: str, entry: str) -> str:
    start = source.index(f"\ndef {entry}(")
    end = source.find("\ndef ", start + 1)
    return source[start:end if end > 0 else len(source)]


def launches(body: str) -> list[tuple[str, dict, int, int]]:
    """(kernel, its integer constexprs, num_warps, num_stages) per launch, in order: the
    constants assigned since the previous launch (the first k3s.launch_by_rows branch's values are
    not taken: the defaults, the ones at the largest row counts, are)."""
    out, constants = [], {}
    for line in body.splitlines():
        if m := re.match(r"^    (\w+) = (\d+)$", line):
            constants[m.group(1)] = int(m.group(2))
        elif m := re.match(r"^    (\w+(?:, \w+)+) = ((?:\d+, )+\d+)$", line):
            constants.update(zip(m.group(1).split(", "), map(int, m.group(2).split(", ")), strict=True))
        elif m := re.match(r"^\s+(\w+_kernel)\[grid\]\($", line):
            out.append([m.group(1), dict(constants), 4, 3])
        elif out and (m := re.match(r"^\s+num_(warps|stages)=(\w+),$", line)):
            value = int(m.group(2)) if m.group(2).isdigit() else constants.get(m.group(2), 4)
            out[-1][2 if m.group(1) == "warps" else 3] = value
    return [tuple(launch) for launch in out]


def compile_sm90(kernel, values: dict[str, int], dtypes: dict[str, str], num_warps: int, num_stages: int) -> dict:
    """Compile one kernel of a generated module for sm_90: its constexprs `values`, its pointers
    typed by `dtypes` (argument -> float / float32 / index), run-time sizes i32. Returns the
    figures (registers, shared, spills, tensor-core and asynchronous-load instructions, loop
    sizes) and the SASS."""
    signature, constexprs = {}, {}
    for index, arg in enumerate(kernel.arg_names):
        if arg == "DOT":
            signature[arg], constexprs[(index,)] = "constexpr", "bf16"
        elif arg in values and arg.isupper():
            signature[arg], constexprs[(index,)] = "constexpr", values[arg]
        elif arg in dtypes:
            signature[arg] = POINTER[dtypes[arg]]
        else:  # a run-time size (R, HS, ...)
            signature[arg] = "i32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names)
               if signature[a].startswith("*")}
    compiled, usage, sass = compile_kernel_sm90(kernel, signature, constexprs, aligned,
                                                {"num_warps": num_warps, "num_stages": num_stages})
    registers = re.search(r"REG:(\d+)", usage)
    return dict(shared=compiled.metadata.shared, registers=int(registers.group(1)) if registers else None,
                stl=len(re.findall(r"\bSTL\b", sass)), ldl=len(re.findall(r"\bLDL\b", sass)),
                hgmma=sass.count("HGMMA"), hmma=sass.count("HMMA"), ldgsts=sass.count("LDGSTS"),
                utmaldg=sass.count("UTMALDG"), instructions=len(re.findall(r"/[*][0-9a-f]{4,}[*]/", sass)),
                loops=sass_loops(sass), sass=sass)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("entry")
    parser.add_argument("--kernels", default="", help="only kernels whose name contains one of these (comma-separated)")
    parser.add_argument("--launch-constants", default="", help="override constexprs, e.g. BN=256")
    parser.add_argument("--num-stages", type=int, default=None, help="override every launch's num_stages")
    parser.add_argument("--pointers", default="", help="override pointer types, e.g. combined_bar=float")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("generated", args.module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    body = entry_source(open(args.module).read(), args.entry)
    dtypes = pointer_dtypes(body)
    dtypes.update(kv.split("=") for kv in args.pointers.split(",") if kv)
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in args.launch_constants.split(",") if kv)}
    done = set()
    for name, values, num_warps, num_stages in launches(body):
        if name in done or (args.kernels and not any(part in name for part in args.kernels.split(","))):
            continue
        done.add(name)
        values = values | overrides
        num_stages = args.num_stages or num_stages
        f = compile_sm90(getattr(module, name), values, dtypes, num_warps, num_stages)
        tiles = ", ".join(f"{k}={v}" for k, v in values.items() if k.startswith("B") and len(k) <= 3)
        print(f"{name} [{tiles}; warps {num_warps}, stages {num_stages}]: shared {f['shared']} B, "
              f"registers {f['registers'] or '?'}, STL {f['stl']}, LDL {f['ldl']}, "
              f"HGMMA {f['hgmma']}, HMMA {f['hmma']}, LDGSTS {f['ldgsts']}, "
              f"UTMALDG {f['utmaldg']}, instructions {f['instructions']}, loops {f['loops']}", flush=True)


def pointer_dtypes(entry_body: str) -> dict[str, str]:
    """Each tensor argument's dtype word (float, float32, index) as the entry's docstring lists it."""
    return dict(re.findall(r"^        (\w+): \[[^\]]*\] (float32|float|index) \(", entry_body, flags=re.M))


if __name__ == "__main__":
    main()
