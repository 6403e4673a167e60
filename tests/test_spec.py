"""Layer specs: the examples load; every malformed spec is a one-line SpecError naming file and key."""

from __future__ import annotations

import pytest

from conftest import EXAMPLE_SPECS, one_line
from k3compile.errors import K3Error, SpecError
from k3compile.spec import KINDS, LayerSpec, load_spec, spec_from_table

KDA = """\
[layer]
name = "mykda"
kind = "kda"
num_heads = 2
head_k_dim = 16
head_v_dim = 16
"""
ATTNRES = """\
[layer]
name = "ar"
kind = "attnres"
hidden_size = 64
num_blocks = 4
block_size = 3
"""
MOE = """\
[layer]
name = "mymoe"
kind = "latent_moe"
hidden_size = 32
latent_dim = 16
num_experts = 8
top_k = 2
expert_ffn_dim = 12
"""


def write(tmp_path, text: str, name: str = "spec.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def replace_line(text: str, key: str, line: str | None) -> str:
    """The spec with the line of `key` replaced by `line` (None: removed)."""
    out = []
    for old in text.splitlines():
        if old.split("=")[0].strip() == key:
            if line is not None:
                out.append(line)
        else:
            out.append(old)
    return "\n".join(out) + "\n"


def build_ir(path):
    """What `k3c compile` does before any pass: load the spec and build its verified IR."""
    from k3compile.frontend import spec_to_module

    return spec_to_module(load_spec(path))


def spec_error(path, build: bool = False) -> str:
    with pytest.raises(SpecError) as info:
        build_ir(path) if build else load_spec(path)
    message = str(info.value)
    assert isinstance(info.value, K3Error) and isinstance(info.value, ValueError)
    assert one_line(message), f"not one line: {message!r}"
    assert str(path) in message, f"file not named: {message!r}"
    assert "Traceback" not in message
    return message


# --- the examples ---------------------------------------------------------------------------


def test_examples_exist():
    kinds = {load_spec(p).kind for p in EXAMPLE_SPECS}
    assert set(KINDS) <= kinds, f"an example per kind expected, missing {set(KINDS) - kinds}"


@pytest.mark.parametrize("path", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_example_loads_and_builds(path):
    spec = load_spec(path)
    assert isinstance(spec, LayerSpec)
    assert spec.name.isidentifier() and spec.kind in KINDS
    assert spec.source == str(path)
    module = build_ir(path)
    ops = list(module.ops)
    assert len(ops) == 1 and ops[0].sym_name.data == spec.name


def test_defaults_filled_in(tmp_path):
    spec = load_spec(write(tmp_path, KDA))
    assert spec.params["num_v_heads"] == 2
    assert spec.params["scale"] == pytest.approx(16 ** -0.5)
    assert spec.params["state_layout"] == "kv"
    assert spec.params["dtype"] == "bfloat16"


def test_public_load_spec_matches(tmp_path):
    import k3compile

    path = write(tmp_path, KDA)
    assert k3compile.load_spec(path) == load_spec(path)


def test_int_accepted_for_float_key(tmp_path):
    spec = load_spec(write(tmp_path, KDA + "scale = 1\n"))
    assert spec.params["scale"] == 1.0 and isinstance(spec.params["scale"], float)


# --- errors ---------------------------------------------------------------------------------


def test_unknown_key(tmp_path):
    message = spec_error(write(tmp_path, KDA + "head_dim = 16\n"))
    assert "'head_dim'" in message and "unknown key" in message


def test_missing_key(tmp_path):
    message = spec_error(write(tmp_path, replace_line(KDA, "head_v_dim", None)))
    assert "'head_v_dim'" in message and "missing" in message


@pytest.mark.parametrize("key", ["name", "kind"])
def test_missing_name_or_kind(tmp_path, key):
    message = spec_error(write(tmp_path, replace_line(KDA, key, None)))
    assert f"'{key}'" in message


@pytest.mark.parametrize(
    "value", ['"16"', "true", "16.0", "16.5"], ids=["string", "bool", "float", "fractional"]
)
def test_wrong_type_for_int(tmp_path, value):
    message = spec_error(write(tmp_path, replace_line(KDA, "head_k_dim", f"head_k_dim = {value}")))
    assert "'head_k_dim'" in message and "integer" in message


@pytest.mark.parametrize("value", ['"0.1"', "false", "nan", "inf"])
def test_wrong_type_for_float(tmp_path, value):
    message = spec_error(write(tmp_path, KDA + f"scale = {value}\n"))
    assert "'scale'" in message


@pytest.mark.parametrize("value", ["0", "-4"])
@pytest.mark.parametrize("key", ["num_heads", "head_k_dim", "head_v_dim", "num_v_heads"])
def test_non_positive_dim(tmp_path, key, value):
    text = replace_line(KDA, key, f"{key} = {value}") if key != "num_v_heads" else KDA + f"{key} = {value}\n"
    message = spec_error(write(tmp_path, text))
    assert f"'{key}'" in message and value in message


@pytest.mark.parametrize("value", ["0.0", "-1.0"])
def test_non_positive_float(tmp_path, value):
    message = spec_error(write(tmp_path, ATTNRES + f"eps = {value}\n"))
    assert "'eps'" in message


def test_num_v_heads_not_multiple(tmp_path):
    path = write(tmp_path, KDA + "num_v_heads = 3\n")
    message = spec_error(path, build=True)
    # from the IR verifier, prefixed by the file
    assert message.startswith(f"{path}: ")
    assert "num_v_heads" in message and "multiple" in message and "num_heads" in message


def test_num_v_heads_smaller_than_num_heads(tmp_path):
    text = replace_line(KDA, "num_heads", "num_heads = 4") + "num_v_heads = 2\n"
    message = spec_error(write(tmp_path, text), build=True)
    assert "num_v_heads" in message


def test_unknown_kind(tmp_path):
    message = spec_error(write(tmp_path, replace_line(KDA, "kind", 'kind = "mamba2"')))
    assert "'kind'" in message and "mamba2" in message


@pytest.mark.parametrize("name", ["my-layer", "2fast", "", "a b"])
def test_bad_name(tmp_path, name):
    message = spec_error(write(tmp_path, replace_line(KDA, "name", f'name = "{name}"')))
    assert "'name'" in message


@pytest.mark.parametrize("name, why", [
    ("class", "a Python keyword"), ("match", "a Python keyword"), ("case", "a Python keyword"),
    ("os", "a standard-library module: os.py in the output folder would shadow it"), ("math", "a standard-library"),
    ("tkinter", "a standard-library module"),  # whether or not this Python has it
])
def test_name_that_would_shadow_or_not_parse(tmp_path, name, why):
    """The name is the module's file name: a keyword cannot be imported by name, and out/os.py
    shadows os for any Python started in that folder."""
    message = spec_error(write(tmp_path, replace_line(KDA, "name", f'name = "{name}"')))
    assert f"key 'name': {name!r} is {why}" in message


@pytest.mark.parametrize("name", ["torch", "triton", "numpy", "typing_extensions", "k3compile", "xdsl", "sympy"])
def test_name_of_an_installed_module(tmp_path, name):
    """Any module Python here can import, not only those the compiled module imports: out/
    typing_extensions.py breaks `import torch` there, out/k3compile.py the package."""
    import importlib

    message = spec_error(write(tmp_path, replace_line(KDA, "name", f'name = "{name}"')))
    where = importlib.import_module(name).__file__
    assert f"key 'name': {name!r} is an importable module ({where}): {name}.py in the output folder" in message


def test_name_of_a_module_on_the_path(tmp_path, monkeypatch):
    """A module of the user's own, found on sys.path, is shadowed as well."""
    (tmp_path / "helpers.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(tmp_path)
    message = spec_error(write(tmp_path, replace_line(KDA, "name", 'name = "helpers"')))
    assert f"importable module ({tmp_path / 'helpers.py'})" in message


def test_name_of_its_own_compiled_module_on_the_path(tmp_path, monkeypatch):
    """The module compiled for this layer, in a folder on sys.path (a notebook compiling into
    its working folder), is no module to shadow: compiling the layer again replaces it."""
    import k3compile

    path = write(tmp_path, replace_line(KDA, "name", 'name = "mykda_here"'))
    k3compile.compile(path, out_dir=tmp_path)
    monkeypatch.syspath_prepend(tmp_path)
    assert k3compile.compile(path, out_dir=tmp_path).path == tmp_path / "mykda_here.py"


@pytest.mark.parametrize("name", ["torch_kda", "kda_os", "classy", "Match"])
def test_names_near_reserved_ones_are_fine(tmp_path, name):
    assert load_spec(write(tmp_path, replace_line(KDA, "name", f'name = "{name}"'))).name == name


# every compiled module's entries of each kind (README, docs/speculative-decoding.md): the
# speculative ones come with `-p derive-replay,lower-speculative`
ENTRIES = {
    "kda": ["recurrent", "decode", "chunk", "chunk_backward", "segment_summary", "chunk_segments",
            "chunk_backward_segments", "verify", "commit", "spec_step"],
    "attnres": ["aggregate", "aggregate_backward", "block_partials", "block_merge", "block_partials_backward",
                "block_merge_backward"],
    "latent_moe": ["route", "moe_prefill", "moe_decode", "moe_decode_warp", "moe", "moe_forward", "moe_backward"],
}


@pytest.mark.parametrize("kind, entry", [(kind, entry) for kind, entries in ENTRIES.items() for entry in entries])
def test_name_of_an_entry_of_its_kind(tmp_path, kind, entry):
    """A layer called `moe` would define the symbol @moe twice in its module (the layer's and the
    entry's): a SpecError at the name key, not a pipeline's 'Redefinition of symbol'."""
    import sys

    spec = {"kda": KDA, "attnres": ATTNRES, "latent_moe": MOE}[kind]
    message = spec_error(write(tmp_path, replace_line(spec, "name", f'name = "{entry}"')), build=True)
    if entry in sys.stdlib_module_names:  # chunk: out/chunk.py would shadow the standard library's first
        assert f"key 'name': {entry!r} is a standard-library module" in message
    else:
        assert f"key 'name': {entry!r} would define {entry!r} twice in the compiled module" in message


@pytest.mark.parametrize("name", ["moe2", "chunked", "kda", "my_route"])
def test_names_near_entries_are_fine(tmp_path, name):
    """Kernels are named after their layer (<name>_<what>), so no other name meets a symbol."""
    import k3compile

    assert k3compile.compile(write(tmp_path, replace_line(MOE, "name", f'name = "{name}"')), tmp_path).entries


def test_name_not_a_string(tmp_path):
    message = spec_error(write(tmp_path, replace_line(KDA, "name", "name = 3")))
    assert "'name'" in message


def test_bad_toml(tmp_path):
    message = spec_error(write(tmp_path, KDA + "num_heads = = 2\n"))
    assert "TOML" in message


def test_duplicate_key_is_bad_toml(tmp_path):
    message = spec_error(write(tmp_path, KDA + "num_heads = 4\n"))
    assert "TOML" in message


def test_missing_file(tmp_path):
    message = spec_error(tmp_path / "nope.toml")
    assert "no such" in message


def test_directory_instead_of_file(tmp_path):
    spec_error(tmp_path)


def test_not_utf8(tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b'[layer]\nname = "\xff\xfe"\n')
    spec_error(path)


def test_byte_order_mark_is_not_toml(tmp_path):
    """A spec saved with a UTF-8 byte-order mark (as some Windows editors do) loads as without it."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + KDA.encode())
    spec, plain = load_spec(path), load_spec(write(tmp_path, KDA))
    assert (spec.name, spec.kind, spec.params) == (plain.name, plain.kind, plain.params)


def test_array_of_layer_tables(tmp_path):
    message = spec_error(write(tmp_path, KDA.replace("[layer]", "[[layer]]") + "\n" + MOE.replace("[layer]", "[[layer]]")))
    assert "[[layer]] is an array of 2 table(s); a spec holds one [layer] table" in message


def test_missing_layer_table(tmp_path):
    message = spec_error(write(tmp_path, KDA.replace("[layer]", "[layers]")))
    assert "layer" in message


def test_empty_file(tmp_path):
    message = spec_error(write(tmp_path, ""))
    assert "[layer]" in message


def test_layer_not_a_table(tmp_path):
    message = spec_error(write(tmp_path, "layer = 3\n"))
    assert "[layer]" in message


def test_extra_top_level_table(tmp_path):
    message = spec_error(write(tmp_path, KDA + "\n[model]\nlayers = 3\n"))
    assert "'model'" in message


def test_extra_top_level_key(tmp_path):
    message = spec_error(write(tmp_path, "version = 1\n" + KDA))
    assert "'version'" in message


def test_nested_table_in_layer(tmp_path):
    message = spec_error(write(tmp_path, KDA + "\n[layer.extra]\nx = 1\n"))
    assert "'extra'" in message


@pytest.mark.parametrize("key,value", [("state_layout", '"xy"'), ("dtype", '"float64"'), ("state_layout", "1")])
def test_bad_enum(tmp_path, key, value):
    message = spec_error(write(tmp_path, KDA + f"{key} = {value}\n"))
    assert f"'{key}'" in message
    assert "one of" in message


def test_bad_activation(tmp_path):
    message = spec_error(write(tmp_path, MOE + 'activation = "relu2"\n'))
    assert "'activation'" in message


def test_top_k_exceeds_num_experts(tmp_path):
    path = write(tmp_path, replace_line(MOE, "top_k", "top_k = 9"))
    message = spec_error(path, build=True)
    assert message.startswith(f"{path}: ")
    assert "top_k" in message and "num_experts" in message


def test_top_k_equal_num_experts_is_fine(tmp_path):
    build_ir(write(tmp_path, replace_line(MOE, "top_k", "top_k = 8")))


@pytest.mark.parametrize("latent", [32, 40])
def test_latent_dim_not_below_hidden_size(tmp_path, latent):
    path = write(tmp_path, replace_line(MOE, "latent_dim", f"latent_dim = {latent}"))
    message = spec_error(path, build=True)
    assert message.startswith(f"{path}: ")
    assert "latent_dim" in message and "hidden_size" in message


def test_latent_dim_zero_is_fine(tmp_path):
    build_ir(write(tmp_path, replace_line(MOE, "latent_dim", "latent_dim = 0")))


def test_shared_experts_need_ffn_dim(tmp_path):
    message = spec_error(write(tmp_path, MOE + "num_shared_experts = 1\n"), build=True)
    assert "shared_ffn_dim" in message


def test_spec_from_table_errors_name_source():
    with pytest.raises(SpecError) as info:
        spec_from_table(dict(name="x", kind="kda", num_heads=2, head_k_dim=8), source="my.toml")
    assert str(info.value).startswith("my.toml") and "'head_v_dim'" in str(info.value)


@pytest.mark.parametrize("value", [2**63, 2**64 + 1, 10**30])
@pytest.mark.parametrize("kind, key", [("kda", "num_heads"), ("kda", "head_k_dim"), ("kda", "head_v_dim"),
                                       ("kda", "num_v_heads"), ("attnres", "num_blocks"),
                                       ("latent_moe", "num_experts"), ("latent_moe", "latent_dim")])
def test_integer_past_64_bits(tmp_path, kind, key, value):
    """TOML's integers, and the IR's, are 64-bit: past them a key is out of range, named as such
    (not wrapped to a negative count, not an internal error of the IR)."""
    spec = {"kda": KDA, "attnres": ATTNRES, "latent_moe": MOE}[kind]
    message = spec_error(write(tmp_path, replace_line(spec, key, None) + f"{key} = {value}\n"))
    assert f"key '{key}': expected an integer in " in message and f".. 2**63 - 1, got {value}" in message


def test_largest_64_bit_integer_is_a_valid_spec(tmp_path):
    assert load_spec(write(tmp_path, replace_line(KDA, "head_k_dim", f"head_k_dim = {2**63 - 1}"))).params[
        "head_k_dim"] == 2**63 - 1


def test_spec_from_table_rejects_bool_for_int():
    with pytest.raises(SpecError, match="'num_heads'"):
        spec_from_table(dict(name="x", kind="kda", num_heads=True, head_k_dim=8, head_v_dim=8))
