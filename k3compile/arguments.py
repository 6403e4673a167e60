"""argparse types that several `k3c` subcommands share (each raises ArgumentTypeError, which
argparse turns into exit 2 with the message on one line)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def named_positive(metavar: str, meaning: str) -> Callable[[str], tuple[str, float]]:
    """A parser of `NAME=X` (e.g. metavar "KERNEL=MS", meaning "a kernel's name and its time"):
    a non-empty name and a positive finite number."""

    def parse(text: str) -> tuple[str, float]:
        name, _, value = text.partition("=")
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {metavar} ({meaning}), got {text!r}") from None
        if not name or not 0 < number < float("inf"):
            raise argparse.ArgumentTypeError(f"expected {metavar} with a name and a positive finite number, "
                                             f"got {text!r}")
        return name, number

    return parse


class AppendOnce(argparse.Action):
    """A repeatable option's values, each once: a repeated --dtype would run every case twice."""

    def __call__(self, parser, namespace, value, option_string=None):
        values = getattr(namespace, self.dest) or []
        setattr(namespace, self.dest, values if value in values else [*values, value])


def parse_shape(text: str) -> tuple[int, int]:
    try:
        batch, tokens = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B,T (two integers), got {text!r}") from None
    if batch < 1 or tokens < 1:
        raise argparse.ArgumentTypeError(f"B and T must be positive, got {text!r}")
    return batch, tokens
