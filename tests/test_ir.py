"""IR: printed IR re-parses (custom and generic form) to identical text; passes are registered."""

from __future__ import annotations

import importlib
import inspect
import io
import pkgutil
from pathlib import Path

import pytest
from xdsl.parser import Parser
from xdsl.passes import ModulePass
from xdsl.printer import Printer

from conftest import EXAMPLE_SPECS
from k3compile.driver import schedule
from k3compile.frontend import spec_to_module
from k3compile.ir.dialects import make_context
from k3compile.pipeline import DEFAULT_PIPELINES, run_pipeline
from k3compile.spec import load_spec, spec_from_table



def example_params():
    return [pytest.param(p, id=p.stem) for p in EXAMPLE_SPECS]


def parse(text: str):
    return Parser(make_context(), text).parse_module()


def custom(module) -> str:
    return str(module)


def generic(module) -> str:
    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(module)
    return stream.getvalue()


def assert_round_trips(text: str) -> None:
    module = parse(text)
    module.verify()
    assert custom(module) == text, "custom form does not re-print identically"
    generic_text = generic(module)
    assert generic_text != text and '"k3' in generic_text  # really the generic form
    again = parse(generic_text)
    again.verify()
    assert custom(again) == text, "generic form does not re-parse to the same IR"
    assert generic(again) == generic_text


@pytest.mark.parametrize("path", example_params())
def test_layer_ir_round_trips(path):
    assert_round_trips(custom(spec_to_module(load_spec(path))))


@pytest.mark.parametrize("path", example_params())
def test_scheduled_ir_round_trips(path):
    spec = load_spec(path)
    compilation = schedule(spec)
    assert_round_trips(custom(compilation.scheduled))


@pytest.mark.parametrize("path", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_passes_on_reparsed_ir_give_the_same_schedule(path):
    """Running the kind's pipeline on re-parsed IR gives what the driver gives."""
    spec = load_spec(path)
    module = parse(custom(spec_to_module(spec)))
    run_pipeline(module, DEFAULT_PIPELINES[spec.kind])
    assert custom(module) == custom(schedule(spec).scheduled)


def test_small_scale_round_trips():
    """Minimal reproducer: a recurrence whose scale prints as 1e-05."""
    spec = spec_from_table(dict(name="s", kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4, scale=1e-5))
    assert_round_trips(custom(spec_to_module(spec)))


@pytest.mark.parametrize("name", ["true", "false"])
def test_layer_named_like_a_bool_round_trips(name):
    spec = spec_from_table(dict(name=name, kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4))
    assert_round_trips(custom(schedule(spec, "lower-recurrent").scheduled))


@pytest.mark.parametrize("name", ["inf", "nan", "TRUE", "layer_1"])
def test_other_layer_names_round_trip(name):
    spec = spec_from_table(dict(name=name, kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4))
    assert_round_trips(custom(schedule(spec, "lower-recurrent").scheduled))


@pytest.mark.parametrize("scale", [0.5, 0.1, 0.08838834764831845, 3.0, 123.25])
def test_plain_float_scales_round_trip(scale):
    spec = spec_from_table(dict(name="s", kind="gla", num_heads=1, head_k_dim=4, head_v_dim=4, scale=scale))
    text = custom(spec_to_module(spec))
    assert_round_trips(text)
    assert next(iter(parse(text).ops)).scale.value.data == scale


def test_layer_ir_holds_the_spec():
    spec = spec_from_table(dict(name="abc_layer", kind="gated_deltanet", num_heads=3, num_v_heads=6, head_k_dim=7,
                                head_v_dim=9, state_layout="vk"))
    op = next(iter(spec_to_module(spec).ops))
    assert op.name == "k3.recurrence" and op.sym_name.data == "abc_layer"
    assert op.gate.data == "scalar" and bool(op.delta_rule.value.data)
    assert (op.num_heads.value.data, op.num_v_heads.value.data) == (3, 6)
    assert (op.head_k_dim.value.data, op.head_v_dim.value.data) == (7, 9)
    assert op.state_layout.data == "vk"
    assert op.scale.value.data == pytest.approx(7 ** -0.5)


@pytest.mark.parametrize("kind,gate,delta", [("kda", "channel", True), ("gated_deltanet", "scalar", True),
                                              ("deltanet", None, True), ("gla", "channel", False)])
def test_lowered_stages_follow_the_member(kind, gate, delta):
    spec = spec_from_table(dict(name="m", kind=kind, num_heads=1, head_k_dim=4, head_v_dim=4))
    module = schedule(spec, "lower-recurrent").scheduled
    names = [op.name for op in module.walk()]
    entries = [op for op in module.ops if op.name == "k3s.entry"]
    assert [e.sym_name.data for e in entries] == ["recurrent"] and entries[0].source.string_value() == "m"
    decays = [op for op in module.walk() if op.name == "k3s.decay"]
    assert [d.gate.data for d in decays] == ([gate] if gate else [])
    assert names.count("k3s.delta_correct") == (1 if delta else 0)
    roles = {op.sym_name.data: op.role.data for op in module.walk() if op.name == "k3s.tensor_arg"}
    assert roles["g"] == ("input" if gate else "forbidden")
    assert roles["beta"] == ("input" if delta else "forbidden")


def test_block_v_option_reaches_the_ir():
    spec = spec_from_table(dict(name="m", kind="kda", num_heads=1, head_k_dim=4, head_v_dim=40))
    module = schedule(spec, "lower-recurrent{block-v=16}").scheduled
    tiles = [op for op in module.walk() if op.name == "k3s.state_tile"]
    assert len(tiles) == 1 and tiles[0].block_v.value.data == 16


# --- pass registration ------------------------------------------------------------------------


def passes_defined_in(package: str, modules: list[str]) -> dict[str, type[ModulePass]]:
    defined = {}
    for name in modules:
        module = importlib.import_module(f"{package}.{name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, ModulePass) and obj is not ModulePass and obj.__module__ == module.__name__:
                defined[obj.name] = obj
    return defined


def test_every_pass_is_registered():
    """Every pass of passes/ is in PASSES, the Triton backend's own in BACKEND_PASSES."""
    import k3compile.passes as passes_pkg
    from k3compile.backends.triton import BACKEND_PASSES
    from k3compile.passes import PASSES

    pipeline_passes = passes_defined_in("k3compile.passes", [info.name for info in pkgutil.iter_modules(passes_pkg.__path__)])
    import k3compile.backends.triton as backend_pkg

    backend_passes = passes_defined_in("k3compile.backends.triton",
                                       [info.name for info in pkgutil.iter_modules(backend_pkg.__path__)])
    assert pipeline_passes, "no passes found"
    assert set(pipeline_passes) == set(PASSES), f"defined {sorted(pipeline_passes)} vs registered {sorted(PASSES)}"
    assert set(backend_passes) == set(BACKEND_PASSES), f"defined {sorted(backend_passes)} vs registered {sorted(BACKEND_PASSES)}"
    for registry, defined in ((PASSES, pipeline_passes), (BACKEND_PASSES, backend_passes)):
        for name, factory in registry.items():
            cls = factory()
            assert cls is defined[name] and cls.name == name


@pytest.mark.parametrize("name", ["lower-recurrent", "fuse-attnres"])
def test_known_passes_registered(name):
    from k3compile.passes import PASSES

    assert name in PASSES and PASSES[name]().name == name


def test_default_pipelines_use_registered_passes():
    from k3compile.passes import PASSES
    from k3compile.spec import KINDS

    assert set(DEFAULT_PIPELINES) == set(KINDS)
    for pipeline in DEFAULT_PIPELINES.values():
        for step in filter(None, pipeline.split(",")):
            assert step.split("{")[0] in PASSES


def test_unknown_pass_is_ir_error():
    from k3compile.errors import IRError

    module = spec_to_module(spec_from_table(dict(name="m", kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4)))
    with pytest.raises(IRError, match="no-such-pass"):
        run_pipeline(module, "no-such-pass")


@pytest.mark.parametrize("block_v", [0, 3, 24])
def test_bad_block_v_is_ir_error(block_v):
    from k3compile.errors import IRError

    module = spec_to_module(spec_from_table(dict(name="m", kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4)))
    with pytest.raises(IRError, match="block-v"):
        run_pipeline(module, f"lower-recurrent{{block-v={block_v}}}")


@pytest.mark.parametrize("pipeline", ["lower-recurrent{num-warps=0}", "lower-recurrent{num-warps=3}",
                                      "lower-recurrent{num-warps=64}", "fuse-attnres{num-warps=3}"])
def test_bad_num_warps_is_ir_error(pipeline):
    from k3compile.errors import IRError

    module = spec_to_module(spec_from_table(dict(name="m", kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4)))
    with pytest.raises(IRError, match="num-warps must be a power of two in 1..32"):
        run_pipeline(module, pipeline)


def test_malformed_pipeline_is_ir_error():
    """xDSL's ArgSpecParseError is a BaseException; it must still come out as an IRError."""
    from k3compile.errors import IRError

    module = spec_to_module(spec_from_table(dict(name="m", kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4)))
    with pytest.raises(IRError, match="options by spaces"):
        run_pipeline(module, "lower-recurrent{block-v=64,num-warps=8}")


def test_lowering_twice_adds_one_entry():
    spec = spec_from_table(dict(name="m", kind="kda", num_heads=1, head_k_dim=4, head_v_dim=4))
    module = schedule(spec, "lower-recurrent,lower-recurrent").scheduled
    entries = [op for op in module.ops if op.name == "k3s.entry"]
    assert len(entries) == 1


def test_recurrence_pass_leaves_attnres_alone():
    spec = spec_from_table(dict(name="a", kind="attnres", hidden_size=8, num_blocks=2, block_size=1))
    module = schedule(spec, "lower-recurrent").scheduled
    assert [op.name for op in module.ops] == ["k3.attnres"]


TWO_LAYERS = """builtin.module {
  k3.recurrence @a <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @b <gate = none, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
}
"""


def test_two_recurrence_layers_lower():
    module = parse(TWO_LAYERS)
    run_pipeline(module, "lower-recurrent")
    sources = sorted(op.source.string_value() for op in module.ops if op.name == "k3s.entry")
    assert sources == ["a", "b"]


# --- the driver's public API ------------------------------------------------------------------


def test_public_compile_from_path(tmp_path):
    import k3compile
    from conftest import EXAMPLES

    layer = k3compile.compile(EXAMPLES / "gla.toml", out_dir=tmp_path)
    assert layer.path == tmp_path / "gla.py" and layer.path.is_file()
    assert "recurrent" in layer.entries
    assert callable(layer.recurrent)
    with pytest.raises(AttributeError, match="no entry"):
        layer.aggregate  # noqa: B018
    assert layer.spec.kind == "gla"


def test_compile_default_cache_dir(tmp_path, monkeypatch):
    from k3compile.driver import compile as k3_compile

    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "cache"))
    spec = spec_from_table(dict(name="cached", kind="deltanet", num_heads=1, head_k_dim=4, head_v_dim=4))
    layer = k3_compile(spec)
    assert layer.path.is_file() and (tmp_path / "cache") in layer.path.parents


def test_compile_errors_are_k3_errors(tmp_path):
    from k3compile.driver import compile as k3_compile
    from k3compile.errors import K3Error, UnsupportedError
    from conftest import EXAMPLES

    with pytest.raises(UnsupportedError, match="no kernel lowering"):
        k3_compile(EXAMPLES / "latent_moe.toml", out_dir=tmp_path, pipeline="fuse-attnres")
    with pytest.raises(K3Error):
        k3_compile(EXAMPLES / "kda.toml", out_dir=tmp_path, pipeline="no-such-pass")
    assert not list(tmp_path.iterdir())


def test_a_guards_value_read_outside_it_is_refused():
    """A pass that moves a reader of a guarded value out of its k3s.when builds IR the verifier
    refuses: a launch that skips the guard would leave the value unset (the parser refuses it in
    text, tests/filecheck/verify/when_guard.mlir)."""
    from xdsl.utils.exceptions import VerifyException

    from k3compile.ir import k3s

    text = (Path(__file__).parent / "filecheck" / "verify" / "when_guard.mlir").read_text()
    module = Parser(make_context(), text).parse_module()
    module.verify()
    when = next(op for op in module.walk() if isinstance(op, k3s.WhenOp))
    spill = when.body.block.last_op
    spill.detach()
    when.parent_block().insert_op_after(spill, when)
    with pytest.raises(VerifyException, match="%P is read outside it"):
        module.verify()


def test_a_when_of_a_flag_its_kernel_does_not_declare_fails_verify():
    """`k3s.when <flag = ...>` refers to a flag its kernel declares: a pass that misspells it gets
    a one-line VerifyException from verify() naming the flag and the kernel's flags, not an error
    of the printer (in text: tests/filecheck/verify/when_guard.mlir, MISSPELT)."""
    from xdsl.dialects.builtin import StringAttr
    from xdsl.utils.exceptions import VerifyException

    from k3compile.ir import k3s

    text = (Path(__file__).parent / "filecheck" / "verify" / "when_guard.mlir").read_text()
    module = Parser(make_context(), text).parse_module()
    when = next(op for op in module.walk() if isinstance(op, k3s.WhenOp))
    assert when.kernel().sym_name.data == "prepare" and when.is_on() is False
    when.flag = StringAttr("SPIL_P")
    with pytest.raises(VerifyException) as refused:
        module.verify()
    assert str(refused.value) == ("k3s.when <flag = SPIL_P>: its kernel @prepare declares no flag SPIL_P "
                                  "(its flags: SPILL_P)")


# --- references and grids as typed attributes (issue 39, item 3) -------------------------------


def outlined_gla():
    spec = spec_from_table(dict(name="m", kind="gla", num_heads=1, head_k_dim=4, head_v_dim=4))
    return schedule(spec, "lower-recurrent,lower-decode,outline-kernels").scheduled


@pytest.mark.parametrize("op_name, key, message", [
    ("k3s.launch", "kernel", "k3s.launch: kernel = @m_recurent: the module has no symbol @m_recurent"),
    ("k3s.entry", "source", "k3s.entry @recurrent: source = @m_recurent: the module has no symbol @m_recurent"),
])
def test_a_misspelt_reference_fails_verify(op_name, key, message):
    """A pass that writes a reference to no symbol builds IR the verifier refuses, in one line
    naming the op and the symbol (text: tests/filecheck/verify/symbol_references.mlir)."""
    from xdsl.dialects.builtin import SymbolRefAttr
    from xdsl.utils.exceptions import VerifyException

    module = outlined_gla()
    module.verify()
    next(op for op in module.walk() if op.name == op_name).properties[key] = SymbolRefAttr("m_recurent")
    with pytest.raises(VerifyException) as raised:
        module.verify()
    assert str(raised.value) == message


def test_an_unknown_grid_axis_is_refused_where_a_kernel_is_built():
    """A grid is a list of GridAxis words: a pass naming an axis that does not exist fails where
    it builds the kernel, in one line listing the axes (text: tests/filecheck/verify/k3s_values.mlir)."""
    from k3compile.ir import k3s
    from k3compile.passes.common import props

    with pytest.raises(ValueError) as raised:
        props(k3s.KernelOp, grid=[k3s.GridAxis.CHUNK, "value_hed"])
    assert str(raised.value) == ("k3s.kernel: property 'grid' takes a list [...] of "
                                 f"{', '.join(k3s.GridAxis)}; got value_hed")
    grid = props(k3s.KernelOp, grid=[k3s.GridAxis.CHUNK, "value_head"])["grid"]
    assert [axis.data for axis in grid] == [k3s.GridAxis.CHUNK, k3s.GridAxis.VALUE_HEAD]
