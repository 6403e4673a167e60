"""Write the autotuner's candidates of examples/kda.toml (both tuned entries) and
examples/latent_moe.toml (its dispatch candidates) with each candidate's launch configs, as
k3compile.runtime.autotune reads them from the IR after the backend's passes, into a JSON file,
to compare a refactor's candidates with the tree before it:
`python3 bench/snapshot_candidates.py FILE`, then `--compare FILE_BEFORE FILE_AFTER`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def snapshot() -> dict:
    from k3compile.runtime import autotune
    from k3compile.driver import as_spec, schedule_for_triton
    from k3compile.ir import k3s
    from k3compile.runtime.autotune.moe import moe_candidates

    result: dict = {}
    kda = as_spec(ROOT / "examples" / "kda.toml")
    for entry in autotune.ENTRIES:
        rows = []
        for cand in autotune.candidates(autotune.base_pipeline(kda, None), entry=entry):
            compilation = schedule_for_triton(kda, cand.pipeline, verify="off")
            rows.append({**cand.to_json(), "launch": autotune.launch_configs(compilation, entry)})
        result[f"kda {entry}"] = rows
    for name, spec in (("kda", kda), ("latent_moe", as_spec(ROOT / "examples" / "latent_moe.toml"))):
        compilation = schedule_for_triton(spec, None, verify="off")  # every entry of the default pipeline
        entries = [op.sym_name.data for op in compilation.scheduled.ops if isinstance(op, k3s.EntryOp)]
        result[f"{name} launch"] = {entry: autotune.launch_configs(compilation, entry) for entry in entries}
    result["latent_moe candidates"] = {tokens: moe_candidates(tokens) for tokens in (1, 16, 256, 4096)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args()
    if not args.compare:
        Path(args.files[0]).write_text(json.dumps(snapshot(), indent=1, sort_keys=True))
        return
    before, after = (json.loads(Path(f).read_text()) for f in args.files)
    if before != after:
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                print(f"differs: {key}")
        sys.exit(1)
    print(f"same: {', '.join(f'{k} ({len(v)})' for k, v in sorted(before.items()))}")


if __name__ == "__main__":
    main()
