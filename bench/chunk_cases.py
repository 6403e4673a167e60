"""The chunk (prefill) benchmark's cases and the gate semantics each one runs under.

A case is one layer spec, bench/specs/<case>.toml (heads and dims are baked into a generated
module), timed at one shape. Its gate variants are derived here, never kept as copies: the
variant `<case>_<gate_input>` is the spec with `gate_input` set. A pairing times one variant
against the fla call that assumes the same of g, on the same inputs:

  bounded    gates >= -5 (the inputs clamped there): ours gate_input = "clamped" (the kernel
             enforces max(g, -5)) against chunk_kda(..., safe_gate=True, lower_bound=-5), fla's
             kernel for that contract. fla-core 0.6.0's chunk_gla has no bounded path, so a GLA
             case's bounded row is our bounded kernel against fla's general one, and says so.
  unbounded  any gate (the inputs not clamped): ours gate_input = "log" against fla's default.

Gated DeltaNet runs the unbounded pairing only: fla-core 0.6.0's chunk_gated_delta_rule has no
bounded path, and ours derives the same schedule for any scalar gate (only a channel gate's
Gram diagonal is factored when the gate is bounded).

    python3 bench/chunk_cases.py specs DIR [--cases kda_h96,gdn_h32] [--pairings bounded]

writes DIR/<variant>.toml for every case and pairing and prints one line per variant,
"<variant> <case> <pairing> <B> <T>" (bench/device_run.sh compiles and tunes those).

Standard library only: bench/chunk_gpu.py imports it where k3compile is not installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

SPECS = Path(__file__).resolve().parent / "specs"

# case -> the timed (B, T); the layer is bench/specs/<case>.toml
CASES = {
    "kda_h96": (1, 8192),
    "kda_h64": (4, 4096),
    "kda_h16": (2, 16384),
    "kda_h32_d64": (8, 2048),
    "gdn_h32": (4, 4096),
    "gla_h32": (4, 4096),
}

PAIRINGS = ("bounded", "unbounded")
GATE_INPUT = {"bounded": "clamped", "unbounded": "log"}  # ours, per pairing
GATE_FLOOR = -5.0  # the bounded pairing's lower bound: fla's safe_gate range is [-5, 0)
PAIRING_TITLES = {
    "bounded": f"gates >= {GATE_FLOOR:g} (inputs clamped at {GATE_FLOOR:g})",
    "unbounded": "unbounded gates (inputs not clamped)",
}
# fla-core 0.6.0's chunk function of each member, and whether it has a bounded-gate path
FLA_CHUNK = {
    "kda": ("fla.ops.kda", "chunk_kda"),
    "gated_deltanet": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "gla": ("fla.ops.gla", "chunk_gla"),
}
FLA_HAS_BOUNDED_PATH = {"kda"}


def pairings_of(kind: str) -> tuple[str, ...]:
    """The pairings a member runs: both for a channel gate, the unbounded one for a scalar gate."""
    return ("unbounded",) if kind == "gated_deltanet" else PAIRINGS


def gate_floor(pairing: str) -> float | None:
    """The value the pairing's input gates are clamped at (None: drawn without a bound)."""
    return GATE_FLOOR if pairing == "bounded" else None


def ours_semantics(pairing: str) -> str:
    return f'gate_input = "{GATE_INPUT[pairing]}"' + (f" (max(g, {GATE_FLOOR:g}))" if pairing == "bounded" else " (any g)")


def fla_gate_options(kind: str, pairing: str) -> dict:
    """fla's keyword arguments that state the pairing's gate contract (none: its default path)."""
    if pairing == "bounded" and kind in FLA_HAS_BOUNDED_PATH:
        return dict(safe_gate=True, lower_bound=GATE_FLOOR)
    return {}


def fla_semantics(kind: str, pairing: str) -> str:
    options = fla_gate_options(kind, pairing)
    if options:
        return ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                         for key, value in options.items())
    if pairing == "bounded":
        return "default, any g (fla-core 0.6.0 has no bounded path here)"
    return "default (any g)"


def read_layer(case: str) -> dict:
    """The `[layer]` table of bench/specs/<case>.toml, which leaves the gate to the pairings."""
    path = SPECS / f"{case}.toml"
    try:
        layer = tomllib.loads(path.read_text())["layer"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as err:
        raise ValueError(f"{path}: cannot read its [layer] table ({type(err).__name__}: {err})") from None
    if "gate_input" in layer:
        raise ValueError(f"{path}: key 'gate_input': the benchmark sets it per pairing (bench/chunk_cases.py); remove it")
    return layer


def variant_table(layer: dict, pairing: str) -> dict:
    """The layer with the pairing's gate_input, named `<name>_<gate_input>` (its module's name)."""
    gate_input = GATE_INPUT[pairing]
    return dict(layer, name=f"{layer['name']}_{gate_input}", gate_input=gate_input)


def toml_table(table: dict) -> str:
    """A flat `[layer]` table of strings, numbers and booleans as TOML."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        return json.dumps(v)  # a TOML basic string for the ASCII names and choices of a spec

    return "[layer]\n" + "".join(f"{key} = {value(v)}\n" for key, v in table.items())


def write_variant_specs(out_dir: Path, cases, pairings=PAIRINGS):
    """Writes out_dir/<variant>.toml for each case and pairing it runs; yields (variant, case, pairing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for case in cases:
        layer = read_layer(case)
        for pairing in pairings_of(layer["kind"]):
            if pairing not in pairings:
                continue
            table = variant_table(layer, pairing)
            header = f"# bench/specs/{case}.toml under the {pairing} pairing (bench/chunk_cases.py): {PAIRING_TITLES[pairing]}\n"
            (out_dir / f"{table['name']}.toml").write_text(header + toml_table(table))
            yield table["name"], case, pairing


def names(text: str, known, what: str) -> list[str]:
    """A comma-separated selection, each name checked against `known`."""
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        raise ValueError(f"{what}: expected a comma-separated subset of {', '.join(known)}, got {text!r}")
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    specs = sub.add_parser("specs", help="write the variant specs of the cases and list them")
    specs.add_argument("out", type=Path, help="folder for <variant>.toml")
    specs.add_argument("--cases", default=",".join(CASES), help=f"comma-separated cases (default: all: {','.join(CASES)})")
    specs.add_argument("--pairings", default=",".join(PAIRINGS), help="comma-separated pairings (default: bounded,unbounded)")
    args = parser.parse_args(argv)
    try:
        cases = names(args.cases, CASES, "--cases")
        pairings = names(args.pairings, PAIRINGS, "--pairings")
        for variant, case, pairing in write_variant_specs(args.out, cases, pairings):
            print(variant, case, pairing, *CASES[case])
    except ValueError as err:
        print(f"chunk_cases: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
