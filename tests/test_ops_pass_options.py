"""k3compile.ops.pass_options and $K3C_PASS_OPTIONS: a layer compiled through k3compile.ops under
chosen pass options runs that schedule (its module has the chosen form's kernels), gives the
definition's values and gradients, is cached apart from the default module, and bad options are
refused in one line naming what is wrong.

Block AttnRes's phase 1 at D = 40 (not a power of two), 3 queries, 2 representatives, 5 odd
token rows, fp32 in Triton's interpreter; the modules allocate outputs NaN-filled (conftest),
so an unwritten element fails the comparison. Fresh random inputs every run (conftest's seed).
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import one_line
from k3compile.ops import layers, pass_options
from k3compile.ops.attnres import AttnResKey, attnres_block_partials
from k3compile.ops.pipeline_options import ENVIRONMENT, chosen, pipeline_with

D, Q, N = 40, 3, 2
COLUMNS = "derive-block-attnres{partials-schedule=columns},derive-block-attnres-backward{partials-backward=columns}"


@pytest.fixture
def ops_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "k3c_cache"))
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    monkeypatch.setattr(layers, "_LOADED", {})


def inputs():
    representatives = torch.randn(N, 1, 5, D) * torch.tensor([0.7, 2.5])[:, None, None, None]
    return representatives, torch.randn(Q, D) * 3 / math.sqrt(D), 1 + 0.3 * torch.randn(Q, D)


def phase_one(representatives, queries, gains, dlse, dmix):
    """The partials and, through them, every input's gradient of sum(dlse lse) + sum(dmix mix)."""
    leaves = [x.detach().clone().requires_grad_() for x in (representatives, queries, gains)]
    lse, mix = attnres_block_partials(*leaves)
    ((lse * dlse).sum() + (mix * dmix).sum()).backward()
    return [lse.detach(), mix.detach(), *(x.grad for x in leaves)]


def definition(representatives, queries, gains, dlse, dmix):
    """The same in float64 autograd of the reference semantics."""
    leaves = [x.detach().double().requires_grad_() for x in (representatives, queries, gains)]
    lse, numerators = [], []
    for j in range(Q):
        normed = leaves[0] / leaves[0].pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        scores = (normed * leaves[1][j] * leaves[2][j]).sum(-1)  # [n, B, T]
        weights = torch.softmax(scores, dim=0)
        lse.append(torch.logsumexp(scores, dim=0))
        numerators.append((weights[..., None] * leaves[0]).sum(0))
    lse, mix = torch.stack(lse), torch.stack(numerators)
    ((lse * dlse.double()).sum() + (mix * dmix.double()).sum()).backward()
    return [lse.detach(), mix.detach(), *(x.grad for x in leaves)]


def test_chosen_forms_run_and_agree_with_the_definition(ops_cache):
    tensors = inputs()
    dlse, dmix = torch.randn(Q, 1, 5), torch.randn(Q, 1, 5, D)
    want = definition(*tensors, dlse, dmix)
    default = phase_one(*tensors, dlse, dmix)
    with pass_options(COLUMNS):
        assert chosen() == COLUMNS
        columns = phase_one(*tensors, dlse, dmix)
    assert chosen() == ""
    for name, got_default, got_columns, expected in zip(("lse", "mix", "drepresentatives", "dqueries", "dgains"),
                                                         default, columns, want, strict=True):
        for form, got in (("default", got_default), ("columns", got_columns)):
            assert torch.isfinite(got).all(), f"{form} {name}: non-finite (unwritten?)"
            err = ((got.double() - expected).norm() / expected.norm()).item()
            assert err < 1e-5, f"{form} {name}: relative error {err:.1e}"
    # two modules of the one key, the chosen one with the columns kernels, the default without
    (key, _), (other, _) = layers._LOADED
    assert key == other and isinstance(key, AttnResKey) and key.hidden_size == D
    modules = {options: module for (_, options), module in layers._LOADED.items()}
    assert set(modules) == {"", COLUMNS}
    sources = {options: open(module.__file__).read() for options, module in modules.items()}
    assert "_block_partials_columns_kernel(" in sources[COLUMNS]
    assert "_block_partials_backward_columns_kernel(" in sources[COLUMNS]
    assert "_block_partials_columns_kernel(" not in sources[""]
    assert "_options_" in modules[COLUMNS].__file__ and "_options_" not in modules[""].__file__


def test_the_environment_sets_them_and_the_context_wins(ops_cache, monkeypatch):
    monkeypatch.setenv(ENVIRONMENT, f" {COLUMNS} ")
    assert chosen() == COLUMNS
    with pass_options(""):
        assert chosen() == ""
        with pass_options("derive-block-attnres{partials-schedule=query-blocks}"):
            assert chosen() == "derive-block-attnres{partials-schedule=query-blocks}"
        assert chosen() == ""
    assert chosen() == COLUMNS
    tensors = inputs()
    dlse, dmix = torch.randn(Q, 1, 5), torch.randn(Q, 1, 5, D)
    for got, want in zip(phase_one(*tensors, dlse, dmix), definition(*tensors, dlse, dmix), strict=True):
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-5
    (_, options), = layers._LOADED
    assert options == COLUMNS


def test_options_replace_only_the_passes_named():
    pipeline = "fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward,outline-kernels"
    assert pipeline_with("attnres", pipeline, "derive-block-attnres{partials-schedule=columns columns-rows=8}") == (
        "fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=columns columns-rows=8},"
        "derive-block-attnres-backward,outline-kernels")
    assert pipeline_with("attnres", pipeline, "") == pipeline


@pytest.mark.parametrize("options,message", [
    ("derive-backward{chunk-size=32}", "'derive-backward' is not a pass of the attnres pipeline (fuse-attnres, "),
    ("derive-block-attnres{partials-schedule=columns},derive-block-attnres{columns-rows=8}", "is given twice"),
    ("derive-block-attnres{partials-schedule=columns", "column 47: Malformed pass arguments"),
    ("derive-block-attnres{partials-shedule=columns}", "derive-block-attnres has no option 'partials-shedule'"),
    ("derive-block-attnres{columns-rows=four}", "option 'columns-rows' expects an integer, got 'four'"),
])
def test_bad_options_are_refused_in_one_line(ops_cache, options, message):
    with pass_options(options), pytest.raises(ValueError) as err:
        attnres_block_partials(*inputs())
    text = str(err.value)
    assert one_line(text) and message in text, text
    assert not layers._LOADED


def test_options_must_be_text():
    with pytest.raises(TypeError, match="expected the options as text"):
        with pass_options({"derive-block-attnres": "partials-schedule=columns"}):
            pass
