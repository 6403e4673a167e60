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
