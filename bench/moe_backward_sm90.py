"""The LatentMoE backward's kernels at K3's expert-parallel shard (examples/latent_moe.toml's
widths, --experts local experts, top-16) compiled for sm_90 on a machine without a GPU, per
derive-moe-backward variant: registers, spills, shared memory, the programs an SM holds (by
registers, shared memory and warps), the SASS loop bodies' sizes and what the main loop's body
holds (asynchronous 16-byte loads, shared-memory loads and stores, fp32 multiplies, wgmma),
beside each kernel's flop, DRAM bytes, L2-to-SM operand bytes and floor at --tokens tokens
(bench/moe_backward_roofline.py, under the same options). Offline figures: what a kernel costs
before any device time, not a measurement.

    .venv/bin/python bench/moe_backward_sm90.py --variants 'default:;kernel:glu-adjoint=kernel' \\
        [--kernels expert_,shared_down] [--tflops 736 --tbps 3.0]

Variants as bench/moe_train_gpu.py's --variants ('NAME:OPTIONS;...'); use the device's Triton
version for shared-memory figures that match it (the H200 runs 3.6).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from entry_sm90 import compile_sm90, entry_source, launches, pointer_dtypes  # noqa: E402
from moe_backward_roofline import Shard, floor_ms, kernels, l2_bytes  # noqa: E402

REGISTERS, SHARED, WARPS = 65536, 227 * 1024, 64  # an sm_90 SM's registers, shared memory a CTA may use, warps
SPEC = Path(__file__).resolve().parent.parent / "examples/latent_moe.toml"
# the main loop's instructions that say where its operands go: 16-byte asynchronous copies to
# shared memory (a gather's rows too), shared-memory loads and stores (an operand that passes
# through registers), fp32 multiplies (a scale applied in registers), wgmma
LOOP_OPS = ("LDGSTS.E.BYPASS.128", "LDS", "STS", "FMUL", "HGMMA")


def programs_per_sm(registers: int, shared: int, warps: int) -> int:
    """CTAs an SM holds by registers (allocated in 8s a thread), shared memory and warps."""
    by_registers = REGISTERS // (-(-registers // 8) * 8 * 32 * warps)
    return min(by_registers, SHARED // shared if shared else WARPS, WARPS // warps)


def loop_mix(sass: str, loop_size: int) -> dict[str, int]:
    """The counts of LOOP_OPS in the SASS loop body of `loop_size` instructions (the largest)."""
    lines = sass.splitlines()
    for at, line in enumerate(lines):
        match = re.search(r"/\*([0-9a-f]{4,})\*/.*?BRA\s+0x([0-9a-f]+)", line)
        if match and (int(match.group(1), 16) - int(match.group(2), 16)) // 16 + 1 == loop_size:
            start, end = int(match.group(2), 16), int(match.group(1), 16)
            break
    else:
        return {}
    ops = collections.Counter()
    for line in lines:
        address = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if address and start <= int(address.group(1), 16) <= end:
            ops[address.group(2)] += 1
    return {op: sum(n for name, n in ops.items() if name == op or name.startswith(op + ".")) for op in LOOP_OPS}


def compile_variant(key, name: str, options: str, folder: Path) -> Path:
    from k3compile.driver import compile as compile_layer
    from k3compile.spec import spec_from_table

    table = key.table() | {"name": f"{key.table()['name']}_{name}"}
    pipeline = f"lower-moe-routing,lower-moe-experts,derive-moe-backward{{{options}}},outline-kernels"
    compile_layer(spec_from_table(table, source=f"<variant {name}>"), out_dir=folder, pipeline=pipeline)
    return folder / f"{table['name']}.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="default:", help="'NAME:derive-moe-backward options;...'")
    parser.add_argument("--kernels", default="", help="only kernels whose name contains one of these (comma-separated)")
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--tflops", type=float, default=736.0, help="the bf16 GEMM rate of the floors")
    parser.add_argument("--tbps", type=float, default=3.0, help="the DRAM bandwidth of the floors")
    args = parser.parse_args()
    from k3compile.ops.moe import MoeKey

    key = dataclasses.replace(MoeKey.of(SPEC), num_experts=args.experts)
    print(f"K3's widths, {args.experts} local experts top-{key.top_k}, {args.tokens} tokens; floors at "
          f"{args.tflops:.0f} TFLOP/s and {args.tbps} TB/s; L2: bf16 operand bytes from L2 to the SMs")
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants.split(";"):
            name, _, options = variant.strip().partition(":")
            path = compile_variant(key, name.strip(), options.strip(), Path(tmp))
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            body = entry_source(path.read_text(), "moe_backward")
            dtypes = pointer_dtypes(body)
            shard = Shard.of(key, args.tokens, options.strip())
            costs = {kernel: (flop, nbytes) for kernel, flop, nbytes in kernels(shard)}
            print(f"\n{name} ({options.strip() or 'defaults'})\n\n| kernel | tile | registers | spills | shared KB | "
                  f"programs / SM | loops | main loop: {', '.join(LOOP_OPS)} | GFLOP | DRAM MB | L2 GB | floor ms |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|---|")
            done = set()
            for kernel, values, warps, stages in launches(body):
                if kernel in done or args.kernels and not any(part in kernel for part in args.kernels.split(",")):
                    continue
                done.add(kernel)
                f = compile_sm90(getattr(module, kernel), values, dtypes, warps, stages)
                suffix = kernel.removesuffix("_kernel").rpartition("_backward_")[2]
                flop, nbytes = costs.get(suffix, (None, None))
                mix = loop_mix(f["sass"], max(f["loops"])) if f["loops"] else {}
                blocks = [b for b in ("BM", "BR", "BN", "BD") if b in getattr(module, kernel).arg_names]
                tile = "x".join(str(values[b]) for b in blocks if not (b == "BR" and "BM" in blocks))
                l2 = l2_bytes(shard, suffix, flop) if flop else None
                print(f"| {suffix} | {tile}, {warps} warps, {stages} stages | {f['registers']} | "
                      f"{f['stl'] + f['ldl']} | {f['shared'] / 1024:.0f} | "
                      f"{programs_per_sm(f['registers'], f['shared'], warps)} | {f['loops']} | "
                      f"{', '.join(str(mix.get(op, 0)) for op in LOOP_OPS) if mix else '-'} | "
                      + (f"{flop / 1e9:.0f} | {nbytes / 1e6:.0f} | {'-' if l2 is None else f'{l2 / 1e9:.1f}'} | "
                         f"{floor_ms(flop, nbytes, args.tflops * 1e12, args.tbps * 1e12):.2f} |"
                         if flop is not None else "- | - | - | - |"), flush=True)


if __name__ == "__main__":
    main()
