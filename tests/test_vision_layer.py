"""The vision layer on one device: the spec kind and k3.vision op, VisionLayer against the
float64 reference (ir/vision.py: mask materialised, LayerNorm / GELU / rotations written out),
forward and gradients, odd grids, videos, extreme scores, the attention backends, bad input."""

from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, bad_input, run_cli
from k3compile.errors import SpecError
from k3compile.frontend import spec_to_module
from k3compile.ir import vision as reference
from k3compile.spec import load_spec, spec_from_table
from k3compile.vision import Segment, VisionLayer, packed_attention

SMALL = dict(hidden_size=20, num_heads=3, head_dim=12, mlp_dim=22, rope_theta=50.0)
GRIDS = [(1, 3, 5), (2, 2, 3), (1, 1, 1), (1, 7, 2), (3, 1, 4)]  # odd sides, a one-patch image, videos


def small(dtype=torch.float64, **changes):
    spec = spec_from_table(dict(name="vit", kind="vision", **{**SMALL, **changes}))
    op = next(iter(spec_to_module(spec).ops))
    layer = VisionLayer.from_spec(spec, dtype=dtype)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return op, layer


def patches(grids) -> int:
    return sum(f * h * w for f, h, w in grids)


def test_spec_defaults_are_moonvit():
    spec = spec_from_table({"name": "vit", "kind": "vision"})
    p = spec.params
    assert (p["hidden_size"], p["num_heads"], p["head_dim"], p["mlp_dim"]) == (1152, 16, 72, 4304)
    assert (p["patch_size"], p["num_layers"], p["position"], p["rope_theta"]) == (14, 27, "rope_2d", 10000.0)
    assert load_spec(EXAMPLES / "vision.toml").params == {**p}


def test_ir_holds_the_spec(capsys):
    code, out, err = run_cli(capsys, "ir", EXAMPLES / "vision.toml")
    assert code == 0 and "k3.vision @moonvit <hidden_size = 1152, num_heads = 16, head_dim = 72" in out


@pytest.mark.parametrize("table, words", [
    (dict(head_dim=70), ["head_dim must be a multiple of 4", "70"]),
    (dict(position="rope_1d"), ["position", "rope_2d, none"]),
    (dict(num_layers=0), ["num_layers"]),
    (dict(rope_theta=1.0), ["rope_theta"]),
])
def test_bad_specs_one_line(table, words):
    with pytest.raises(SpecError) as info:
        spec_to_module(spec_from_table({"name": "vit", "kind": "vision", **table}))
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_head_dim_off_four_is_fine_without_rope():
    spec_to_module(spec_from_table({"name": "vit", "kind": "vision", "head_dim": 70, "position": "none"}))


def test_compile_says_no_kernels(capsys):
    err = bad_input(capsys, "compile", EXAMPLES / "vision.toml", "--stdout")
    assert "no kernel lowering for k3.vision" in err


@pytest.mark.parametrize("position", ["rope_2d", "none"])
def test_layer_matches_reference_forward_and_gradients(position):
    op, layer = small(position=position)
    x, dy = torch.randn(patches(GRIDS), SMALL["hidden_size"], dtype=torch.float64), torch.randn(
        patches(GRIDS), SMALL["hidden_size"], dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    weights = {name: t.detach().clone().requires_grad_(True) for name, t in layer.state_dict().items()}
    want = reference.vision_layer(op, x_ref, weights, GRIDS)
    (want * dy).sum().backward()
    x.requires_grad_(True)
    got = layer(x, grids=GRIDS)
    (got * dy).sum().backward()
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-10, rtol=1e-10)
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
        torch.testing.assert_close(p.grad, weights[name].grad, atol=1e-9, rtol=1e-9, msg=lambda m, n=name: f"{n}: {m}")


def test_layer_fp32_close_to_reference_with_steep_scores():
    """q and k projections scaled up: softmax rows near one-hot; fp32 against float64."""
    op, layer = small(dtype=torch.float32)
    with torch.no_grad():
        layer.qkv.weight[: 2 * 36] *= 6.0
    x = torch.randn(patches(GRIDS), SMALL["hidden_size"]) * 3
    got = layer(x, grids=GRIDS)
    want = reference.vision_layer(op, x.double(), layer.state_dict(), GRIDS)
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4)


def test_rope_positions_follow_rows_and_columns():
    """A rotation by the column on even pairs and the row on odd ones: transposing a 2x3 grid's
    patches to 3x2 changes the output (the layer sees the grid, not just the count)."""
    op, layer = small()
    x = torch.randn(6, SMALL["hidden_size"], dtype=torch.float64)
    assert not torch.allclose(layer(x, grids=[(1, 2, 3)]), layer(x, grids=[(1, 3, 2)]))
    torch.testing.assert_close(layer(x, grids=[(1, 3, 2)]), reference.vision_layer(op, x, layer.state_dict(), [(1, 3, 2)]))


def test_images_do_not_see_each_other():
    """Changing one image's patches leaves every other image's outputs bit-identical."""
    _, layer = small()
    x = torch.randn(patches(GRIDS), SMALL["hidden_size"], dtype=torch.float64)
    changed = x.clone()
    changed[15:27] = torch.randn(12, SMALL["hidden_size"], dtype=torch.float64)  # the second image (2x2x3)
    a, b = layer(x, grids=GRIDS), layer(changed, grids=GRIDS)
    assert torch.equal(a[:15], b[:15]) and torch.equal(a[27:], b[27:]) and not torch.equal(a[15:27], b[15:27])


def test_segments_of_whole_images_equal_grids():
    _, layer = small()
    x = torch.randn(patches(GRIDS), SMALL["hidden_size"], dtype=torch.float64)
    segments = [Segment(g, 0, patches([g])) for g in GRIDS]
    assert torch.equal(layer(x, grids=GRIDS), layer(x, segments=segments))


def test_flex_backend_forward_matches_sdpa():
    """flex_attention with the images' block mask (forward only on the CPU) against SDPA per image
    and the float64 reference."""
    lengths = [3, 130, 1, 77, 129]  # straddling flex's 128-blocks
    q, k, v = (torch.randn(sum(lengths), 2, 8) for _ in range(3))
    want = reference.packed_attention(q, k, v, lengths, 8 ** -0.5)
    for backend in ("sdpa", "flex"):
        got = packed_attention(q, k, v, lengths, backend)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5, msg=lambda m, b=backend: f"{b}: {m}")


@pytest.mark.parametrize("call, error, words", [
    (lambda layer, x: layer(x[:, :5], grids=GRIDS), ValueError, ["x", "[N, 20]", "(54, 5)"]),
    (lambda layer, x: layer(x[:-1], grids=GRIDS), ValueError, ["x", "54 rows", "53"]),
    (lambda layer, x: layer(x.float(), grids=GRIDS), ValueError, ["x", "torch.float64", "torch.float32"]),
    (lambda layer, x: layer(x), ValueError, ["grids / segments"]),
    (lambda layer, x: layer(x, grids=[(1, 0, 3)]), ValueError, ["grids", "(1, 0, 3)"]),
    (lambda layer, x: layer(x, grids=GRIDS, backend="flash"), ValueError, ["backend", "'flash'"]),
    (lambda layer, x: layer(x, segments=[Segment((1, 2, 2), 0, 5)]), ValueError, ["segments", "start < stop"]),
    (lambda layer, x: packed_attention(x, x, x, [54]), ValueError, ["q", "[N, H, D]"]),
    (lambda layer, x: packed_attention(*(x.reshape(54, 4, 5),) * 3, [25, 24]), ValueError, ["lengths", "54"]),
    (lambda layer, x: packed_attention(x.reshape(54, 4, 5), x.reshape(54, 5, 4), x.reshape(54, 4, 5), [54]),
     ValueError, ["k, v", "(54, 5, 4)"]),
    (lambda layer, x: packed_attention(x.reshape(54, 4, 5).long(), *(x.reshape(54, 4, 5),) * 2, [54]), TypeError,
     ["q", "floating-point"]),
])
def test_bad_calls_one_line(call, error, words):
    _, layer = small()
    x = torch.randn(patches(GRIDS), SMALL["hidden_size"], dtype=torch.float64)
    with pytest.raises(error) as info:
        call(layer, x)
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value), str(info.value)
