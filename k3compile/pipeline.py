"""Pass pipelines: named defaults per layer kind, parsing of `-p a,b{opt=v}`, timing and dumps.

Verification (`verify`; issue 39). What a user of the compiler can count on: the IR it prints
was verified, and an invalid IR is reported as per-pass verification reports it (the verifier's
error right after the pass that made it). How often the module is verified is the caller's choice:
- "each" (the default, as MLIR's pass manager): after every pass. `k3c ir`, `k3c opt`,
  `k3c prove`, schedule() and the tests' run_pipeline run so: they look at the IR between passes.
- "once": after the last pass. A compile (driver.lower) verifies so the module it prints, after
  the backend's passes too (which nothing verified before). xDSL verifies in Python, and each
  pass re-verified the whole module, the entries it never touched included: after each of the
  10 passes of examples/kda.toml's pipeline that was ~130 ms of a 720 ms compile (and as much
  again in the frontend's symbol probe); one verification of the printed module is ~35 ms.
  Nothing is lost when something fails: a pass raising, or the final verification, makes the
  whole run repeat from a copy of its input verifying after each pass, and what that run raises
  is raised, the error "each" gives (passes are deterministic). K3C_VERIFY_EACH=1 makes a
  compile verify after each pass from the start.
- "off": never, for a caller that only reads symbol names off the result (frontend's
  module_symbols probe layer; the compile it guards verifies its own IR).
"""

from __future__ import annotations

import dataclasses
import re
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.arg_spec import PipelineLexer, SpecTokenKind, parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

from k3compile.backends.triton import BACKEND_PASSES
# re-exported: the defaults live apart, where reading them imports no xDSL
from k3compile.default_pipelines import DEFAULT_PIPELINES, RECURRENCE_PIPELINE, SPECULATIVE_PIPELINE  # noqa: F401
from k3compile.errors import IRError
from k3compile.passes import PASSES

Verify = typing.Literal["each", "once", "off"]

# how an option's expected type is named in a message
TYPE_WORDS = {int: "an integer", str: "a word", bool: "true or false", float: "a number"}


def available_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """What `-p` takes, by name: the pipeline's passes, then the Triton backend's own."""
    return {**PASSES, **BACKEND_PASSES}


@dataclass
class PipelineRun:
    """What running a pipeline produced: per-pass timings and (optionally) the IR after each."""

    timings: list[tuple[str, float]] = field(default_factory=list)
    snapshots: list[tuple[str, str]] = field(default_factory=list)


def spelled_options(spec_text: str) -> Iterator[list[tuple[str, str | None]]]:
    """Per pass of a (syntactically valid) pipeline, its options as the user spelled them (name,
    value text or None), repeats included: xDSL's parse keeps only the last of a repeated option."""
    lexer, options, inside, expect_name = PipelineLexer(spec_text), None, False, False
    while (token := lexer.lex()).kind is not SpecTokenKind.EOF:
        if token.kind is SpecTokenKind.L_BRACE:
            inside, expect_name = True, True
        elif token.kind is SpecTokenKind.R_BRACE:
            inside = False
        elif not inside:
            if token.kind is SpecTokenKind.IDENT:  # a pass name
                if options is not None:
                    yield options
                options = []
        elif token.kind is SpecTokenKind.SPACE:
            expect_name = True
        elif expect_name:
            options.append((token.span.text, None))
            expect_name = False
        elif token.kind is not SpecTokenKind.EQUALS:  # a value, or a comma between values
            name, text = options[-1]
            options[-1] = (name, (text or "") + token.span.text)
    if options is not None:
        yield options


def parse_passes(spec_text: str) -> list[tuple[str, list[tuple[str, str | None, tuple]]]]:
    """(pass name, [(option as spelled, its value as spelled, parsed values)]) of every pass;
    raises ArgSpecParseError on bad syntax."""
    specs = list(parse_pipeline(spec_text))
    return [(spec.name, [(name, text, spec.parameters[name]) for name, text in spelled])
            for spec, spelled in zip(specs, spelled_options(spec_text), strict=True)]


def build_pass(spec_text: str, name: str, options: list[tuple[str, str | None, tuple]]) -> ModulePass:
    """The pass `name` with its options, each checked by the name the user spelled."""
    where = f"pipeline '{spec_text}'"
    passes = available_passes()
    if name not in passes:
        raise IRError(f"{where}: unknown pass '{name}'; passes: {', '.join(passes)}")
    pass_type = passes[name]()
    types = typing.get_type_hints(pass_type)
    fields = [f.name for f in dataclasses.fields(pass_type)]
    known = ", ".join(f.replace("_", "-") for f in fields) or "none"
    kwargs, spelled_as = {}, {}
    for spelled, text, values in options:
        option = spelled.replace("-", "_")
        if option not in fields:
            raise IRError(f"{where}: {name} has no option '{spelled}' (its options: {known})")
        if option in spelled_as:
            repeat = "" if spelled_as[option] == spelled else f" (as '{spelled_as[option]}')"
            raise IRError(f"{where}: {name} option '{spelled}' is given twice{repeat}; give it once")
        spelled_as[option] = spelled
        expected = types[option]
        value = values[0] if len(values) == 1 else None
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            given = "no value" if text is None else repr(text)
            raise IRError(f"{where}: {name} option '{spelled}' expects {TYPE_WORDS[expected]}, got {given}")
        kwargs[option] = value
    return pass_type(**kwargs)


def run_pipeline(module: ModuleOp, spec_text: str, keep_snapshots: bool = False, verify: Verify = "each",
                 observe: Callable[[str, ModuleOp], None] | None = None) -> PipelineRun:
    """Run `spec_text` (e.g. "lower-recurrent{block-v=64}") over module in place, verifying as
    `verify` says (the module docstring); observe(pass name, module), when given, is called after
    each pass."""
    result = PipelineRun()
    if not spec_text.strip():
        return result
    passes = parse_pipeline_passes(spec_text)
    try:
        run_passes(module, passes, result, verify=verify, keep_snapshots=keep_snapshots, observe=observe)
    except (DiagnosticException, ValueError) as err:
        raise IRError(f"pipeline '{spec_text}': {str(err).splitlines()[0]}") from None
    return result


def parse_checked(spec_text: str) -> list[tuple[str, list[tuple[str, str | None, tuple]]]]:
    """parse_passes, with bad syntax an IRError of one line naming the column."""

    def syntax_error(column: str | None, message: str) -> IRError:
        return IRError(f"pipeline '{spec_text}': {f'column {column}: ' if column else ''}{message} (passes are "
                       "separated by commas, a pass's options by spaces: 'lower-recurrent{block-v=64 num-warps=8}')")

    try:
        parsed = parse_passes(spec_text)
    except ArgSpecParseError as err:  # a BaseException; its first line is a header, the message its last
        where = re.search(r"^pass-pipeline:\d+:(\d+)$", str(err), re.MULTILINE)
        raise syntax_error(where and where[1], str(err).splitlines()[-1].strip()) from None
    if spec_text.rstrip().endswith(","):  # xDSL's parser takes a trailing comma, as no other empty pass name
        raise syntax_error(str(len(spec_text.rstrip()) + 1), "Expected pass name here")
    return parsed


def parse_pipeline_passes(spec_text: str) -> tuple[ModulePass, ...]:
    """The passes of a pipeline, built with their options; IRError naming a bad pipeline."""
    return tuple(build_pass(spec_text, name, options) for name, options in parse_checked(spec_text))


def run_passes(module: ModuleOp, passes: typing.Sequence[ModulePass], result: PipelineRun | None = None, *,
               verify: Verify = "each", keep_snapshots: bool = False,
               observe: Callable[[str, ModuleOp], None] | None = None, label: str = "") -> PipelineRun:
    """Apply passes to module in place, timing each (as label + its name) into result. verify
    "each": the module after every pass; "once": after the last pass, and on any failure the
    passes again over a copy of the module as it came, verifying after each, raising what that
    raises; "off": never. Raises what the passes and xDSL's verifier (VerifyException) raise."""
    # the k3 and k3s dialects (~150 ms): not for `k3c passes` or parsing -p
    from k3compile.ir.dialects import make_context

    result = PipelineRun() if result is None else result
    if verify == "once":
        original = module.clone()
        try:
            run_passes(module, passes, result, verify="off", keep_snapshots=keep_snapshots, observe=observe,
                       label=label)
            module.verify()
        except Exception:
            # the same passes verified after each: the error a per-pass verification reports
            run_passes(original, passes, verify="each")
            raise
        return result
    ctx = make_context()
    last = [time.perf_counter()]

    def after_pass(done: ModulePass | None, mod: ModuleOp, _next: ModulePass | None) -> None:
        if done is not None:  # xDSL also calls back once before the first pass
            result.timings.append((label + done.name, time.perf_counter() - last[0]))
            if verify == "each":
                mod.verify()
            if keep_snapshots:
                result.snapshots.append((done.name, str(mod)))
            if observe is not None:
                observe(done.name, mod)
        last[0] = time.perf_counter()

    PassPipeline(tuple(passes), after_pass).apply(ctx, module)
    return result
