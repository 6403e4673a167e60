"""What made `k3c compile` faster (issue 39) decides the same as before: the backend passes'
read-only kernel comparison against the copy-and-compare it replaced, their launching entries
found in one walk against k3s.launching_entry, a compile that verifies its IR once against
per-pass verification when a pass breaks the IR, and the frontend's symbol probe read back from
the cache folder against probing again."""

from __future__ import annotations

import json

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import VerifyException

from conftest import EXAMPLE_SPECS
from k3compile.backends.triton.legalize import LegalizeTritonPass
from k3compile.driver import lower, schedule
from k3compile.ir import k3s
from k3compile.backends.triton import guard_spill_only_stages as guard
from k3compile.backends.triton import merge_identical_kernels as merge
from k3compile.passes.outline_kernels import OutlineKernelsPass
from k3compile.pipeline import run_passes
from k3compile.spec import load_spec

SPECS = {p.stem: p for p in EXAMPLE_SPECS}


def outlined(name: str, pipeline: str | None = None) -> ModuleOp:
    """An example's module as guard-spill-only-stages gets it (outlined, legalized)."""
    spec = load_spec(SPECS[name])
    module = schedule(spec, pipeline).scheduled
    OutlineKernelsPass().apply(Context(), module)
    LegalizeTritonPass(source=spec.source).apply(Context(), module)
    return module


# --- the copy-and-compare the passes did before (main at cc09d17) ------------------------------

def copied_code_of(kernel):
    body = kernel.body.clone()
    for op in body.walk():
        for key in merge.LAUNCH_ONLY_IN_BODY.get(type(op), ()):
            op.properties.pop(key, None)
    return body


def copied_in_argument_order(body, names):
    body = body.clone()
    block = body.block
    old = list(block.args)
    by_name = {arg.name_hint: arg for arg in old}
    for name in names:
        moved = block.insert_arg(by_name[name].type, len(block.args))
        moved.name_hint = name
        by_name[name].replace_all_uses_with(moved)
    for arg in old:
        block.erase_arg(arg)
    return body


def copied_equivalent(body, other) -> bool:
    names = [arg.name_hint for arg in other.block.args]
    if sorted(arg.name_hint for arg in body.block.args) != sorted(names):
        return False
    return copied_in_argument_order(body, names).is_structurally_equivalent(other)


def copied_without(kernel, stages):
    body = kernel.body.clone()
    doomed = [copy for copy, op in zip(body.walk(), kernel.body.walk(), strict=True) if op in stages]
    for op in reversed(doomed):
        Rewriter.erase_op(op)
    for arg in [a for a in body.block.args if not a.uses]:
        body.block.erase_arg(arg)
    return body


@pytest.mark.parametrize("name, pipeline", [("kda", None), ("kda", "summary-first"), ("latent_moe", None),
                                            ("attnres", None)])
def test_equivalent_decides_as_the_copies_did(name, pipeline):
    """Every ordered pair of kernels: merge's comparison (launch-only properties left out), guard's
    (each kernel less the stages that only write what the other does not) and guard's same-body
    check, read-only, agree with xDSL's structural equivalence of copies with those stages erased."""
    if pipeline == "summary-first":
        pipeline = "derive-segment-scan,lower-segment-scan,derive-chunkwise,fuse-chunkwise"
    kernels = k3s.outlined_kernels(outlined(name, pipeline), "test")
    same = {"merge": 0, "guard": 0, "body": 0}
    for a in kernels:
        for b in kernels:
            merged = merge.equivalent(a.body, b.body, ignore_launch_only=True)
            assert merged == copied_equivalent(copied_code_of(a), copied_code_of(b)), (a.sym_name, b.sym_name)
            body = merge.equivalent(a.body, b.body)
            assert body == copied_equivalent(a.body, b.body), (a.sym_name, b.sym_name)
            if extra := guard.write_only_stages(a, guard.written(b)):
                theirs = guard.write_only_stages(b, guard.written(a))
                guarded = merge.equivalent(a.body, b.body, without=extra, other_without=theirs)
                assert guarded == copied_equivalent(copied_without(a, extra), copied_without(b, theirs)), \
                    (a.sym_name, b.sym_name)
                same["guard"] += guarded
            same["merge"] += merged and a is not b
            same["body"] += body and a is not b
    if name == "kda":  # the pairs the passes act on are among them
        assert same["merge"] and same["guard"]


def test_a_state_tiles_block_v_is_launch_only():
    """Two kernels of the same code whose state tiles differ in their value block (each launch's
    block_v) are the same code to merge-identical-kernels and differ to guard-spill-only-stages,
    as with the copies."""
    kernels = k3s.outlined_kernels(outlined("kda"), "test")
    a, b = next((a, b) for a in kernels for b in kernels if a is not b and merge.same_code(a, b)
                and any(isinstance(op, k3s.StateTileOp) for op in a.body.walk()))
    for op in b.body.walk():
        if isinstance(op, k3s.StateTileOp):
            op.properties["block_v"] = IntegerAttr(op.block_v.value.data * 2, op.block_v.type)
    assert merge.equivalent(a.body, b.body, ignore_launch_only=True)
    assert copied_equivalent(copied_code_of(a), copied_code_of(b))
    assert not merge.equivalent(a.body, b.body)
    assert not copied_equivalent(a.body, b.body)


@pytest.mark.parametrize("name", ["kda", "latent_moe", "attnres"])
def test_launching_entries_are_launching_entry(name):
    module = outlined(name)
    entries = merge.launching_entries(module)
    kernels = [op for op in module.ops if isinstance(op, k3s.KernelOp)]
    assert kernels and entries == {kernel: k3s.launching_entry(kernel) for kernel in kernels}


class BreakWarps(ModulePass):
    """Gives every outlined kernel num_warps = 3 (not a power of two: the verifier refuses it)."""

    name = "break-warps"

    def apply(self, ctx, op):
        for kernel in op.ops:
            if isinstance(kernel, k3s.KernelOp):
                kernel.properties["num_warps"] = IntegerAttr(3, kernel.num_warps.type)


class Crash(ModulePass):
    """A pass that fails on what it is given (as a pass may on IR the verifier would refuse)."""

    name = "crash"

    def apply(self, ctx, op):
        raise RuntimeError("crash: a pass run on invalid IR")


def scheduled_kda() -> ModuleOp:
    return schedule(load_spec(SPECS["kda"])).scheduled


@pytest.mark.parametrize("tail", [[], [Crash()], [OutlineKernelsPass()]])
def test_verify_once_reports_what_verify_each_does(tail):
    """A pass that breaks the IR, then nothing, a pass that crashes, or one that works: verifying
    once raises what verifying after each pass raises (the verifier's error after the breaking
    pass), not the crash of a later pass."""
    errors = {}
    for verify in ("each", "once"):
        with pytest.raises(VerifyException) as err:
            run_passes(scheduled_kda(), [BreakWarps(), *tail], verify=verify)
        errors[verify] = str(err.value)
    assert "num_warps must be a power of two" in errors["each"]
    assert errors["once"] == errors["each"]


def test_verify_once_verifies_the_result():
    module = scheduled_kda()
    run = run_passes(module, [OutlineKernelsPass()], verify="once")
    assert [name for name, _ in run.timings] == ["outline-kernels"]
    with pytest.raises(RuntimeError, match="crash"):
        run_passes(scheduled_kda(), [OutlineKernelsPass(), Crash()], verify="once")


@pytest.mark.parametrize("each", [False, True])
def test_compile_that_breaks_the_ir_fails_as_with_verify_each(monkeypatch, each):
    """A backend pass that breaks the IR: the compile raises the verifier's error whether it
    verifies once (the module it would print) or after every pass (K3C_VERIFY_EACH=1)."""
    if each:
        monkeypatch.setenv("K3C_VERIFY_EACH", "1")
    else:
        monkeypatch.delenv("K3C_VERIFY_EACH", raising=False)
    monkeypatch.setattr(merge.MergeIdenticalKernelsPass, "apply", lambda self, ctx, op: BreakWarps().apply(ctx, op))
    with pytest.raises(VerifyException, match="num_warps must be a power of two"):
        lower(load_spec(SPECS["kda"]))


def test_compile_timings_name_the_backend_passes_and_the_verification():
    names = [name for name, _ in lower(load_spec(SPECS["kda"])).timings]
    assert names[-7:] == ["triton:outline-kernels", "triton:legalize-triton", "triton:lower-to-triton",
                          "triton:guard-spill-only-stages", "triton:merge-identical-kernels", "verify", "print-triton"]


# --- the frontend's symbol probe, kept on disk ------------------------------------------------

@pytest.fixture
def symbols_cache(tmp_path, monkeypatch):
    from k3compile import frontend

    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path))
    frontend.module_symbols.cache_clear()
    yield tmp_path / "symbols"
    frontend.module_symbols.cache_clear()


def test_module_symbols_are_probed_once_per_source_version(symbols_cache, monkeypatch):
    from k3compile import frontend

    probed = frontend.probe_symbols("attnres")
    assert frontend.module_symbols("attnres") == probed
    [path] = symbols_cache.glob("attnres-*.json")
    assert path == frontend.symbols_cache_path("attnres")
    frontend.module_symbols.cache_clear()  # a new process: read back, not probed
    monkeypatch.setattr(frontend, "probe_symbols", lambda kind: pytest.fail("probed again"))
    assert frontend.module_symbols("attnres") == probed
    assert frontend.name_clash("aggregate", "attnres") == "aggregate"


@pytest.mark.parametrize("text", ["", "{", '{"fixed": ["a"]}', '{"fixed": "a", "suffixes": []}', "[1, 2]"])
def test_a_damaged_symbols_file_is_probed_again_and_replaced(symbols_cache, text):
    from k3compile import frontend

    path = frontend.symbols_cache_path("attnres")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    stale = path.with_name("attnres-0000000000000000.json")  # another source version's
    stale.write_text("{}")
    assert frontend.module_symbols("attnres") == frontend.probe_symbols("attnres")
    assert sorted(symbols_cache.iterdir()) == [path]
    assert json.loads(path.read_text())["fixed"] == sorted(frontend.probe_symbols("attnres")[0])


def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    from k3compile import frontend

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "file"))  # a file, not a folder
    frontend.module_symbols.cache_clear()
    try:
        assert frontend.module_symbols("attnres") == frontend.probe_symbols("attnres")
    finally:
        frontend.module_symbols.cache_clear()


def test_source_digest_changes_with_a_source(tmp_path):
    from k3compile.frontend import source_digest

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("x = 1\n")
    (tmp_path / "a" / "notes.txt").write_text("not source")
    before = source_digest([tmp_path / "a"])
    (tmp_path / "a" / "notes.txt").write_text("still not source")
    assert source_digest([tmp_path / "a"]) == before
    (tmp_path / "a" / "x.py").write_text("x = 2\n")
    assert source_digest([tmp_path / "a"]) != before
    (tmp_path / "a" / "x.py").write_text("x = 1\n")
    (tmp_path / "a" / "y.py").write_text("")
    assert source_digest([tmp_path / "a"]) != before
