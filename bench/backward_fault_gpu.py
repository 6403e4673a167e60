"""One compiled module's chunk_backward, launch by launch: which kernel faults, and its code.

Issue 35 item 5: at 5dc7e05..e414847^ `derive-backward{chunk-size=64} + lower-backward{split-gradients=true
block-v=32}` stopped on "an illegal memory access" at its first backward (bench/results/
backward_sweep_options_h200_9eacf4a.md: the sweep's warm step, B1 T64 H32, bf16, CUDA_LAUNCH_BLOCKING=1)
while the interpreter's bounds check found every address inside its tensors. This script loads a
compiled module from a file (compiled at that commit into bench/generated/fault/, which git
ignores: --compile below), builds the sweep's inputs at a shape, runs the
chunk forward (as the sweep's warm did) and chunk_backward once, and launches every Triton kernel
of the module through a wrapper that first compiles it (warmup: its registers, spills, shared
memory and, with --out, its ttgir / ptx / sass in OUT/asm_<tag>/), prints the launch, launches it
and synchronises: a fault names the kernel that made it.

    python3 -P bench/backward_fault_gpu.py --module bench/generated/fault/kda_bounded_c64_split_bv32/kda_bounded.py \
        --shape B1,T64 --out DIR                       # on a GPU
    python3 -P bench/backward_fault_gpu.py --smoke     # CPU, Triton's interpreter, tiny shape, bounds checked

The modules, compiled by the last commit that had the option (f378fa4 = e414847^), in a worktree:

    git worktree add --detach /tmp/wt_split f378fa4
    .venv/bin/python -m pip install --no-deps --target /tmp/site_split /tmp/wt_split
    PYTHONPATH=/tmp/site_split .venv/bin/python -P bench/backward_fault_gpu.py --compile bench/generated/fault

What tells the causes apart (every address of these kernels is int64 and inside its tensor at every
shape the entry accepts; the Python of the bv32 and bv64 modules differs only in BV, so the fault is
in what Triton 3.6 makes of one of the three BV = 32, C = 64 kernels: state_scan, cotangent_scan,
gradients_value_blocks; offline for sm_90 their only new operand forms are wgmma operands with a
64-byte swizzle, and in gradients_value_blocks an N = 32 product split over two warp groups):
    the launch that prints FAULT                  which kernel (CUDA_LAUNCH_BLOCKING=1 as well)
    kda_bounded_c64_bv32 (no cut) faults too      the scans or the value-block loop, not the cut
    kda_bounded_c64_split_bv64 passes             (it did on the H200) the control
    ..._stages1 passes                            the scans' software pipelining (num_stages=2)
    DISABLE_MMA_V3=1 passes                       Triton's Hopper wgmma lowering (mma.sync instead)
    compute-sanitizer memcheck                    the address space (__shared__, __global__, __local__),
                                                  the SASS offset and the generated line

Exit status: 0 when every launch finished, 3 when one raised (the kernel is printed and in
OUT/<tag>.json), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODULE = ROOT / "bench/generated/fault/kda_bounded_c64_split_bv32/kda_bounded.py"
# (folder, gates, derive-backward | lower-backward) as bench/backward_sweep.py at f378fa4 spelled them: the
# faulting variant under both gate forms, and the controls that tell its parts apart
FAULT_VARIANTS = [
    ("kda_bounded_c64_split_bv32", "bounded", "derive-backward{chunk-size=64}|lower-backward{split-gradients=true block-v=32}"),
    ("kda_unbounded_c64_split_bv32", "unbounded", "derive-backward{chunk-size=64}|lower-backward{split-gradients=true block-v=32}"),
    ("kda_bounded_c64_split_bv64", "bounded", "derive-backward{chunk-size=64}|lower-backward{split-gradients=true}"),  # ran on the H200
    ("kda_bounded_c64_bv32", "bounded", "derive-backward{chunk-size=64}|lower-backward{block-v=32}"),  # no cut: never run on a GPU
    ("kda_bounded_c32_split_bv32", "bounded", "derive-backward{chunk-size=32}|lower-backward{split-gradients=true block-v=32}"),
]


def compile_variants(out: Path) -> int:
    """Compile FAULT_VARIANTS with the k3compile on the path (the commit that had split-gradients) into
    out/<folder>/; the layer is backward_sweep.py's layer_table (KDA, H32, K = V = 128, qk_l2norm)."""
    import k3compile
    from k3compile.passes import lower_backward
    from k3compile.pipeline import RECURRENCE_PIPELINE
    from k3compile.spec import spec_from_table

    if "split_gradients" not in Path(lower_backward.__file__).read_text():
        print(f"{k3compile.__file__}: this k3compile has no lower-backward{{split-gradients}} (put the build of "
              f"f378fa4 first on PYTHONPATH)", file=sys.stderr)
        return 2
    for folder, gates, variant in FAULT_VARIANTS:
        derive, lower = variant.split("|")
        pipeline = RECURRENCE_PIPELINE.replace("derive-backward", derive).replace("lower-backward", lower)
        table = {"name": f"kda_{gates}", "kind": "kda", "num_heads": 32, "head_k_dim": 128, "head_v_dim": 128,
                 "qk_l2norm": True}
        if gates == "bounded":
            table.update(gate_input="clamped", gate_lower_bound=-5.0)
        k3compile.compile(spec_from_table(table), out_dir=out / folder, pipeline=pipeline)
        print(f"{out / folder}: {pipeline}", flush=True)
    # the faulting module with its loops unpipelined (every launch's num_stages=2 made 1): the scans' async
    # copies (ttg.async_copy_global_to_local, then local_load into the wgmma operands) go away
    faulting = next((out / FAULT_VARIANTS[0][0]).glob("*.py"))
    text = faulting.read_text()
    unpipelined = out / f"{FAULT_VARIANTS[0][0]}_stages1" / faulting.name
    unpipelined.parent.mkdir(parents=True, exist_ok=True)
    unpipelined.write_text(text.replace("            num_stages=2,\n", "            num_stages=1,\n"))
    print(f"{unpipelined}: {text.count('            num_stages=2,')} launches at num_stages=1", flush=True)
    return 0


def parse_shape(text: str) -> dict:
    """'B4,T4096' or 'B1,T64,H32' (H only checked against the module's) or '4x4096'."""
    if re.fullmatch(r"\d+x\d+", text):
        b, t = text.split("x")
        return {"B": int(b), "T": int(t)}
    shape = {}
    for part in text.split(","):
        m = re.fullmatch(r"([BTH])(\d+)", part.strip())
        if not m:
            raise argparse.ArgumentTypeError(f"shape {text!r}: expected e.g. B4,T4096 or B1,T64,H32")
        shape[m.group(1)] = int(m.group(2))
    if "B" not in shape or "T" not in shape:
        raise argparse.ArgumentTypeError(f"shape {text!r}: needs B and T")
    return shape


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"fault_{path.stem}_{abs(hash(str(path))) % 10**8}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_of(path: Path) -> dict:
    """What the module's text says about its layer: heads and dims, the gate's form, its pipeline."""
    text = path.read_text()
    dims = {}
    for name in ("q", "v", "g", "beta"):
        m = re.search(rf'_check_tensor\("{name}", {name}, "B,T((?:,\d+)*)"', text)
        dims[name] = [int(x) for x in m.group(1).split(",")[1:]] if m else None
    gate_input = re.search(r"gate_input = (\w+)", text.split('"""')[1])
    bound = re.search(r"gate_lower_bound = (-?[\d.]+)|lower_bound = (-?[\d.]+)", text)
    pipeline = re.search(r"^pipeline: (.*)$", text, re.M)
    return {"H": dims["q"][0], "K": dims["q"][1], "HV": dims["v"][0], "V": dims["v"][1],
            "g": dims["g"], "beta": dims["beta"] is not None,
            "gate_input": gate_input.group(1) if gate_input else "log",
            "lower_bound": float(next(x for x in bound.groups() if x)) if bound else -5.0,
            "pipeline": pipeline.group(1) if pipeline else "?"}


def inputs(torch, layer: dict, B: int, T: int, dtype, device, seed: int = 0) -> dict:
    """bench/backward_sweep.py's inputs: q, k, v, g (log-sigmoid, clamped at the bound when the
    layer clamps), beta, initial_state, do, dht."""
    gen = torch.Generator(device=device).manual_seed(seed)
    randn = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    H, K, HV, V = layer["H"], layer["K"], layer["HV"], layer["V"]
    x = {"q": randn(B, T, H, K).to(dtype), "k": randn(B, T, H, K).to(dtype), "v": randn(B, T, HV, V).to(dtype)}
    if layer["g"] is not None:
        g = torch.nn.functional.logsigmoid(randn(B, T, *layer["g"]))
        x["g"] = (g.clamp(min=layer["lower_bound"]) if layer["gate_input"] == "clamped" else g).float()
    x["beta"] = torch.rand(B, T, HV, device=device, generator=gen).to(dtype) if layer["beta"] else None
    x["initial_state"] = 0.1 * randn(B, HV, K, V)
    x["do"], x["dht"] = randn(B, T, HV, V).to(dtype), randn(B, HV, K, V)
    return x


class Traced:
    """A module's kernel whose launches compile first (recording resources and code), print, run and
    synchronise, so that an asynchronous fault is raised at the launch that made it."""

    def __init__(self, name, fn, torch, launches: list, asm_dir: Path | None, interpret: bool):
        self.name, self.fn, self.torch, self.launches = name, fn, torch, launches
        self.asm_dir, self.interpret = asm_dir, interpret

    def __getattr__(self, attr):
        return getattr(self.fn, attr)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            entry = {"kernel": self.name, "grid": list(grid),
                     "constexprs": {k: v for k, v in kwargs.items() if isinstance(v, (int, str, bool))}}
            self.launches.append(entry)
            if not self.interpret:
                self.describe(entry, grid, args, kwargs)
            print(f"launch {len(self.launches)}: {self.name} grid={tuple(grid)} "
                  + " ".join(f"{k}={v}" for k, v in entry.items() if k in ("regs", "spills", "shared")), flush=True)
            started = time.perf_counter()
            try:
                result = self.fn[grid](*args, **kwargs)
                if not self.interpret:
                    self.torch.cuda.synchronize()
            except BaseException as error:
                entry["error"] = f"{type(error).__name__}: {error}"
                print(f"  FAULT in {self.name}: {entry['error']}", flush=True)
                raise
            entry["seconds"] = round(time.perf_counter() - started, 4)
            print(f"  ok ({entry['seconds']} s)", flush=True)
            return result

        return launch

    def describe(self, entry: dict, grid, args, kwargs) -> None:
        """Compile without launching (Triton's warmup) and record what ptxas gave the kernel; its
        ttgir, ptx and sass into asm_dir (the faulting kernel's too: this runs before its launch)."""
        try:
            compiled = self.fn.warmup(*args, grid=grid, **kwargs)
            compiled._init_handles()
            entry.update(regs=compiled.n_regs, spills=compiled.n_spills, shared=compiled.metadata.shared,
                         num_warps=compiled.metadata.num_warps, num_stages=compiled.metadata.num_stages)
            if self.asm_dir is not None:
                self.asm_dir.mkdir(parents=True, exist_ok=True)
                stem = self.asm_dir / f"{self.name}_{'_'.join(str(v) for v in entry['constexprs'].values() if isinstance(v, int))}"
                for key in ("ttgir", "ptx"):
                    if key in compiled.asm:
                        Path(f"{stem}.{key}").write_text(compiled.asm[key])
                try:
                    from triton.tools.disasm import get_sass

                    Path(f"{stem}.sass").write_text(get_sass(compiled.asm["cubin"]))
                except Exception as error:  # cuobjdump missing: the cubin instead
                    Path(f"{stem}.cubin").write_bytes(compiled.asm["cubin"])
                    entry["sass"] = f"not disassembled ({type(error).__name__}: {error}); the cubin kept"
        except Exception as error:  # the launch itself still runs and says what fails
            entry["describe_error"] = f"{type(error).__name__}: {error}"


def trace_kernels(module, torch, launches: list, asm_dir: Path | None, interpret: bool) -> list[str]:
    names = []
    for name in dir(module):
        fn = getattr(module, name)
        if name.endswith("_kernel") and hasattr(fn, "__getitem__") and hasattr(fn, "run"):
            setattr(module, name, Traced(name, fn, torch, launches, asm_dir, interpret))
            names.append(name)
    return names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--module", type=Path, default=DEFAULT_MODULE, help="a compiled module (.py) with chunk_backward")
    p.add_argument("--shape", type=parse_shape, action="append", default=None,
                   help="B and T (H is the module's): B1,T64 (the sweep's warm step, where the fault was seen; "
                        "the default on a GPU) or B4,T4096 (its timed shape). Repeatable: the shapes run in "
                        "order in one process until one fails (same constexprs: compiled once)")
    p.add_argument("--cu-seqlens", default=None, help="comma-separated offsets (B must be 1): varlen input")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="default bf16 (fp32 with --smoke)")
    p.add_argument("--no-forward", action="store_true", help="skip the chunk forward the sweep ran first")
    p.add_argument("--repeat", type=int, default=1, help="backward calls (a probabilistic fault)")
    p.add_argument("--out", type=Path, default=None, help="OUT/<tag>.json (the launches) and OUT/asm_<tag>/")
    p.add_argument("--tag", default=None, help="name of the outputs (default: the module's folder)")
    p.add_argument("--no-asm", action="store_true", help="do not write ttgir / ptx / sass")
    p.add_argument("--smoke", action="store_true",
                   help="CPU: Triton's interpreter (TRITON_INTERPRET=1), fp32, B1 T70 unless --shape, with "
                        "k3compile.checking.interpreter_bounds' checks where importable")
    p.add_argument("--compile", type=Path, default=None, metavar="DIR",
                   help="compile FAULT_VARIANTS into DIR with the k3compile on PYTHONPATH, and stop")
    args = p.parse_args(argv)
    if args.compile is not None:
        return compile_variants(args.compile)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    import torch

    device = "cpu" if interpret else "cuda"
    shapes = args.shape or [{"B": 1, "T": 70} if args.smoke else {"B": 1, "T": 64}]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("fp32" if interpret else "bf16")]
    path = args.module.resolve()
    if not path.is_file():
        print(f"--module {args.module}: no such file (bench/generated/fault/ is not in git: --compile it first, "
              f"as this file's docstring says)", file=sys.stderr)
        return 2
    layer = layer_of(path)
    for shape in shapes:
        if "H" in shape and shape["H"] != layer["H"]:
            print(f"--shape H{shape['H']}: the module's layer has H = {layer['H']} (heads are compiled in)",
                  file=sys.stderr)
            return 2
    tag = args.tag or path.parent.name
    import triton

    report = {"module": str(path), "tag": tag, "layer": layer, "dtype": str(dtype),
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "triton": triton.__version__, "runs": [],
              "env": {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "CUDA_LAUNCH_BLOCKING", "DISABLE_MMA_V3",
                                                     "PYTORCH_NO_CUDA_MEMORY_CACHING", "TRITON_CACHE_DIR")}}
    if interpret:
        try:
            from k3compile.checking import interpreter_bounds

            interpreter_bounds.install()
            report["bounds_check"] = "k3compile.checking.interpreter_bounds installed"
        except Exception as error:
            report["bounds_check"] = f"not installed ({type(error).__name__}: {error})"
    module = load_module(path)
    launches: list = []
    asm_dir = None if (args.out is None or args.no_asm or interpret) else args.out / f"asm_{tag}"
    traced = trace_kernels(module, torch, launches, asm_dir, interpret)
    print(f"module {path} ({len(traced)} kernels traced)\n  pipeline: {layer['pipeline']}\n  "
          f"H{layer['H']} HV{layer['HV']} K{layer['K']} V{layer['V']} {dtype} on {report['device']}, "
          f"torch {torch.__version__}, triton {triton.__version__}"
          + (f"; bounds check: {report['bounds_check']}" if interpret else ""), flush=True)
    status = 0
    for shape in shapes:
        run = {"shape": {**shape, "H": layer["H"]}, "launches": []}
        report["runs"].append(run)
        launches.clear()
        print(f"== B{shape['B']} T{shape['T']}" + (f" cu_seqlens {args.cu_seqlens}" if args.cu_seqlens else ""),
              flush=True)
        phase = "inputs"
        try:
            x = inputs(torch, layer, shape["B"], shape["T"], dtype, device)
            cu = None
            if args.cu_seqlens:
                cu = torch.tensor([int(v) for v in args.cu_seqlens.split(",")], dtype=torch.int32, device=device)
                x["initial_state"] = x["initial_state"][:1].repeat(len(cu) - 1, 1, 1, 1)
                x["dht"] = x["dht"][:1].repeat(len(cu) - 1, 1, 1, 1)
            if not args.no_forward:
                phase = "forward"
                print("chunk (forward):", flush=True)
                module.chunk(x["q"], x["k"], x["v"], x.get("g"), x["beta"], initial_state=x["initial_state"],
                             output_final_state=True, cu_seqlens=cu)
            for i in range(args.repeat):
                phase = f"backward {i + 1}"
                print(f"chunk_backward ({i + 1} of {args.repeat}):", flush=True)
                grads = module.chunk_backward(x["q"], x["k"], x["v"], x.get("g"), x["beta"],
                                              initial_state=x["initial_state"], cu_seqlens=cu, do=x["do"],
                                              dht=x["dht"], output_dh0=True)
                if device == "cuda":
                    torch.cuda.synchronize()
            run["finite"] = {n: bool(torch.isfinite(t.float()).all()) for n, t in
                             zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads) if t is not None}
            print(f"done: every launch finished; gradients finite: {run['finite']}", flush=True)
        except BaseException as error:  # noqa: BLE001 - the report says what stopped it, the exit status too
            status = 3
            failed = next((e["kernel"] for e in reversed(launches) if "error" in e), None)
            run["error"] = {"phase": phase, "kernel": failed, "message": f"{type(error).__name__}: {error}",
                            "traceback": traceback.format_exc(limit=-4)[-1500:]}
            print(f"FAILED in {phase}, kernel {failed}: {type(error).__name__}: {error}", flush=True)
        finally:
            run["launches"] = list(launches)
        if status:
            break  # a fault leaves the CUDA context unusable
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{tag}.json").write_text(json.dumps(report, indent=1, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
