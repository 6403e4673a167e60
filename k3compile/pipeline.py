"""Pass pipelines: named defaults per layer kind, parsing of `-p a,b{opt=v}`, timing and dumps."""

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

from k3compile.errors import IRError

# The default pipeline of each spec kind (passes run in order).
# the segment summaries (context parallelism) come with every recurrence: the chunk entry finishes
# the segments, so CP needs no recompilation; so does the chunk entry's backward (training)
RECURRENCE_PIPELINE = ("lower-recurrent,lower-decode,derive-chunkwise,fuse-chunkwise,derive-segment-scan,"
                       "lower-segment-scan,derive-backward,lower-backward,derive-segment-scan-backward,outline-kernels")
DEFAULT_PIPELINES = {
    "kda": RECURRENCE_PIPELINE,
    "gated_deltanet": RECURRENCE_PIPELINE,
    "deltanet": RECURRENCE_PIPELINE,
    "gla": RECURRENCE_PIPELINE,
    "attnres": "fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward,outline-kernels",
    "latent_moe": "lower-moe-routing,lower-moe-experts,derive-moe-backward,outline-kernels",
    # no kernels derived: attention runs on torch's (k3compile.vision; docs/vision.md)
    "vision": "",
}
# the pipeline of speculative decoding's serving entries (verify, commit, spec_step; README)
SPECULATIVE_PIPELINE = "derive-replay,lower-speculative"
# how an option's expected type is named in a message
TYPE_WORDS = {int: "an integer", str: "a word", bool: "true or false", float: "a number"}


def available_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    from k3compile.passes import PASSES

    return PASSES


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


def run_pipeline(module: ModuleOp, spec_text: str, keep_snapshots: bool = False) -> PipelineRun:
    """Run `spec_text` (e.g. "lower-recurrent{block-v=64}") over module in place, verifying after each pass."""
    from k3compile.ir.dialects import make_context

    ctx = make_context()
    result = PipelineRun()
    if not spec_text.strip():
        return result
    last = [time.perf_counter()]

    def after_pass(done: ModulePass | None, mod: ModuleOp, _next: ModulePass | None) -> None:
        if done is not None:  # xDSL also calls back once before the first pass
            result.timings.append((done.name, time.perf_counter() - last[0]))
            mod.verify()
            if keep_snapshots:
                result.snapshots.append((done.name, str(mod)))
        last[0] = time.perf_counter()

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
    passes = tuple(build_pass(spec_text, name, options) for name, options in parsed)
    try:
        PassPipeline(passes, after_pass).apply(ctx, module)
    except (DiagnosticException, ValueError) as err:
        raise IRError(f"pipeline '{spec_text}': {str(err).splitlines()[0]}") from None
    return result
