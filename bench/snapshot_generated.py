"""Print every example spec's Triton module under a set of pipelines into a folder, to compare a
refactor's output with the tree before it: `python3 bench/snapshot_generated.py DIR`, then
`python3 bench/snapshot_generated.py --compare DIR_BEFORE DIR_AFTER` (byte-identical, else the
modules' ASTs compared without docstrings and comments; --rename also ignores local names,
each top-level function's on its own)."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

from k3compile.default_pipelines import DEFAULT_PIPELINES, SPECULATIVE_PIPELINE

RECURRENCES = ("kda", "gated_deltanet", "deltanet", "gla")
# (spec, label, replacement of a default pass with options, or a whole pipeline)
VARIANTS = [
    *[(name, "default", None) for name in (*RECURRENCES, "attnres", "latent_moe", "latent_moe_mxfp4")],
    *[(name, "speculative", "+" + SPECULATIVE_PIPELINE) for name in RECURRENCES],
    ("kda", "chunk32", "derive-chunkwise{chunk-size=32}"),
    ("kda", "split_prepare", "fuse-chunkwise{grouping=split-prepare}"),
    ("kda", "fuse_warps", "fuse-chunkwise{block-v=64 num-warps=4 scan-warps=8}"),
    ("kda", "recurrent_bv16", "lower-recurrent{block-v=16}"),
    ("kda", "bwd_spill", "lower-backward{block-v=16 scan-values=spill}"),
    ("kda", "bwd_reload", "lower-backward{block-v=16 gradients-forward=reload}"),
    ("kda", "bwd_value_blocks", "lower-backward{block-v=16 gradients-split=value-blocks}"),
    ("gla", "bwd_spill", "lower-backward{scan-values=spill gradients-forward=reload}"),
    ("kda", "bwd_chunk32", "derive-backward{chunk-size=32}"),
    ("attnres", "columns", "derive-block-attnres{partials-schedule=columns}"),
    ("latent_moe", "warp", "lower-moe-experts{decode=warp warp-slots=2 warp-block-n=16 warp-block-d=32 block-rows=16}"),
    ("latent_moe", "bwd_forms", "derive-moe-backward{glu-adjoint=kernel sorted-wgrad-rows=copy}"),
]


def pipeline_of(kind: str, change: str | None) -> str | None:
    default = DEFAULT_PIPELINES[kind]
    if change is None:
        return None
    if change.startswith("+"):
        return default + "," + change[1:]
    name = change.split("{")[0]
    passes = default.split(",")
    assert name in passes, (name, default)
    return ",".join(change if p == name else p for p in passes)


def snapshot(out: Path) -> None:
    from k3compile.driver import as_spec, lower

    out.mkdir(parents=True, exist_ok=True)
    for name, label, change in VARIANTS:
        spec = as_spec(Path("examples") / f"{name}.toml")
        try:
            source = lower(spec, pipeline_of(spec.kind, change)).source
        except Exception as error:  # a variant a tree does not have: recorded, compared like output
            source = f"# {type(error).__name__}: {error}\n"
        (out / f"{name}__{label}.py").write_text(source)
        print(f"{name:>18} {label:<18} {len(source.splitlines()):>6} lines", flush=True)


class Normalise(ast.NodeTransformer):
    """Docstrings dropped; with rename, every local name replaced by its order of appearance: a
    name the pattern takes (registers, indices), and a name a function binds (a parameter, an
    assignment's target, such as a workspace named after the value it holds). Each top-level
    function numbers its names afresh (`normalised`), so two kernels may name one value alike."""

    def __init__(self, rename: bool, bound: set[str] = frozenset()):
        self.rename, self.names, self.bound = rename, {}, bound

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None
        return self.generic_visit(node)  # a statement's names too (a tl.store's operands)

    def local(self, name: str) -> str:
        if self.rename and (name in self.bound or re.match(r"^[a-z]_|^[A-Za-z]+\d+$|_\d+$", name)):
            return self.names.setdefault(name, f"v{len(self.names)}")
        return name

    def visit_Name(self, node):
        node.id = self.local(node.id)
        return node

    def visit_arg(self, node):
        self.generic_visit(node)
        node.arg = self.local(node.arg)
        return node


def bound_names(node: ast.AST) -> set[str]:
    """The names a top-level function binds: its (and its lambdas') parameters and what it assigns."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    return {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)} | \
        {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def normalised(source: str, rename: bool) -> str:
    nodes = (Normalise(rename, bound_names(node)).visit(node) for node in ast.parse(source).body)
    return "\n".join(ast.dump(node) for node in nodes if node is not None)


def compare(before: Path, after: Path, rename: bool) -> int:
    failed = 0
    for old in sorted(before.glob("*.py")):
        new = after / old.name
        a, b = old.read_text(), new.read_text() if new.exists() else ""
        verdict = "identical" if a == b else "same AST" if normalised(a, rename) == normalised(b, rename) else "DIFFERS"
        failed += verdict == "DIFFERS"
        print(f"{verdict:>9}  {old.name}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--rename", action="store_true")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.dirs, rename=args.rename)
    snapshot(args.dirs[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
