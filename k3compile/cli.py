"""`k3c`: compile, inspect, transform, verify and prove k3 layers.

Exit codes: 0 ok, 1 verification failed, 2 bad input (spec, IR, pipeline, arguments).
Imports of xDSL, torch and triton are deferred to the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from k3compile.errors import K3Error

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage errors use our bad-input code
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def print_timings(timings: list[tuple[str, float]]) -> None:
    for name, seconds in timings:
        print(f"  {name:<24} {seconds * 1e3:8.1f} ms", file=sys.stderr)


def cmd_compile(args) -> int:
    from k3compile.driver import lower, write_module
    from k3compile.spec import load_spec

    start = time.perf_counter()
    compilation = lower(load_spec(args.spec), args.pipeline)
    path = write_module(compilation, Path(args.output))
    if args.timing:
        print("pass timings:", file=sys.stderr)
        print_timings(compilation.timings)
        print(f"  {'total':<24} {(time.perf_counter() - start) * 1e3:8.1f} ms", file=sys.stderr)
    print(path)
    return EXIT_OK


def print_module(module_text: str, generic: bool) -> str:
    if not generic:
        return module_text
    from k3compile.ir.dialects import make_context
    from xdsl.parser import Parser
    from xdsl.printer import Printer
    import io

    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(Parser(make_context(), module_text).parse_module())
    return stream.getvalue()


def cmd_ir(args) -> int:
    from k3compile.driver import schedule
    from k3compile.spec import load_spec

    spec = load_spec(args.spec)
    if not args.after_all:
        from k3compile.frontend import spec_to_module

        print(print_module(str(spec_to_module(spec)), args.generic))
        return EXIT_OK
    compilation = schedule(spec, args.pipeline, keep_snapshots=True)
    print(f"// -----// IR of spec {spec.source} //----- //")
    print(print_module(compilation.layer_ir, args.generic))
    for name, text in compilation.run.snapshots:
        print(f"\n// -----// IR after {name} //----- //")
        print(print_module(text, args.generic))
    if args.timing:
        print_timings(compilation.timings)
    return EXIT_OK


def parse_ir(text: str, source: str):
    from k3compile.errors import IRError
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
    from k3compile.errors import IRError
    from k3compile.pipeline import run_pipeline

    if args.file == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        try:
            text, source = Path(args.file).read_text(), args.file
        except OSError as err:
            raise IRError(f"{args.file}: cannot read ({err.strerror})") from None
    module = parse_ir(text, source)
    run = run_pipeline(module, args.passes or "")
    if args.timing:
        print_timings(run.timings)
    print(print_module(str(module), args.generic))
    return EXIT_OK


def cmd_verify(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from k3compile.spec import load_spec
    from k3compile.verify import verify

    spec = load_spec(args.spec)
    console = Console(stderr=True)
    with console.status("verifying") as status:
        results = verify(
            spec, device=args.device, dtypes=args.dtype, seed=args.seed,
            progress=lambda text: status.update(f"verifying {text}"),
        )
    table = Table(title=f"k3c verify {args.spec}")
    for column in ("layer", "entry", "case", "dtype", "tensor", "max abs err", "RMS ratio", "tolerance", "result"):
        table.add_column(column, justify="right" if column in ("max abs err", "RMS ratio", "tolerance") else "left")
    for r in results:
        table.add_row(r.layer, r.entry, r.case, r.dtype, r.tensor, f"{r.max_abs:.2e}", f"{r.rms_ratio:.2e}",
                      f"{r.tolerance:.0e}", "pass" if r.passed else "[bold red]FAIL[/]")
    Console(width=160).print(table)
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_prove(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from k3compile.errors import UnsupportedError
    from k3compile.prove import prove_chunkwise, prove_replay
    from k3compile.spec import load_spec

    spec = load_spec(args.spec)
    if not spec.is_recurrence:
        raise UnsupportedError(f"{args.spec}: kind '{spec.kind}' has no derived schedule to prove")
    results = [r for size in args.chunk_size or [3, 16, 32, 64] for r in prove_chunkwise(spec, size, seed=args.seed)]
    results += prove_replay(spec, args.draft_tokens, seed=args.seed)
    table = Table(title=f"k3c prove {args.spec}: derived schedules == token recurrence, exact rationals (K=2, V=3)")
    for column in ("schedule", "T", "outputs", "final state", "result"):
        table.add_column(column)
    for r in results:
        table.add_row(r.schedule, str(r.length), "equal" if r.outputs_equal else "DIFFER",
                      "equal" if r.state_equal else "DIFFER", "proved" if r.holds else f"[bold red]FAILED[/] {r.first_mismatch}")
    Console(width=140).print(table)
    failed = sum(not r.holds for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="k3c", description="k3compile: Kimi K3-style layers -> Triton kernels")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    p = sub.add_parser("compile", help="compile a layer spec to a standalone Python module of Triton kernels")
    p.add_argument("spec", help="layer spec (.toml)")
    p.add_argument("-o", "--output", required=True, help="output directory (gets <name>.py)")
    p.add_argument("-p", "--pipeline", help="pass pipeline, e.g. 'lower-recurrent{block-v=64}' (default: the kind's)")
    p.add_argument("--timing", action="store_true", help="print how long each pass took")
    p.set_defaults(run=cmd_compile)

    p = sub.add_parser("ir", help="print the IR of a layer spec (and after every pass)")
    p.add_argument("spec", help="layer spec (.toml)")
    p.add_argument("--after-all", action="store_true", help="also print the IR after every pass")
    p.add_argument("-p", "--pipeline", help="pass pipeline (default: the kind's)")
    p.add_argument("--generic", action="store_true", help="print MLIR's generic form")
    p.add_argument("--timing", action="store_true", help="print how long each pass took")
    p.set_defaults(run=cmd_ir)

    p = sub.add_parser("opt", help="run passes over an .mlir file and print the result")
    p.add_argument("file", help="input IR (.mlir), or - for stdin")
    p.add_argument("-p", "--passes", help="pass pipeline, e.g. 'lower-recurrent,fuse-attnres'")
    p.add_argument("--generic", action="store_true", help="print MLIR's generic form")
    p.add_argument("--timing", action="store_true", help="print how long each pass took")
    p.set_defaults(run=cmd_opt)

    p = sub.add_parser("verify", help="run the compiled kernels against the float64 reference")
    p.add_argument("spec", help="layer spec (.toml)")
    p.add_argument("--device", help="cpu (Triton interpreter) or cuda (default: cuda if available)")
    p.add_argument("--dtype", action="append", choices=("float32", "float16", "bfloat16"),
                   help="input dtype (repeatable; default fp32 on CPU, bf16 and fp32 on GPU)")
    p.add_argument("--seed", type=int, help="seed for the random inputs (default: fresh each run)")
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("prove", help="prove the derived chunkwise and replay schedules equal to the token recurrence (sympy)")
    p.add_argument("spec", help="layer spec (.toml) of a recurrence kind")
    p.add_argument("--chunk-size", type=int, action="append", help="chunk size (repeatable; default 3, 16, 32, 64)")
    p.add_argument("--draft-tokens", type=int, default=4, help="tokens of the speculative verify/replay proof (default 4)")
    p.add_argument("--seed", type=int, help="seed for the random rationals (default: fresh each run)")
    p.set_defaults(run=cmd_prove)
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
    except BrokenPipeError:  # `k3c ir ... | head`
        sys.stderr.close()
        return EXIT_OK
    except Exception as err:  # a bug in k3compile or the toolchain: one line, the traceback on request
        if os.environ.get("K3C_TRACEBACK"):
            raise
        print(f"k3c {args.command}: internal error: {type(err).__name__}: {first_line(err)} "
              "(set K3C_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
