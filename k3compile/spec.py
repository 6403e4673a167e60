"""Layer specs: one TOML file, one `[layer]` table, validated against the schema of its kind."""

from __future__ import annotations

import importlib.util
import keyword
import math
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3compile.errors import SpecError
from k3compile.ir.choices import BETA_INPUTS, DTYPES, GATE_INPUTS, GLU_ACTIVATIONS, STATE_LAYOUTS, VISION_POSITIONS, WEIGHT_FORMATS

REQUIRED = object()
# every integer key's range: TOML's integers are 64-bit, and so are the IR's (i64 properties)
INT_RANGE = (-2**63, 2**63 - 1)

# The KDA family: each kind is the recurrence op with its gate and delta-rule attributes.
RECURRENCE_KINDS = {
    "kda": {"gate": "channel", "delta_rule": True},
    "gated_deltanet": {"gate": "scalar", "delta_rule": True},
    "deltanet": {"gate": "none", "delta_rule": True},
    "gla": {"gate": "channel", "delta_rule": False},
}


@dataclass(frozen=True)
class Key:
    kind: type  # int, float, str or bool
    default: Any = REQUIRED
    choices: tuple = ()
    minimum: float | None = 1  # for numbers: the smallest allowed value
    exclusive: bool = False  # minimum itself not allowed (floats that must be > 0)

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        if self.kind is int:
            low = "-2**63" if self.minimum is None else f"{self.minimum:g}"
            return f"an integer in {low} .. 2**63 - 1"
        if self.kind is float and self.minimum is not None:
            return f"a number {'>' if self.exclusive else '>='} {self.minimum:g}"
        return {float: "a number", str: "a string", bool: "true or false"}[self.kind]


_RECURRENCE_SCHEMA = {
    "num_heads": Key(int),
    "head_k_dim": Key(int),
    "head_v_dim": Key(int),
    "num_v_heads": Key(int, default=None),  # default: num_heads
    "scale": Key(float, default=None, minimum=0, exclusive=True),  # default: head_k_dim ** -0.5
    "state_layout": Key(str, default="kv", choices=STATE_LAYOUTS),
    "dtype": Key(str, default="bfloat16", choices=DTYPES),
    # what the kernels' inputs mean (fla's use_qk_l2norm_in_kernel, use_gate_in_kernel, beta as logits)
    "qk_l2norm": Key(bool, default=False),
    "gate_input": Key(str, default="log", choices=GATE_INPUTS),
    "gate_lower_bound": Key(float, default=-5.0, minimum=None),
    "beta_input": Key(str, default="probability", choices=BETA_INPUTS),
}
SCHEMAS = {kind: _RECURRENCE_SCHEMA for kind in RECURRENCE_KINDS}
SCHEMAS["attnres"] = {
    "hidden_size": Key(int),
    "num_blocks": Key(int),
    "block_size": Key(int),
    "eps": Key(float, default=1e-6, minimum=0, exclusive=True),
    "dtype": Key(str, default="bfloat16", choices=DTYPES),
}
SCHEMAS["latent_moe"] = {
    "hidden_size": Key(int),
    "latent_dim": Key(int, default=0, minimum=0),
    "num_experts": Key(int),
    "top_k": Key(int),
    "expert_ffn_dim": Key(int),
    "num_shared_experts": Key(int, default=0, minimum=0),
    "shared_ffn_dim": Key(int, default=0, minimum=0),
    "activation": Key(str, default="swiglu", choices=GLU_ACTIVATIONS),
    "norm_topk_prob": Key(bool, default=True),
    "routed_scaling_factor": Key(float, default=1.0, minimum=0, exclusive=True),
    "eps": Key(float, default=1e-6, minimum=0, exclusive=True),
    "dtype": Key(str, default="bfloat16", choices=DTYPES),
    # the routed experts' weights: bf16 (in dtype, whatever it is) or mxfp4 (docs/moe.md)
    "expert_weight_format": Key(str, default="bf16", choices=WEIGHT_FORMATS),
}
# A ViT encoder layer (docs/vision.md). Defaults: MoonViT, the Kimi-VL / Kimi K2.5 vision encoder
# (MoonViTConfig in Kimi-VL-A3B's configuration_kimi_vl.py: hidden 1152, 16 heads (head dim 72),
# MLP 4304, 27 layers, patch 14, 2D RoPE with base 10000; nn.LayerNorm's eps 1e-5). K3's own
# encoder is not public; these are the closest published figures.
SCHEMAS["vision"] = {
    "hidden_size": Key(int, default=1152),
    "num_heads": Key(int, default=16),
    "head_dim": Key(int, default=72),
    "mlp_dim": Key(int, default=4304),
    "patch_size": Key(int, default=14),
    "num_layers": Key(int, default=27),
    "position": Key(str, default="rope_2d", choices=VISION_POSITIONS),
    "rope_theta": Key(float, default=10000.0, minimum=1, exclusive=True),
    "eps": Key(float, default=1e-5, minimum=0, exclusive=True),
    "dtype": Key(str, default="bfloat16", choices=DTYPES),
}
KINDS = tuple(SCHEMAS)


def shadowed_module(name: str) -> str | None:
    """Where Python finds the module that `name`.py in an output folder would shadow for any
    Python started there (typing_extensions.py breaks `import torch`), or None. The module
    k3compile compiled for a layer of this name is not one: compiling it again replaces it."""
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: imported without a spec, as __main__
        return "sys.modules"
    if found is None or ((found.origin or "").endswith(".py") and compiled_for(Path(found.origin), name)):
        return None
    return found.origin or ", ".join(found.submodule_search_locations or ()) or "sys.meta_path"


def compiled_for(path: Path, name: str) -> bool:
    """Whether `path` is the module k3compile compiled for a layer called `name` (its docstring says so)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as file:
            return file.readline().startswith(f'"""{name}: compiled ')
    except OSError:
        return False


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a layer (its module file), or None."""
    if not name.isidentifier():
        return "not a Python identifier (letters, digits, _), so its module could not be imported"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return "a Python keyword"
    # the standard library's names whether or not this Python has the module (tkinter)
    if name in sys.stdlib_module_names:
        return f"a standard-library module: {name}.py in the output folder would shadow it"
    if where := shadowed_module(name):
        return f"an importable module ({where}): {name}.py in the output folder would shadow it"
    return None


@dataclass(frozen=True)
class LayerSpec:
    """A validated layer: its name, kind and every parameter (defaults filled in)."""

    name: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    source: str = "<spec>"

    @property
    def is_recurrence(self) -> bool:
        return self.kind in RECURRENCE_KINDS


def _check_value(where: str, key: str, rule: Key, value: Any) -> Any:
    ok_type = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[rule.kind]
    if rule.kind is float and ok_type:
        value = float(value)
        ok_type = math.isfinite(value)
    if ok_type and rule.choices:
        ok_type = value in rule.choices
    if ok_type and rule.kind in (int, float) and rule.minimum is not None:
        ok_type = value > rule.minimum if rule.exclusive else value >= rule.minimum
    if ok_type and rule.kind is int:
        ok_type = INT_RANGE[0] <= value <= INT_RANGE[1]
    if not ok_type:
        raise SpecError(f"{where}: key '{key}': expected {rule.describe()}, got {value!r}")
    return value


def check_keys(where: str, schema: dict[str, Key], table: dict[str, Any], missing_note: str = "") -> dict[str, Any]:
    """Every key of `schema` checked in `table` or defaulted (a missing required key: SpecError,
    its message ending in `missing_note`); also k3compile.runtime.stack_spec's."""
    params: dict[str, Any] = {}
    for key, rule in schema.items():
        if key in table:
            params[key] = _check_value(where, key, rule, table[key])
        elif rule.default is REQUIRED:
            raise SpecError(f"{where}: missing key '{key}' ({rule.describe()}){missing_note}")
        else:
            params[key] = rule.default
    return params


def spec_from_table(table: dict[str, Any], source: str = "<spec>") -> LayerSpec:
    """Validate a `[layer]` table (already parsed) into a LayerSpec."""
    where = f"{source}: [layer]"
    for key in ("name", "kind"):
        if key not in table:
            raise SpecError(f"{where}: missing key '{key}'")
    name, kind = table["name"], table["kind"]
    if not isinstance(name, str):
        raise SpecError(f"{where}: key 'name': expected a Python identifier (letters, digits, _), got {name!r}")
    if problem := name_problem(name):
        raise SpecError(f"{where}: key 'name': {name!r} is {problem}; choose another name")
    if kind not in SCHEMAS:
        raise SpecError(f"{where}: key 'kind': expected one of {', '.join(KINDS)}, got {kind!r}")
    schema = SCHEMAS[kind]
    unknown = sorted(set(table) - set(schema) - {"name", "kind"})
    if unknown:
        raise SpecError(
            f"{where}: unknown key '{unknown[0]}' for kind '{kind}'; allowed: name, kind, {', '.join(schema)}"
        )
    params = check_keys(where, schema, table, f" for kind '{kind}'")
    if kind in RECURRENCE_KINDS:
        if params["num_v_heads"] is None:
            params["num_v_heads"] = params["num_heads"]
        if params["scale"] is None:
            params["scale"] = params["head_k_dim"] ** -0.5
    return LayerSpec(name=name, kind=kind, params=params, source=source)


def read_toml(path: Path) -> dict[str, Any]:
    """A spec file's TOML document; SpecError with a one-line message."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is not TOML
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except OSError as err:
        raise SpecError(f"{path}: cannot read spec file ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML ({err})") from None


def read_table(path: Path, name: str, holder: str = "a spec") -> dict[str, Any]:
    """The one table `name` a spec file holds (`holder` names the file's kind in the messages);
    SpecError with a one-line message (also k3compile.runtime.stack_spec's, for [model])."""
    document = read_toml(path)
    extra = sorted(set(document) - {name})
    if extra:
        raise SpecError(f"{path}: unknown table or key '{extra[0]}'; {holder} holds one [{name}] table")
    table = document.get(name)
    if isinstance(table, list) and table and all(isinstance(item, dict) for item in table):
        raise SpecError(f"{path}: [[{name}]] is an array of {len(table)} table(s); {holder} holds one [{name}] table")
    if not isinstance(table, dict):
        raise SpecError(f"{path}: missing [{name}] table")
    return table


def load_spec(path: str | Path) -> LayerSpec:
    """Read and validate a layer spec file; raises SpecError with a one-line message."""
    return spec_from_table(read_table(Path(path), "layer"), source=str(path))
