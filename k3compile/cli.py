"""`k3c`: compile, inspect, transform, verify, prove and tune k3 layers.

Exit codes: 0 ok (a stdout closed early, as by `| head`, included), 1 verification (or a proof,
or every tuning candidate) failed, 2 bad input (spec, IR, pipeline, arguments; one line naming
the problem), 3 an internal error (a bug in k3compile or its toolchain: one line, or with
K3C_TRACEBACK=1 or true its traceback).
Imports of xDSL, torch and triton (seconds together), and of rich and the spec reader, are
deferred to the subcommand that needs them: every function-local import below is one of those,
so `k3c --help` and a usage error answer without loading them.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import re
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from k3compile.arguments import AppendOnce, parse_shape
from k3compile.errors import ArgumentError, IRError, K3Error, UnsupportedError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage errors: one line and the bad-input code, as every bad input
        if option := re.fullmatch(r"argument (\S+): expected one argument", message):
            # argparse takes `--shard -1/2`'s value for an option
            message += f"; a value that starts with '-' is written {option[1]}=VALUE"
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def stdout_console(width: int):
    """A rich console on stdout whose closed pipe (`k3c passes | head -1`) raises BrokenPipeError
    for main (rich's own handling exits 1)."""
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipedConsole(width=width)


def print_timings(timings: list[tuple[str, float]]) -> None:
    for name, seconds in timings:
        print(f"  {name:<24} {seconds * 1e3:8.1f} ms", file=sys.stderr)


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (two integers), got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"expected 0 <= I < N, got {text!r}")
    return index, count


@contextmanager
def progress_bar(console, description: str, *fields: str):
    """A transient rich progress bar (done/total, elapsed, the `fields`), shown from the first
    update(done, total, **fields) on: a run that fails or finishes before it leaves no trace."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Column

    fixed = Column(no_wrap=True)  # the bar and the counts keep their width; the fields are cut to fit
    cut = Column(ratio=1, no_wrap=True, overflow="ellipsis")
    bar = Progress(TextColumn("{task.description}", table_column=fixed), BarColumn(bar_width=20, table_column=fixed),
                   MofNCompleteColumn(table_column=fixed), TimeElapsedColumn(table_column=fixed),
                   *(TextColumn(f"{{task.fields[{name}]}}", table_column=cut) for name in fields),
                   console=console, transient=True, expand=True)
    task = bar.add_task(description, total=None, **dict.fromkeys(fields, ""))

    def update(done: int, total: int, **values: str) -> None:
        bar.update(task, completed=done, total=total, **values)
        if not bar.live.is_started:
            bar.start()

    try:
        yield update
    finally:
        if bar.live.is_started:
            bar.stop()


def run_tune(spec, shape, dtype, args, console, entry="chunk"):
    from k3compile.runtime.autotune import TuneCache, tune

    what = f"{spec.name}{'' if entry == 'chunk' else ' ' + entry} B,T={shape[0]},{shape[1]} {dtype}"
    with progress_bar(console, f"tuning {what}", "best") as update:
        return tune(spec, shape, dtype, pipeline=args.pipeline, cache=TuneCache(args.cache_dir),
                    retune=getattr(args, "retune", False), entry=entry,
                    progress=lambda done, total, best: update(done, total, best=best))


def print_tune_result(spec, shape, dtype, result) -> None:
    from rich.table import Table

    from k3compile.runtime.autotune import Bucket

    key = result.record["key"]
    entry = "" if result.entry == "chunk" else f" {result.entry}"
    where = f"{spec.name}{entry} B,T={shape[0]},{shape[1]} {dtype} (bucket {Bucket(key['heads_bucket'], key['tokens_bucket'])}) on {key['gpu']}"
    cands = result.candidates
    winner, default = result.winner, result.default
    options = list(cands[0].options) if cands else []
    table = Table(title=f"k3c tune {where}{' (cached)' if result.cached else ''}")
    table.add_column("#", justify="right")
    for option in options:
        table.add_column(option, justify="right")
    for column in ("status", "ms", "vs default"):
        table.add_column(column, justify="right" if column != "status" else "left")
    for c in cands:
        status = c.status + (f": {c.detail}" if c.detail and c.status not in ("ok",) and not c.status.startswith("same") else "")
        if winner is not None and c.index == winner.index:
            status = "[bold green]winner[/]"
        elif c.status in ("wrong", "unwritten", "error", "compile error"):
            status = f"[red]{status}[/]"
        speedup = (f"{default.ms / c.ms:.2f}x" if default is not None and default.status == "ok" and c.status == "ok" else "")
        table.add_row(str(c.index), *(str(c.options[o]) for o in options), status,
                      f"{c.ms:.3f}" if c.status == "ok" else "inf" if not c.status.startswith("same") else "", speedup)
    stdout_console(160).print(table)
    if winner is None:
        print(f"no candidate passed for {where}: compiles there use the heuristic default")
    else:
        versus = (f", {default.ms / winner.ms:.2f}x the default's {default.ms:.3f} ms" if default is not None
                  and default.status == "ok" else ", the default failed")
        print(f"winner: {winner.label}: {winner.ms:.3f} ms{versus}")
    stage = result.record.get("segments")
    if stage:  # context parallelism: the winner with every sequence in P segments
        rows = ", ".join(f"P={r['P']} " + (f"{r['ms']:.3f} ms" if r["status"] == "ok" else f"{r['status']} ({r['detail']})")
                         for r in stage["candidates"])
        print(f"segments (chunk(..., segments='auto') uses P={stage['winner']} here): {rows}")
    if result.cached:
        print(f"from the cache: 0 s of tuning, nothing timed ({result.path})")
    else:
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in result.record.get("phases", {}).items())
        print(f"tuned in {result.seconds:.1f} s ({len(cands)} candidates, {result.timed} timed; {phases}); cached at {result.path}")
    for message in result.messages:
        print(f"warning: {message}", file=sys.stderr)


def cmd_tune(args) -> int:
    from rich.console import Console

    from k3compile.spec import load_spec

    spec = load_spec(args.spec)
    if spec.kind == "latent_moe":
        return tune_moe_table(spec, args)
    if not args.shape or args.tokens:
        raise ArgumentError(f"{args.spec}: a {spec.kind} layer is tuned per --shape B,T (--tokens is a latent_moe "
                            "layer's)")
    console = Console(stderr=True)
    failed = 0
    entries = ("chunk", "chunk_backward") if args.entry == "both" else (args.entry,)
    for shape in args.shape:
        for dtype in args.dtype or ["bfloat16"]:
            for entry in entries:
                result = run_tune(spec, shape, dtype, args, console, entry)
                print_tune_result(spec, shape, dtype, result)
                failed += result.winner is None
    return EXIT_FAILED if failed else EXIT_OK


def tune_moe_table(spec, args) -> int:
    """`k3c tune` of a latent_moe spec: its dispatch table's bucket of each --tokens count."""
    from k3compile.runtime.autotune import TuneCache
    from k3compile.runtime.autotune.moe import MOE_TOKENS, moe_table, tune_moe

    if args.shape or args.entry != "chunk":
        raise ArgumentError(f"{args.spec}: a latent_moe layer is tuned per --tokens N (its dispatch table), "
                            "not --shape or --entry")
    cache, records = TuneCache(args.cache_dir), []
    for tokens in args.tokens or MOE_TOKENS:
        for dtype in args.dtype or ["bfloat16"]:
            started = time.perf_counter()
            record = tune_moe(spec, tokens, dtype, pipeline=args.pipeline, cache=cache, retune=args.retune)
            records.append(record)
            print(f"{spec.name} ({spec.source}), {tokens} token(s) {dtype}:")
            for candidate in record["candidates"]:
                result = f"{candidate['ms']:.3f} ms" if candidate["status"] == "ok" else \
                    f"{candidate['status']} ({candidate['detail']})"
                print(f"  {candidate['options']['dispatch']:<24} {result}")
            winner = record["winner"]
            print("winner: " + (record["candidates"][winner]["options"]["dispatch"] if winner is not None
                                else "none (no candidate passed)")
                  + f" ({time.perf_counter() - started:.1f} s; cached at {cache.path(record['key'])})")
    print(f"dispatch table: {moe_table(records) or 'none'} (`k3c compile` and k3compile.ops embed it)")
    return EXIT_FAILED if any(record["winner"] is None for record in records) else EXIT_OK


def cmd_compile(args) -> int:
    from k3compile.runtime.autotune import TuneCache, compile_tuned
    from k3compile.driver import write_module
    from k3compile.spec import load_spec

    start = time.perf_counter()
    if args.output is not None and not args.output.strip():
        raise ArgumentError("-o: expected an output directory, got an empty path")
    if args.dtype and not args.shape:
        raise ArgumentError("--dtype is the input dtype of --shape (the shapes to tune for); give --shape B,T too")
    mode = "off" if args.no_autotune else "frozen" if args.frozen else "auto"

    def tune_missing(spec, shape, dtype):
        from rich.console import Console

        result = run_tune(spec, shape, dtype, args, Console(stderr=True))
        print_tune_result(spec, shape, dtype, result)
        return result

    compilation, plan = compile_tuned(load_spec(args.spec), args.pipeline, mode=mode, gpu=args.gpu, shapes=args.shape or (),
                                      dtypes=args.dtype or ["bfloat16"], cache=TuneCache(args.cache_dir),
                                      tune_missing=tune_missing)
    for message in plan.messages:
        print(f"k3c compile: note: {message}", file=sys.stderr)
    if plan.records:
        # a recurrence's chunk buckets, or a latent_moe layer's token buckets (its dispatch table's records)
        buckets = len(plan.launch_tables.get("chunk", {})) or len(plan.records)
        print(f"k3c compile: tuned configs for {buckets} bucket(s) embedded ({plan.pipeline})", file=sys.stderr)
    if args.stdout:  # the module itself, e.g. for FileCheck tests of the printed Triton
        sys.stdout.write(compilation.source)
    else:
        print(write_module(compilation, Path(args.output)))
    if args.timing:
        print("pass timings:", file=sys.stderr)
        print_timings(compilation.timings)
        print(f"  {'total':<24} {(time.perf_counter() - start) * 1e3:8.1f} ms", file=sys.stderr)
    return EXIT_OK


def print_module(module_text: str, generic: bool) -> str:
    if not generic:
        return module_text
    from xdsl.parser import Parser
    from xdsl.printer import Printer

    from k3compile.ir.dialects import make_context

    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(Parser(make_context(), module_text).parse_module())
    return stream.getvalue()


def cmd_ir(args) -> int:
    from k3compile.driver import schedule
    from k3compile.spec import load_spec

    spec = load_spec(args.spec)
    # the spec's IR alone, unless a pipeline is asked for: -p (the IR after it) or --after-all
    pipeline = args.pipeline if args.pipeline is not None or args.after_all else ""
    compilation = schedule(spec, pipeline, keep_snapshots=args.after_all)
    if args.after_all:
        print(f"// -----// IR of spec {spec.source} //----- //")
        print(print_module(compilation.layer_ir, args.generic))
        for name, text in compilation.run.snapshots:
            print(f"\n// -----// IR after {name} //----- //")
            print(print_module(text, args.generic))
    else:
        print(print_module(str(compilation.scheduled), args.generic))
    if args.timing:
        print_timings(compilation.timings)
    return EXIT_OK


def parse_ir(text: str, source: str):
    from k3compile.ir.dialects import make_context
    from xdsl.parser import Parser
    from xdsl.utils.exceptions import ParseError, VerifyException

    try:
        module = Parser(make_context(), text, name=source).parse_module()
        module.verify()
    except ParseError as err:
        loc = err.span.get_location()
        raise IRError(f"{loc}: {err.msg}") from None
    except VerifyException as err:
        raise IRError(f"{source}: {str(err).splitlines()[0]}") from None
    except Exception as err:  # xDSL reports unknown dialects etc. as plain exceptions
        raise IRError(f"{source}: {str(err).splitlines()[0]}") from None
    return module


def cmd_opt(args) -> int:
    from k3compile.pipeline import run_pipeline

    source = "<stdin>" if args.file == "-" else args.file
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except OSError as err:
        raise IRError(f"{source}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise IRError(f"{source}: not UTF-8 text (byte {err.start}); expected IR (.mlir)") from None
    module = parse_ir(text, source)
    run = run_pipeline(module, args.passes or "")
    if args.timing:
        print_timings(run.timings)
    print(print_module(str(module), args.generic))
    return EXIT_OK


def cmd_passes(args) -> int:
    from rich.table import Table

    from k3compile.pipeline import DEFAULT_PIPELINES, available_passes

    table = Table(title="k3c passes: what `-p` takes (pass{option=value ...}), options at their defaults")
    for column in ("pass", "options", "what it does"):
        table.add_column(column)
    for name, load in available_passes().items():
        pass_type = load()
        options = " ".join(f"{f.name.replace('_', '-')}={f.default}" for f in dataclasses.fields(pass_type))
        table.add_row(name, options or "-", (pass_type.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "))
    console = stdout_console(160)
    console.print(table)
    for kind, pipeline in DEFAULT_PIPELINES.items():
        shown = pipeline or "none (no kernels: torch runs the layer)"
        console.print(f"default pipeline of kind {kind}: {shown}", highlight=False, soft_wrap=True)
    return EXIT_OK


def cmd_verify(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from k3compile.spec import load_spec
    from k3compile.checking.verify import defaults, grid, verify

    spec = load_spec(args.spec)
    with progress_bar(Console(stderr=True), f"verifying {spec.name}", "case") as update:
        results = verify(
            spec, device=args.device, dtypes=args.dtype, seed=args.seed, shard=args.shard, quick=args.quick,
            progress=lambda done, total, case: update(done, total, case=case),
        )
    title = f"k3c verify {args.spec}" + (" --quick (one case per entry)" if args.quick else "")
    if args.shard:
        index, count = args.shard
        device, dtypes = defaults(args.device, args.dtype)
        total = len(grid(spec, device != "cpu", dtypes, args.quick))
        title += f" (shard {index}/{count}: {len(range(index, total, count))} of {total} cases)"
    table = Table(title=title)
    for column in ("layer", "entry", "case", "dtype", "tensor", "max abs err", "RMS ratio", "tolerance", "result"):
        table.add_column(column, justify="right" if column in ("max abs err", "RMS ratio", "tolerance") else "left")
    for r in results:
        table.add_row(r.layer, r.entry, r.case, r.dtype, r.tensor, f"{r.max_abs:.2e}", f"{r.rms_ratio:.2e}",
                      f"{r.tolerance:.0e}", "pass" if r.passed else "[bold red]FAIL[/]")
    stdout_console(160).print(table)
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_prove(args) -> int:
    from rich.table import Table

    from k3compile.passes.fuse_chunkwise import GROUPINGS
    from k3compile.checking.prove import (check_chunk_size, prove_backward, prove_chunked_verify, prove_chunkwise,
                                          prove_fused_chunkwise, prove_input_forms, prove_replay,
                                          prove_saved_forward_values, prove_segment_scan, prove_spec_step)
    from k3compile.spec import load_spec

    spec = load_spec(args.spec)
    if not spec.is_recurrence:
        raise UnsupportedError(f"{args.spec}: kind '{spec.kind}' has no derived schedule to prove")
    sizes = args.chunk_size or [3, 16, 32, 64]
    for size in sizes:  # all before the first proof: a bad size fails at once, not after minutes of the others
        check_chunk_size(size)
    results = [r for size in sizes for r in prove_chunkwise(spec, size, seed=args.seed)]
    # the kernels fuse-chunkwise makes of it, every grouping (the schedule is the same at every size)
    results += [r for grouping in GROUPINGS for r in prove_fused_chunkwise(spec, min(sizes), grouping, seed=args.seed)]
    results += prove_replay(spec, args.draft_tokens, seed=args.seed)
    results += prove_spec_step(spec, args.draft_tokens, seed=args.seed)
    results += prove_chunked_verify(spec, args.draft_tokens, seed=args.seed)  # lower-speculative{verify=chunked}
    results += prove_spec_step(spec, args.draft_tokens, seed=args.seed, verify="chunked")
    results += prove_segment_scan(spec, min(sizes), seed=args.seed)
    # derive-backward's gradients at every size: the default lengths at the smallest, one length
    # (two chunks, the second partial) at the others, as sympy's exact solves of C x C tiles are
    # slow at C = 64 (some 6 s a run)
    results += [r for size in sizes for r in prove_backward(
        spec, size, lengths=None if size == min(sizes) else (size + size // 2 + 1,), seed=args.seed)]
    # and the stores' chain rules, from the cotangents of the loads' results to the raw inputs'
    # gradients (symbolic: the same at every size)
    results += prove_input_forms(spec, min(sizes))
    # what the saving forward hands to the backward equals what the backward would recompute
    results += prove_saved_forward_values(spec, min(sizes), seed=args.seed)
    table = Table(title=f"k3c prove {args.spec}: derived schedules == token recurrence (backward: its derivative), "
                        "exact rationals (K=2, V=3); the stores' chain rules symbolic")
    # a backward schedule's outputs are the inputs' gradients, its state h0's (dh0)
    for column in ("schedule", "T", "outputs / grads", "final state / dh0", "result"):
        table.add_column(column)
    for r in results:
        table.add_row(r.schedule, "-" if r.length is None else str(r.length),
                      {None: "-", True: "equal", False: "DIFFER"}[r.outputs_equal],
                      {None: "-", True: "equal", False: "DIFFER"}[r.state_equal],
                      "proved" if r.holds else f"[bold red]FAILED[/] {r.first_mismatch}")
    stdout_console(140).print(table)
    failed = sum(not r.holds for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="k3c", description="k3compile: Kimi K3-style layers -> Triton kernels")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    p = sub.add_parser("compile", help="compile a layer spec to a standalone Python module of Triton kernels")
    p.add_argument("spec", help="layer spec (.toml)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-o", "--output", help="output directory (gets <name>.py)")
    where.add_argument("--stdout", action="store_true", help="print the module instead of writing it")
    p.add_argument("-p", "--pipeline", help="pass pipeline, e.g. 'lower-recurrent{block-v=64}' (default: the kind's)")
    p.add_argument("--timing", action="store_true", help="print how long each pass took")
    tuning = p.add_mutually_exclusive_group()
    tuning.add_argument("--no-autotune", action="store_true", help="the heuristic default schedule, ignoring the tuning cache")
    tuning.add_argument("--frozen", action="store_true",
                        help="use only cached tuning results; fail (exit 2) if one is missing (see --shape)")
    p.add_argument("--shape", type=parse_shape, action=AppendOnce, metavar="B,T",
                   help="a shape the module must be tuned for (repeatable): tuned now on this GPU if not cached, "
                        "an error with --frozen (default: embed every cached bucket of this GPU)")
    p.add_argument("--dtype", action=AppendOnce, choices=("bfloat16", "float16", "float32"),
                   help="input dtype of --shape (repeatable; default bfloat16)")
    p.add_argument("--gpu", help="embed the cached tuning of this GPU (name as torch reports it; default: this machine's)")
    p.add_argument("--cache-dir", help="k3compile cache folder (default $K3C_CACHE_DIR, else $XDG_CACHE_HOME/k3compile "
                                       "or ~/.cache/k3compile); tuning results live in its autotune/")
    p.set_defaults(run=cmd_compile)

    p = sub.add_parser("tune", help="autotune the chunk entry's (or chunk_backward's) schedule on this GPU for some shapes; "
                                    "fills the cache")
    p.add_argument("spec", help="layer spec (.toml) of a recurrence kind, or of a latent_moe layer (its dispatch table)")
    p.add_argument("--shape", type=parse_shape, action=AppendOnce, metavar="B,T",
                   help="a recurrence's: batch and tokens per sequence to tune for (repeatable; one bucket each, "
                        "powers of two)")
    p.add_argument("--tokens", type=int, action=AppendOnce, metavar="N",
                   help="a latent_moe layer's: a token bucket of its dispatch table (repeatable; default 1, 4, 16, "
                        "64): the plan and tiles fastest at N tokens serve calls of up to N")
    p.add_argument("--dtype", action=AppendOnce, choices=("bfloat16", "float16", "float32"),
                   help="input dtype (repeatable; default bfloat16)")
    p.add_argument("-p", "--pipeline", help="base pass pipeline (default: the kind's); options it sets are not searched")
    p.add_argument("--cache-dir", help="k3compile cache folder (default $K3C_CACHE_DIR, else $XDG_CACHE_HOME/k3compile "
                                       "or ~/.cache/k3compile); tuning results live in its autotune/")
    p.add_argument("--retune", action="store_true", help="tune again even if the cache has the bucket")
    p.add_argument("--entry", choices=("chunk", "chunk_backward", "both"), default="chunk",
                   help="the entry to tune: the forward (chunk, the default), the backward (chunk_backward: its "
                        "gradients checked against float64 autograd, then timed with do, dht and dh0) or both")
    p.set_defaults(run=cmd_tune)

    p = sub.add_parser("ir", help="print the IR of a layer spec (and after every pass)")
    p.add_argument("spec", help="layer spec (.toml)")
    p.add_argument("--after-all", action="store_true", help="print the spec's IR and the IR after every pass")
    p.add_argument("-p", "--pipeline", help="pass pipeline to run: prints the IR after it (with --after-all, "
                                           "default: the kind's)")
    p.add_argument("--generic", action="store_true", help="print MLIR's generic form")
    p.add_argument("--timing", action="store_true", help="print how long each pass took")
    p.set_defaults(run=cmd_ir)

    p = sub.add_parser("opt", help="run passes over an .mlir file and print the result")
    p.add_argument("file", help="input IR (.mlir), or - for stdin")
    p.add_argument("-p", "--passes", help="pass pipeline, e.g. 'lower-recurrent,fuse-attnres'")
    p.add_argument("--generic", action="store_true", help="print MLIR's generic form")
    p.add_argument("--timing", action="store_true", help="print how long each pass took")
    p.set_defaults(run=cmd_opt)

    p = sub.add_parser("passes", help="list the passes, their options and defaults, and the default pipelines")
    p.set_defaults(run=cmd_passes)

    p = sub.add_parser("verify", help="run the compiled kernels against the float64 reference")
    p.add_argument("spec", help="layer spec (.toml)")
    p.add_argument("--device", help="cpu (Triton's interpreter) or cuda[:N] (default: cuda if available)")
    p.add_argument("--dtype", action=AppendOnce, choices=("float32", "float16", "bfloat16"),
                   help="input dtype (repeatable; default fp32 on CPU, bf16, fp16 and fp32 on GPU)")
    p.add_argument("--seed", type=int, help="seed for the random inputs (default: fresh each run)")
    p.add_argument("--quick", action="store_true",
                   help="one case per entry (varlen with empty, one-token and odd-length sequences, initial "
                        "states; on a CPU at 2 of the spec's heads) instead of the full grid of variants and lengths")
    p.add_argument("--shard", type=parse_shard, metavar="I/N",
                   help="run only the cases at positions p of the grid with p %% N == I (0 <= I < N); "
                        "the N shards, e.g. run side by side, cover the grid once")
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("prove", help="prove the derived chunkwise, replay and segment-scan schedules equal to the "
                                     "token recurrence, and the derived backward's gradients equal to its "
                                     "derivative (sympy)")
    p.add_argument("spec", help="layer spec (.toml) of a recurrence kind")
    p.add_argument("--chunk-size", type=int, action=AppendOnce,
                   help="chunk size, 1 .. 64 (repeatable; default 3, 16, 32, 64; the fused-kernel and segment-scan proofs "
                        "use the smallest; the backward's at every size: its three default lengths at the smallest, "
                        "one (two chunks, the second partial) at the others)")
    p.add_argument("--draft-tokens", type=int, default=4, help="tokens per round of the speculative proofs (verify/replay, spec_step; default 4)")
    p.add_argument("--seed", type=int, help="seed for the random rationals (default: fresh each run)")
    p.set_defaults(run=cmd_prove)

    from k3compile.vision.plan_cli import add_parser as add_plan_vision

    add_plan_vision(sub)  # k3c plan-vision

    from k3compile.runtime.pipeline_plan_cli import add_parser as add_plan_pipeline

    add_plan_pipeline(sub)  # k3c plan-pipeline

    from k3compile.checking.cost_cli import add_parser as add_cost

    add_cost(sub)  # k3c cost
    return parser


def first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except K3Error as err:
        print(f"k3c {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (`k3c passes | head -1`): the reader has what it wanted
        silence_stdout()
        return EXIT_OK
    except Exception as err:  # a bug in k3compile or the toolchain: one line, the traceback on request
        if os.environ.get("K3C_TRACEBACK", "").strip().lower() in ("1", "true"):
            traceback.print_exc()
        else:
            print(f"k3c {args.command}: internal error: {type(err).__name__}: {first_line(err)} "
                  "(set K3C_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def silence_stdout() -> None:
    """Point stdout at the null device: Python flushes it at exit, which would fail on the
    closed pipe again (a message and exit 120)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (stdout captured in-process): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
