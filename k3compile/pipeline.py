"""Pass pipelines: named defaults per layer kind, parsing of `-p a,b{opt=v}`, timing and dumps."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

from k3compile.errors import IRError

# The default pipeline of each spec kind (passes run in order).
# the segment summaries (context parallelism) come with every recurrence: the chunk entry finishes
# the segments, so CP needs no recompilation
RECURRENCE_PIPELINE = "lower-recurrent,lower-decode,derive-chunkwise,fuse-chunkwise,derive-segment-scan,lower-segment-scan"
DEFAULT_PIPELINES = {
    "kda": RECURRENCE_PIPELINE,
    "gated_deltanet": RECURRENCE_PIPELINE,
    "deltanet": RECURRENCE_PIPELINE,
    "gla": RECURRENCE_PIPELINE,
    "attnres": "fuse-attnres",
    "latent_moe": "",
}


def available_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    from k3compile.passes import PASSES

    return PASSES


@dataclass
class PipelineRun:
    """What running a pipeline produced: per-pass timings and (optionally) the IR after each."""

    timings: list[tuple[str, float]] = field(default_factory=list)
    snapshots: list[tuple[str, str]] = field(default_factory=list)


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

    try:
        pipeline = PassPipeline.parse_spec(available_passes(), spec_text, after_pass)
    except ArgSpecParseError as err:  # a BaseException; its first line is a header, the message its last
        where = re.search(r"^pass-pipeline:\d+:(\d+)$", str(err), re.MULTILINE)
        raise IRError(
            f"pipeline '{spec_text}': {f'column {where[1]}: ' if where else ''}{str(err).splitlines()[-1].strip()} "
            "(passes are separated by commas, a pass's options by spaces: 'lower-recurrent{block-v=64 num-warps=8}')"
        ) from None
    except Exception as err:  # xDSL raises plain Exceptions for unknown passes and bad options
        raise IRError(f"pipeline '{spec_text}': {str(err).splitlines()[0]}; passes: {', '.join(available_passes())}") from None
    try:
        pipeline.apply(ctx, module)
    except (DiagnosticException, ValueError) as err:
        raise IRError(f"pipeline '{spec_text}': {str(err).splitlines()[0]}") from None
    return result
