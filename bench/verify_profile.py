"""Per-kernel GPU time (torch.profiler) of a speculative module's `verify`, to see where a round's
time goes at serving shapes (e.g. the chunked verify, `lower-speculative{verify=chunked}`).

    k3c compile bench/kda_bench.toml -o bench/generated/chunked \\
        -p 'derive-replay{draft-tokens=16},lower-speculative{verify=chunked}'
    python3 bench/verify_profile.py --module bench/generated/chunked/kda_bench.py [--shapes 256:1,256:8,64:1]

Prints, per B:n (B sequences of a state pool, n tokens a round), the synchronised wall time of
a verify call and torch.profiler's table of the kernels over 5 calls. Standalone: torch and
triton only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import argument_shapes, import_file, make_inputs, wall_then_profile  # noqa: E402


def shapes(text):
    try:
        return [tuple(int(x) for x in item.split(":")) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated B:n pairs, got {text!r}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True, type=Path, help="a generated module with a speculative `verify`")
    parser.add_argument("--shapes", type=shapes, default=shapes("256:1,256:8,64:1"),
                        help="comma-separated B:n (default 256:1,256:8,64:1)")
    parser.add_argument("--calls", type=int, default=5, help="verify calls timed and profiled per shape (default 5)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA device: the profile is of GPU kernels")
    module = import_file(args.module, args.module.stem)
    if not hasattr(module, "verify"):
        sys.exit(f"{args.module}: no `verify` entry (compile with derive-replay,lower-speculative)")
    dims = argument_shapes(module.verify)
    H, K = int(dims["q"][2]), int(dims["q"][3])
    HV, V = int(dims["v"][2]), int(dims["v"][3])
    depth, cache_row = int(dims["cache"][1]), int(dims["cache"][3])
    for B, n in args.shapes:
        if n > depth:
            sys.exit(f"n = {n} exceeds the module's cache depth {depth}")
        inp = make_inputs(torch, B, n, H, HV, K, V, "cuda", 0)
        tokens = {name: inp[name] for name in ("q", "k", "v", "g", "beta")}
        pool, slots = inp["initial_state"].clone(), torch.arange(B, device="cuda")
        cache = torch.zeros(B, depth, HV, cache_row, device="cuda")

        def verify():
            return module.verify(**tokens, state=pool, state_indices=slots, cache=cache)

        wall, prof = wall_then_profile(torch, verify, args.calls)
        wall_ms = wall * 1e3
        print(f"== B={B} n={n}: wall {wall_ms:.3f} ms per verify call")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
