"""What a new user trips over: bad input anywhere (files, devices, sizes the kernels cannot hold,
arguments that would be ignored) is exit 2 and one line naming it; an internal error is exit 3.
Also the in-process compile cache and `k3c verify --quick`."""

from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, RecurrenceShape, bad_input, layer_op, recurrence_inputs

TINY = """\
[layer]
name = "{name}"
kind = "{kind}"
num_heads = {heads}
head_k_dim = {K}
head_v_dim = {V}
dtype = "float32"
"""


def write_spec(tmp_path, name="tiny", kind="gla", heads=1, K=8, V=6, extra=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY.format(name=name, kind=kind, heads=heads, K=K, V=V) + extra)
    return path


# --- files that are not what they should be -------------------------------------------------


def test_opt_of_a_binary_file(capsys, tmp_path):
    path = tmp_path / "program"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    assert bad_input(capsys, "opt", path) == f"k3c opt: error: {path}: not UTF-8 text (byte 8); expected IR (.mlir)"


def test_opt_of_binary_stdin(capsys, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe\x00"), encoding="utf-8"))
    assert "<stdin>: not UTF-8 text (byte 0)" in bad_input(capsys, "opt", "-")


@pytest.mark.parametrize("command", [["compile", "-o", "OUT"], ["ir"], ["verify", "--device", "cpu"], ["prove"]])
def test_a_directory_as_spec(capsys, tmp_path, command):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    assert f"{tmp_path}: cannot read spec file (Is a directory)" in bad_input(capsys, argv[0], tmp_path, *argv[1:])


def test_output_folder_that_cannot_be_made(capsys, tmp_path):
    (tmp_path / "a_file").write_text("")
    message = bad_input(capsys, "compile", EXAMPLES / "gla.toml", "-o", tmp_path / "a_file" / "out")
    assert "a_file" in message and "cannot write gla.py there (Not a directory)" in message


# --- arguments that would be ignored or misread ---------------------------------------------


def test_empty_output_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where an empty -o would have written
    message = bad_input(capsys, "compile", EXAMPLES / "gla.toml", "-o", "")
    assert message == "k3c compile: error: -o: expected an output directory, got an empty path"
    assert not list(tmp_path.iterdir())


def test_dtype_without_shape(capsys, tmp_path):
    message = bad_input(capsys, "compile", EXAMPLES / "gla.toml", "-o", tmp_path, "--dtype", "float32")
    assert "--dtype" in message and "--shape" in message
    assert not list(tmp_path.iterdir())


NO_CUDA = "no CUDA GPU here (torch.cuda.is_available() is False); use cpu for Triton's interpreter"


@pytest.mark.parametrize("device, message", [
    ("tpu", "device 'tpu': expected cpu or cuda (cuda:N for the N-th GPU)"),
    ("meta", "device 'meta': the kernels run on cpu (Triton's interpreter) or cuda, not meta"),
    ("cuda", f"device 'cuda': {NO_CUDA}"),
    ("cuda:1", f"device 'cuda:1': {NO_CUDA}"),
])
def test_verify_on_a_device_this_machine_lacks(capsys, tmp_path, device, message):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert bad_input(capsys, "verify", write_spec(tmp_path), "--device", device) == f"k3c verify: error: {message}"


def test_verify_device_is_an_argument_error():
    from k3compile.errors import ArgumentError
    from k3compile.spec import load_spec
    from k3compile.checking.verify import verify

    with pytest.raises(ArgumentError, match="^device 'tpu'") as info:
        verify(load_spec(EXAMPLES / "gla.toml"), device="tpu")
    assert isinstance(info.value, ValueError)


def test_verify_seed_torch_cannot_take(capsys, tmp_path):
    message = bad_input(capsys, "verify", write_spec(tmp_path), "--device", "cpu", "--seed", str(2**70))
    assert message == f"k3c verify: error: seed: expected an integer in -2**63 .. 2**64 - 1, got {2**70}"


def test_tune_without_a_gpu_prints_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert bad_input(capsys, "tune", EXAMPLES / "kda.toml", "--shape", "1,64") == (
        "k3c tune: error: no CUDA GPU here: tuning times the kernels on the GPU they will run on")


def test_frozen_without_a_gpu(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    message = bad_input(capsys, "compile", EXAMPLES / "kda.toml", "-o", tmp_path, "--frozen", "--shape", "1,64")
    assert message == ("k3c compile: error: --frozen: no GPU here (torch sees no CUDA device), and tuned configs are "
                       f"cached per GPU: pass --gpu NAME to embed those of GPU NAME for kda ({EXAMPLES / 'kda.toml'})")


def test_pipeline_without_kernels_for_the_layer(capsys, tmp_path):
    message = bad_input(capsys, "compile", EXAMPLES / "latent_moe.toml", "-o", tmp_path, "-p", "fuse-attnres")
    assert "no kernel lowering for k3.latent_moe (kind 'latent_moe') in pipeline 'fuse-attnres'" in message


# --- sizes the Triton kernels cannot hold: refused when lowering, naming the key ------------


@pytest.mark.parametrize("K, V, pipeline, key, limit", [
    (100000, 16, None, "head_k_dim", 256),
    (512, 16, "lower-recurrent", "head_k_dim", 256),  # every kernel holds whole key rows
    (16, 8192, None, "head_v_dim", 4096),  # the chunk prepare's [16, V] tiles
    (16, 2048, "lower-recurrent,derive-chunkwise{chunk-size=64},fuse-chunkwise", "head_v_dim", 1024),
])
def test_dims_past_the_kernels_limits(capsys, tmp_path, K, V, pipeline, key, limit):
    spec = write_spec(tmp_path, kind="kda", K=K, V=V)
    message = bad_input(capsys, "compile", spec, "-o", tmp_path / "out", *(["-p", pipeline] if pipeline else []))
    value = K if key == "head_k_dim" else V
    assert message.startswith(f"k3c compile: error: {spec}: key '{key}' = {value} exceeds the Triton kernels' "
                              f"limit of {limit} (")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("K, V, pipeline", [
    (256, 4096, None),  # both at their limits
    (16, 8192, "lower-recurrent,lower-decode"),  # no chunk tile: value blocks of block-v
    (16, 2048, "lower-recurrent,derive-chunkwise{chunk-size=32},fuse-chunkwise"),
])
def test_dims_within_the_limits_compile(tmp_path, K, V, pipeline):
    from k3compile.driver import lower
    from k3compile.spec import load_spec

    assert "def recurrent(" in lower(load_spec(write_spec(tmp_path, kind="kda", K=K, V=V)), pipeline).source


def test_state_tile_past_tritons_block_size(capsys, tmp_path):
    """[256, block-v 8192] is 2**21 elements: Triton refuses a block of more than 2**20."""
    message = bad_input(capsys, "compile", write_spec(tmp_path, kind="kda", K=256, V=8192), "-o", tmp_path / "out",
                        "-p", "lower-recurrent{block-v=8192}")
    assert "the state tile [256, 8192] of kernel @tiny_recurrent exceeds Triton's 1048576 elements per block" in message


@pytest.mark.parametrize("chunk_size, block_v, refused", [(64, 32, True), (64, 16, True), (64, 64, False),
                                                          (32, 32, False)])
def test_backward_value_blocks_triton_faults_on(capsys, tmp_path, chunk_size, block_v, refused):
    """Value blocks under 64 columns at 64-row chunks: Triton 3.6's Hopper lowering of the gradients
    kernel's products read shared memory out of bounds (compute-sanitizer on the H100); refused
    when compiling, the neighbouring tilings (which ran) still compile."""
    spec = write_spec(tmp_path, kind="kda", K=16, V=16)
    pipeline = (f"lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward{{chunk-size={chunk_size}}},"
                f"lower-backward{{block-v={block_v}}}")
    if refused:
        message = bad_input(capsys, "compile", spec, "-o", tmp_path / "out", "-p", pipeline)
        assert message == (f"k3c compile: error: {spec}: block-v {block_v} at chunk size {chunk_size} (kernel "
                           "@tiny_backward_gradients): Triton 3.6 lowers these tiles' Hopper products to an "
                           "out-of-bounds shared-memory read; use block-v 64 or smaller chunks")
    else:
        from k3compile.driver import lower
        from k3compile.spec import load_spec

        assert "def chunk_backward(" in lower(load_spec(spec), pipeline).source


def test_attnres_hidden_size_by_the_warps(tmp_path):
    from k3compile.driver import lower
    from k3compile.errors import UnsupportedError
    from k3compile.spec import load_spec

    path = tmp_path / "wide.toml"
    path.write_text('[layer]\nname = "wide"\nkind = "attnres"\nhidden_size = 20000\nnum_blocks = 2\nblock_size = 2\n')
    limit = r"key 'hidden_size' = 20000 exceeds the Triton kernels' limit of 16384 \(kernel @wide_aggregate holds its rows"
    with pytest.raises(UnsupportedError, match=limit + " in the registers of its 8 warps"):
        lower(load_spec(path), "fuse-attnres{num-warps=8}")
    # by default the kernel takes the warps its row needs: 4 for K3's 7168 columns, 16 here
    assert "num_warps=16," in lower(load_spec(path)).source
    path.write_text(path.read_text().replace("20000", "70000"))  # past 32 warps of 2048 columns
    with pytest.raises(UnsupportedError, match="limit of 65536 .* in the registers of its 32 warps"):
        lower(load_spec(path))


def test_moe_experts_by_the_warps(tmp_path):
    """The router holds 16 rows' scores for every expert (padded to a power of two) in registers."""
    from k3compile.driver import lower
    from k3compile.errors import UnsupportedError
    from k3compile.spec import load_spec

    path = tmp_path / "many.toml"
    path.write_text('[layer]\nname = "many"\nkind = "latent_moe"\nhidden_size = 64\nnum_experts = 1100\n'
                    'top_k = 8\nexpert_ffn_dim = 32\n')
    limit = r"key 'num_experts' = 1100 exceeds the Triton kernels' limit of 1024 \(kernel @many_router_top_k holds"
    with pytest.raises(UnsupportedError, match=limit + ".* registers of its 8 warps"):
        lower(load_spec(path))
    assert "def route(" in lower(load_spec(path), "lower-moe-routing{num-warps=16}").source


def test_more_value_heads_than_grid_axis_1_holds(capsys, tmp_path):
    spec = write_spec(tmp_path, kind="kda", heads=70000, K=4, V=4)
    message = bad_input(capsys, "compile", spec, "-o", tmp_path / "out", "-p", "lower-recurrent")
    assert "key 'num_v_heads' = 70000 exceeds the Triton kernels' limit of 65535" in message


# --- k3compile.compile's module cache --------------------------------------------------------


def test_compile_cache_keys_modules_by_their_source(tmp_path, monkeypatch):
    """Two specs of one name get two files (neither overwrites the other's module), both run
    their own layer; the same spec again reuses its file, unwritten."""
    from k3compile.driver import compile as k3_compile
    from k3compile.ir import reference

    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "cache"))
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    narrow = k3_compile(write_spec(tmp_path / "a", name="same", V=6))
    wide = k3_compile(write_spec(tmp_path / "b", name="same", V=10))
    assert narrow.path != wide.path and narrow.path.parent == wide.path.parent
    assert narrow.path.name.startswith("same-") and narrow.path.is_file() and wide.path.is_file()
    for layer, V in ((narrow, 6), (wide, 10)):
        inputs = recurrence_inputs("gla", "kv", RecurrenceShape(B=1, T=3, H=1, HV=1, K=8, V=V))
        o, final = layer.recurrent(**inputs, output_final_state=True)
        ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
        assert o.shape[-1] == V and (o.double() - ref_o).abs().max() < 1e-5
        assert (final.double() - ref_final).abs().max() < 1e-5
    written = narrow.path.stat().st_mtime_ns, narrow.path.stat().st_ino
    again = k3_compile(tmp_path / "a" / "same.toml")
    assert again.path == narrow.path
    assert (again.path.stat().st_mtime_ns, again.path.stat().st_ino) == written
    assert sorted(p.name for p in narrow.path.parent.iterdir()) == sorted({narrow.path.name, wide.path.name})
