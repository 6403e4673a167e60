"""Model specs: one TOML file, one `[model]` table describing a K3-style block stack (docs/block-stack.md).

    [model]
    hidden_size = 7168
    num_layers = 93
    layer_pattern = "kda,kda,kda,attn"   # repeated (and cut) to num_layers: K3's 3 KDA : 1 attention
    block_size = 12                      # layers per Block AttnRes block
    kda_heads = 64
    kda_head_dim = 128
    attn_heads = 64
    attn_head_dim = 128
    ffn = "dense"                        # or "moe": LatentMoE (k3compile.ops.moe), with the keys below
    ffn_hidden_size = 18432
    # ffn = "moe": num_experts, top_k, expert_ffn_dim; optional latent_dim, num_shared_experts,
    # shared_ffn_dim, moe_activation (K3: 896 experts top-16, FFN 3072, latent 3584, 2 shared, situ_glu)

checked key by key as layer specs are (k3compile.spec: one-line SpecError naming the key, expected
vs got). Needs no torch, so the pipeline planner (`k3c plan-pipeline`) reads it cheaply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3compile.errors import SpecError
from k3compile.ir.choices import GLU_ACTIVATIONS
from k3compile.spec import Key, check_keys, read_table

MIXERS = ("kda", "attn")
FFNS = ("dense", "moe")
# aggregate: attnres_aggregate at every point (one phase, fused backward); two_phase: Block AttnRes's
# block_partials + block_merge at every point; torch: the aggregate's definition in torch ops (the
# baseline, and fast under Triton's interpreter); none: plain residuals (the memory baseline)
ATTNRES_FORMS = ("aggregate", "two_phase", "torch", "none")
DTYPE_NAMES = ("float32", "bfloat16", "float16")

SCHEMA = {
    "name": Key(str, default="model"),
    "hidden_size": Key(int),
    "num_layers": Key(int),
    "layer_pattern": Key(str, default="kda,kda,kda,attn"),
    "block_size": Key(int, default=12),
    "num_blocks": Key(int, default=None),  # default: ceil(num_layers / block_size); checked if given
    "kda_heads": Key(int, default=None),
    "kda_head_dim": Key(int, default=None),
    "attn_heads": Key(int, default=None),
    "attn_head_dim": Key(int, default=None),
    "ffn": Key(str, default="dense", choices=FFNS),
    "ffn_hidden_size": Key(int, default=None),
    "num_experts": Key(int, default=None),
    "top_k": Key(int, default=None),
    "expert_ffn_dim": Key(int, default=None),
    "latent_dim": Key(int, default=0, minimum=0),  # 0: the experts run at hidden_size (no latent projections)
    "num_shared_experts": Key(int, default=0, minimum=0),
    "shared_ffn_dim": Key(int, default=0, minimum=0),
    "moe_activation": Key(str, default="swiglu", choices=GLU_ACTIVATIONS),
    "vocab_size": Key(int, default=0, minimum=0),  # 0: no embedding or LM head (hidden states in and out)
    "attnres": Key(str, default="aggregate", choices=ATTNRES_FORMS),
    "checkpoint_attnres": Key(bool, default=True),
    "eps": Key(float, default=1e-6, minimum=0, exclusive=True),
    "dtype": Key(str, default="bfloat16", choices=DTYPE_NAMES),
}
# keys a mixer or FFN needs when the spec uses it
NEEDS = {"kda": ("kda_heads", "kda_head_dim"), "attn": ("attn_heads", "attn_head_dim"),
         "dense": ("ffn_hidden_size",), "moe": ("num_experts", "top_k", "expert_ffn_dim")}


@dataclass(frozen=True)
class ModelSpec:
    """A validated `[model]` table, defaults filled in; `layers` is the pattern spelled out."""

    params: dict[str, Any] = field(default_factory=dict)
    layers: tuple[str, ...] = ()
    source: str = "<model spec>"

    def __getattr__(self, key: str):
        try:
            return self.__dict__["params"][key]
        except KeyError:
            raise AttributeError(key) from None

    def table(self) -> dict[str, Any]:
        """The `[model]` table of this spec (model_spec_from_table(spec.table()) == spec)."""
        return {key: value for key, value in self.params.items() if value is not None}


def model_spec_from_table(table: dict[str, Any], source: str = "<model spec>") -> ModelSpec:
    """Validate a `[model]` table (already parsed) into a ModelSpec."""
    where = f"{source}: [model]"
    unknown = sorted(set(table) - set(SCHEMA))
    if unknown:
        raise SpecError(f"{where}: unknown key '{unknown[0]}'; allowed: {', '.join(SCHEMA)}")
    params = check_keys(where, SCHEMA, table)
    pattern = tuple(word.strip() for word in params["layer_pattern"].split(","))
    if not all(word in MIXERS for word in pattern):
        raise SpecError(f"{where}: key 'layer_pattern': expected comma-separated words of {', '.join(MIXERS)}, "
                        f"got {params['layer_pattern']!r}")
    layers = tuple(pattern[i % len(pattern)] for i in range(params["num_layers"]))
    blocks = math.ceil(params["num_layers"] / params["block_size"])
    if params["num_blocks"] is None:
        params["num_blocks"] = blocks
    elif params["num_blocks"] != blocks:
        raise SpecError(f"{where}: key 'num_blocks': expected ceil(num_layers / block_size) = {blocks} "
                        f"({params['num_layers']} layers in blocks of {params['block_size']}), got {params['num_blocks']}")
    for word in (*sorted(set(layers)), params["ffn"]):
        for key in NEEDS[word]:
            if params[key] is None:
                raise SpecError(f"{where}: missing key '{key}' ({SCHEMA[key].describe()}), needed by "
                                f"{'ffn' if word in FFNS else 'layer_pattern'} {word!r}")
    if params["ffn"] == "moe" and params["num_shared_experts"] and not params["shared_ffn_dim"]:
        raise SpecError(f"{where}: key 'shared_ffn_dim': expected an integer >= 1 with num_shared_experts = "
                        f"{params['num_shared_experts']}, got {params['shared_ffn_dim']}")
    return ModelSpec(params=params, layers=layers, source=source)


def load_model_spec(path: str | Path) -> ModelSpec:
    """Read and validate a model spec file; raises SpecError with a one-line message."""
    table = read_table(Path(path), "model", "a model spec")
    return model_spec_from_table(table, source=str(path))
