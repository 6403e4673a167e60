"""fla's own op tests run against k3compile.ops: pytest runs fla's test files with the plugin
bench/fla_in_place.py, which puts our chunk_* and fused_recurrent_* in place of fla's, so every
test that calls them checks ours against fla's naive references with fla's tolerances. This is
the one-line swap `fla.ops` -> `k3compile.ops` seen from fla's side. Nothing of fla is kept here:
the tests come from a checkout of flash-linear-attention, fla-core must be importable.

    python bench/fla_suite.py --tests <flash-linear-attention>/tests --out DIR        # on a GPU
    python bench/fla_suite.py --tests ... --out DIR --device cpu -k "T63 or T160"    # interpreter
    python bench/fla_suite.py --tests ... --out DIR --budget-s 300    # tests after 300 s: not run

On the CPU (Triton's interpreter) bf16 runs as on the GPU: the plugin installs
k3compile.checking.interpreter_bf16, which makes the interpreter compute bf16 on values, rounding each op
(stock Triton computes on the raw bits). Writes
DIR/fla_suite.md (the counts and a row per test of ours that did not pass) and DIR/fla_suite.json
(every test: outcome, which of our functions it called, the first error line).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from collections import Counter
import time
from pathlib import Path

BUDGET_SPENT = "k3c: the run's time budget was spent before this test"  # fla_in_place skips with it
DEFAULT_FILES = ("ops/test_kda.py", "ops/test_gdn.py", "ops/test_gla.py", "ops/test_delta.py")


def versions() -> str:
    found = []
    for package in ("torch", "triton", "fla-core"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} missing")
    return ", ".join(found)


def table(records: list[dict], header: str) -> str:
    """The counts, then every test that called k3compile.ops with its outcome (and the first error
    line of those that did not pass), then the tests the time budget left unrun, by name."""
    not_run = [r for r in records if r["message"].endswith(BUDGET_SPENT)]
    ran = [r for r in records if not r["message"].endswith(BUDGET_SPENT)]
    ours = [r for r in ran if r["ours"]]
    counts = Counter(r["outcome"] for r in ours)
    lines = [header, "",
             f"Tests that called k3compile.ops: {len(ours)}: {counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['skipped']} skipped. Tests that ran only fla's own code: {len(ran) - len(ours)}."
             + (f" Not run, the time budget spent: {len(not_run)}." if not_run else ""), ""]
    if ours:
        lines += ["| test | outcome | ours called | first error line |", "|---|---|---|---|"]
        lines += [f"| `{r['test']}` | {r['outcome']} | {', '.join(f'{k} x{n}' for k, n in r['ours'].items())} | "
                  f"{r['message'].replace('|', '/') if r['outcome'] != 'passed' else ''} |" for r in ours]
    if not_run:
        lines += ["", "Not run (the time budget spent):", *(f"- `{r['test']}`" for r in not_run)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, required=True, help="the tests folder of a flash-linear-attention checkout")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--files", nargs="*", default=list(DEFAULT_FILES), help="test files, relative to --tests")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("-k", dest="keyword", default="", help="pytest -k expression")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="start no test after this many seconds (0: no limit); the rest are tabled as not run")
    args = parser.parse_args(argv)
    tests = args.tests.resolve()
    missing = [f for f in args.files if not (tests / f).is_file()]
    if missing or not (tests / "conftest.py").is_file():
        print(f"fla_suite: {tests} is not fla's tests folder (missing {', '.join(missing) or 'conftest.py'})",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    records_path = args.out.resolve() / "fla_suite.json"
    keyword = args.keyword
    env = dict(os.environ, K3C_FLA_RECORDS=str(records_path), K3C_FLA_DEVICE=args.device,
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]))
    if args.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    if args.budget_s > 0:
        env["K3C_FLA_DEADLINE"] = str(time.time() + args.budget_s)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "fla_in_place", "-p", "no:cacheprovider", "-W", "ignore",
               *(str(tests / f) for f in args.files), *(["-k", keyword] if keyword else [])]
    # from the checkout's root: fla's conftest (NaN-filled torch.empty) applies as in fla's CI
    finished = subprocess.run(command, cwd=tests.parent, env=env)
    if not records_path.is_file():
        print(f"fla_suite: pytest wrote no records (exit {finished.returncode})", file=sys.stderr)
        return 1
    records = json.loads(records_path.read_text())
    header = (f"# fla's own tests against k3compile.ops\n\n{versions()}; device {args.device}; "
              f"files {', '.join(args.files)}{f'; -k {keyword!r}' if keyword else ''}.\n"
              f"Command: `python bench/fla_suite.py --tests <flash-linear-attention>/tests --out DIR"
              f"{f' --device {args.device}' if args.device != 'cuda' else ''}"
              f"{f' -k {args.keyword!r}' if args.keyword else ''}{f' --budget-s {args.budget_s:g}' if args.budget_s else ''}`")
    text = table(records, header)
    (args.out / "fla_suite.md").write_text(text)
    print(text)
    return 0 if all(r["outcome"] != "failed" for r in records if r["ours"]) else 1


if __name__ == "__main__":
    sys.exit(main())
