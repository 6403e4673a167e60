"""Block AttnRes's phase 1 forward (`block_partials`) compiled for sm_90 on a machine without a
GPU, per derive-block-attnres form: registers, spills, shared memory, the programs an SM holds
(by registers and shared memory), the SASS loop bodies' sizes, and from them the instructions
issued per token row and the issue time at T rows (an H100 SXM's 132 SMs x 4 schedulers at
1.755 GHz), next to the bytes the form moves (the HBM floor at 3.0 TB/s). Offline figures: what
a kernel costs before any device time, not a measurement.

    .venv/bin/python bench/block_attnres_sm90.py [--hidden 8192 --queries 16] [--forms columns,query-blocks]

Forms: `columns` (derive-block-attnres{partials-schedule=columns}; any of its
options after a colon, e.g. `columns:columns-rows=2 block-columns=64`) and `query-blocks` (the
kernel before). Pointers are bf16 (block_lse fp32), R = 8192 token rows (16-divisible, as the
launch specialises it); use the device's Triton version for shared-memory figures that match it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sm90_resources import sass_loops  # noqa: E402

SMS, SCHEDULERS, CLOCK = 132, 4, 1.755e9  # H100 SXM under load
REGISTERS, SHARED = 65536, 228 * 1024  # per SM
HBM = 3.0e12  # bytes/s: the floor's rate


def compile_form(hidden: int, form: str, folder: Path):
    """The layer (K3's 8 blocks) compiled with derive-block-attnres in `form`."""
    from k3compile.driver import compile as compile_layer
    from k3compile.spec import spec_from_table

    schedule, _, options = form.partition(":")
    opts = " ".join([f"partials-schedule={schedule}", *options.split()])
    pipeline = f"fuse-attnres,derive-block-attnres{{{opts}}},outline-kernels"
    name = f"sm90_{schedule.replace('-', '_')}_{abs(hash(form)) % 10 ** 6}"
    table = dict(name=name, kind="attnres", hidden_size=hidden, num_blocks=8, block_size=12, eps=1e-6)
    layer = compile_layer(spec_from_table(table, source="<bench>"), out_dir=folder, pipeline=pipeline)
    return layer, folder / f"{name}.py"


def launch_constants(source: str, kernel: str) -> tuple[dict[str, int], int, int]:
    """The integer constants, num_warps and num_stages printed at the kernel's launch."""
    at = source.index(f"{kernel}[grid](")
    start = source.rindex("\ndef ", 0, at)
    before = source[max(start, source.rfind("[grid](", start, at)):at]  # since the entry's previous launch
    values = {k: int(v) for k, v in re.findall(r"^\s+(\w+) = (\d+)$", before, flags=re.M)}
    after = source[at:source.index(")\n", at)]
    warps = int(re.search(r"num_warps=(\d+)", after).group(1))
    stages = re.search(r"num_stages=(\d+)", after)
    return values, warps, int(stages.group(1)) if stages else 3


def compile_kernel(module_path: Path, kernel: str, queries: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location(module_path.stem, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = module_path.read_text()
    values, warps, stages = launch_constants(source, kernel)
    if "BQ" in getattr(module, kernel).arg_names and "BQ" not in values:  # all the call's queries
        values["BQ"] = max(16, triton.next_power_of_2(queries)) if "columns" in kernel else \
            triton.next_power_of_2(queries)
    fn = getattr(module, kernel)
    signature, constexprs, attrs = {}, {}, {}
    for index, arg in enumerate(fn.arg_names):
        if arg in values:
            signature[arg], constexprs[(index,)] = "constexpr", values[arg]
        elif arg in ("S", "Q"):
            signature[arg] = "i32"
        elif arg == "R":
            signature[arg] = "i32"
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[arg] = "*fp32" if arg in ("block_lse", "block_max", "block_normaliser",
                                                "block_numerator") else "*bf16"
            attrs[(index,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        Path(cubin).write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([f"{tools}/cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([f"{tools}/cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    shared = compiled.metadata.shared
    threads = 32 * warps
    per_sm = min(REGISTERS // (registers * threads), SHARED // max(shared, 1), 64 // warps)
    return dict(values=values, warps=warps, stages=stages, registers=registers, shared=shared, per_sm=per_sm,
                spills=sass.count("STL") + sass.count("LDL"), loops=sass_loops(sass),
                instructions=len(re.findall(r"/[*][0-9a-f]{4,}[*]/", sass)))


def issue_per_row(kernel: str, figures: dict, hidden: int, queries: int, n: int) -> float:
    """Warp instructions issued per token row: each loop body's SASS size x warps x its trips a
    program / the program's rows, plus the code outside the loops once a program (all of it, an
    upper bound: the rare rescan's too). columns: sweep 1 and sweep 2 cdiv(D, BD) trips each;
    query-blocks: the source loop n trips, cdiv(Q, BQ) programs a row."""
    v, warps, loops = figures["values"], figures["warps"], figures["loops"]
    outside = figures["instructions"] - sum(loops)
    if "columns" in kernel:
        trips = -(-hidden // v["BD"])
        return ((loops[0] + loops[-1]) * trips + outside) * warps / v["BR"]
    programs = -(-queries // v["BQ"])
    return (loops[0] * n + outside) * warps * programs / v.get("BR", 1)


def bytes_per_row(kernel: str, hidden: int, queries: int, n: int, reread: bool) -> int:
    """HBM bytes per token row (bf16 rows, fp32 log-sum-exps): the representatives (twice in the
    columns form when its second read misses L2) and the Q mixes written."""
    rows = n * (2 if reread and "columns" in kernel else 1)
    return rows * hidden * 2 + queries * (hidden * 2 + 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--forms", default="columns,query-blocks",
                        help="comma-separated; options of a columns form after ':' (space-separated)")
    args = parser.parse_args()
    T, D, Q = args.tokens, args.hidden, args.queries
    print(f"D = {D}, Q = {Q}, T = {T}; issue time: {SMS} SMs x {SCHEDULERS} schedulers at {CLOCK / 1e9} GHz; "
          f"HBM floor at {HBM / 1e12} TB/s")
    with tempfile.TemporaryDirectory() as tmp:
        for form in args.forms.split(","):
            layer, path = compile_form(D, form, Path(tmp))
            source = path.read_text()
            for kernel in re.findall(r"^def (\w*block_partials\w*_kernel)\(", source, flags=re.M):
                f = compile_kernel(path, kernel, Q)
                print(f"{form} {kernel}: {f['warps']} warps, {f['stages']} stages, {f['values']}: "
                      f"registers {f['registers']}, spills {f['spills']}, shared {f['shared']} B, "
                      f"{f['per_sm']} programs an SM, loops (SASS instructions a trip) {f['loops']}")
                if "fold" in kernel:
                    continue
                for n in (1, 2, 4, 8):
                    issue = issue_per_row(kernel, f, D, Q, n) * T / (SMS * SCHEDULERS * CLOCK) * 1e3
                    hit, miss = (bytes_per_row(kernel, D, Q, n, r) * T / HBM * 1e3 for r in (False, True))
                    floor = f"{hit:.3f}" + (f"-{miss:.3f}" if miss != hit else "")
                    print(f"    n = {n}: issue {issue:.3f} ms, HBM floor {floor} ms")


if __name__ == "__main__":
    main()
