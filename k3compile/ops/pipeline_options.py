"""Pass options for the layers k3compile.ops compiles: a schedule's forms and tiles chosen by the
caller, e.g. Block AttnRes's columns forms or a backward's value blocks, without a spec file.

    with k3compile.ops.pass_options("derive-block-attnres{partials-schedule=columns}"):
        ...                                   # every layer compiled or run here uses them

or, for a whole process (a benchmark, a training script unchanged):

    K3C_PASS_OPTIONS='derive-backward{chunk-size=32},lower-backward{block-v=32}' python train.py

The text names passes of the layer's default pipeline with the options they take (`k3c passes`
lists both); each replaces that pass's defaults, the other passes keep theirs. The options are
part of the compiled module's key (its file name in the cache), so a module compiled under
other options is never reused. An explicit choice replaces the tuner's: a recurrence compiled
under options embeds no tuned winners (docs/autotuning.md). The context manager's value wins
over the environment's; an empty text means the defaults.

A pass that is not in the layer's pipeline, or an option the pass does not have, is refused
when the layer compiles, with a one-line ValueError naming it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

ENVIRONMENT = "K3C_PASS_OPTIONS"

_CHOSEN: ContextVar[str | None] = ContextVar("k3compile_ops_pass_options", default=None)


@contextmanager
def pass_options(text: str) -> Iterator[None]:
    """Compile and run the layers called inside with these pass options (module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"pass_options: expected the options as text ('pass{{option=value}},...'), "
                        f"got {type(text).__name__}")
    token = _CHOSEN.set(text.strip())
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def chosen() -> str:
    """The pass options in force: the innermost pass_options(), else $K3C_PASS_OPTIONS, else ''."""
    text = _CHOSEN.get()
    return os.environ.get(ENVIRONMENT, "").strip() if text is None else text


def pipeline_with(kind: str, pipeline: str, options: str) -> str:
    """`pipeline` (the default of a layer of `kind`) with each pass that `options` names taking the
    options given there. Raises ValueError on a pass outside the pipeline, k3compile.errors.IRError
    (a ValueError) on bad syntax; the options themselves are checked when the pipeline is built
    (k3compile.pipeline.build_pass)."""
    from k3compile.pipeline import parse_checked  # a cold compile only: imports xDSL

    where = f"pass options '{options}' (k3compile.ops.pass_options or ${ENVIRONMENT})"
    given = parse_checked(options)
    names = pipeline.split(",")
    replacement: dict[str, str] = {}
    for name, spelled in given:
        if name not in names:
            raise ValueError(f"{where}: '{name}' is not a pass of the {kind} pipeline ({', '.join(names)})")
        if name in replacement:
            raise ValueError(f"{where}: '{name}' is given twice; give its options once")
        words = [option if text is None else f"{option}={text}" for option, text, _ in spelled]
        replacement[name] = f"{name}{{{' '.join(words)}}}" if words else name
    return ",".join(replacement.get(name, name) for name in names)
