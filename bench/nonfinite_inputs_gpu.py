"""Which output rows one non-finite value in k or v makes non-finite: fla's chunk_kda and
fused_recurrent_kda next to k3compile.ops' (docs/fla-compat.md, "Non-finite inputs").

    python3 bench/nonfinite_inputs_gpu.py                           # the GPU machine, fla-core 0.6.0 installed
    TRITON_INTERPRET=1 python bench/nonfinite_inputs_gpu.py --device cpu --T 40 --token 21   # CPU smoke test

The inputs are finite (fla's layouts: q, k L2-normalised, g a log-decay in [-5, 0), beta in (0, 1))
but for one element, NaN or inf, at token --token of head 0: k's first channel or v's first
column. For each function and case it prints the tokens whose output row of head 0 holds a
non-finite value, as ranges, whether any other head's does, and whether head 0's final state is
finite. A chunked function computes a chunk's outputs from products over the whole chunk, so the
rows before the token in its chunk can turn non-finite too; the token recurrence keeps them.
Without fla (not installed) only k3compile's functions run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import device_name, git_commit, import_fla, short_error  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Non-finite output rows from one NaN or inf in k or v: fla's chunk_kda "
                                            "and fused_recurrent_kda next to k3compile.ops'.")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu (Triton's interpreter)")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                   help="q, k, v, beta's dtype (default bfloat16 on cuda, float32 on cpu: the interpreter computes bf16 wrongly)")
    p.add_argument("--T", type=int, default=256, help="tokens (default 256)")
    p.add_argument("--H", type=int, default=2, help="heads (default 2)")
    p.add_argument("--K", type=int, default=64, help="head key dim (default 64)")
    p.add_argument("--V", type=int, default=64, help="head value dim (default 64)")
    p.add_argument("--token", type=int, default=100,
                   help="the corrupted token (default 100: inside a chunk of 64 and of 16 tokens, not at its start)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 0 <= args.token < args.T:
        p.error(f"--token: expected 0 <= token < T = {args.T}, got {args.token}")
    return args


def token_ranges(rows) -> str:
    """Sorted token indices as ranges: [3, 4, 5, 9] -> '3-5, 9'; none -> '-'."""
    ranges, start = [], None
    for i, row in enumerate(rows):
        if start is None:
            start = row
        if i + 1 == len(rows) or rows[i + 1] != row + 1:
            ranges.append(f"{start}" if start == row else f"{start}-{row}")
            start = None
    return ", ".join(ranges) or "-"


def functions(torch):
    """(name, call(q, k, v, g, beta) -> (o, final_state)) of every function that imports here, and
    notes on the ones that do not."""
    from k3compile.ops.kda import chunk_kda, fused_recurrent_kda

    found, notes = [], []
    try:
        fla_chunk, version, note = import_fla("fla.ops.kda", "chunk_kda")
        fla_recurrent, _, _ = import_fla("fla.ops.kda", "fused_recurrent_kda")
        found += [(f"fla {version} chunk_kda", fla_chunk), (f"fla {version} fused_recurrent_kda", fla_recurrent)]
        notes += [note] if note else []
    except ModuleNotFoundError:
        notes.append("fla not installed: k3compile's functions only")
    found += [("k3compile chunk_kda", chunk_kda), ("k3compile fused_recurrent_kda", fused_recurrent_kda)]
    return found, notes


def inputs(torch, args, device, dtype):
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(args.seed)
    shape = (1, args.T, args.H)

    def randn(*dims):
        return torch.randn(*shape, *dims, generator=gen)

    return dict(q=F.normalize(randn(args.K), dim=-1).to(device, dtype),
                k=F.normalize(randn(args.K), dim=-1).to(device, dtype),
                v=randn(args.V).to(device, dtype),
                g=F.logsigmoid(randn(args.K)).clamp(min=-5).to(device, torch.float32),
                beta=torch.sigmoid(randn()).to(device, dtype))


def main(argv=None) -> int:
    args = parse_args(argv)
    on_cpu = args.device == "cpu"
    if on_cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    dtype = getattr(torch, args.dtype or ("float32" if on_cpu else "bfloat16"))
    clean = inputs(torch, args, args.device, dtype)
    found, notes = functions(torch)
    print(f"device: {device_name(torch, on_cpu)}; torch {torch.__version__}; commit {git_commit()}")
    print(f"B = 1, T = {args.T}, H = {args.H}, K = {args.K}, V = {args.V}, {dtype}; one value at token {args.token} "
          f"of head 0")
    for note in notes:
        print(f"note: {note}")
    print()
    print("| function | input | head 0: non-finite rows | other heads | head 0's final state |")
    print("| --- | --- | --- | --- | --- |")
    cases = [("none", None, None)] + [(f"{name}[{args.token}] = {value}", name, value)
                                      for name in ("k", "v") for value in ("nan", "inf")]
    for label, name, value in cases:
        x = {n: t.clone() for n, t in clean.items()}
        if name is not None:
            x[name][0, args.token, 0, 0] = float(value)
        for function, call in found:
            try:
                with torch.no_grad():
                    o, final = call(**x, output_final_state=True)
            except Exception as err:  # noqa: BLE001 - a function that refuses the input is a result too
                print(f"| {function} | {label} | {short_error(err)} | | |")
                continue
            bad = ~torch.isfinite(o[0].float()).all(-1)  # [T, HV]: a row with any non-finite value
            rows = torch.nonzero(bad[:, 0]).flatten().tolist()
            others = token_ranges(torch.nonzero(bad[:, 1:].any(-1)).flatten().tolist())
            state = "finite" if torch.isfinite(final[0, 0]).all() else "non-finite"
            print(f"| {function} | {label} | {token_ranges(rows)} | {others} | {state} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
