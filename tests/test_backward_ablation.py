"""bench/backward_ablation.py's edits still find what they edit in a freshly printed gradients
kernel (the printer moves on; an ablation that no longer applies must fail here, on the CPU, not
in a device run): each variant is valid Python, differs from the module where it says it edits,
and leaves every other kernel alone."""

from __future__ import annotations

import ast
import re
import sys

import pytest

from conftest import REPO, recurrence_table

sys.path.insert(0, str(REPO / "bench"))
import backward_ablation  # noqa: E402


@pytest.fixture(scope="module")
def module_text(compile_layer):
    layer = compile_layer(**recurrence_table("kda", H=2, K=128, V=128, name="ablation_kda", qk_l2norm=True,
                                             gate_input="clamped", gate_lower_bound=-5.0))
    return layer.path.read_text()


def kernels(text: str) -> dict[str, str]:
    """The module's @triton.jit kernels' source by name."""
    return {node.name: ast.get_source_segment(text, node) for node in ast.parse(text).body
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel")}


@pytest.mark.parametrize("name", list(backward_ablation.VARIANTS))
def test_each_variant_edits_the_gradients_kernel_only(name, module_text, tmp_path):
    edit, warps, _ = backward_ablation.VARIANTS[name]
    text = backward_ablation.write_variant(module_text, name, tmp_path).read_text()
    before, after = kernels(module_text), kernels(text)
    assert before.keys() == after.keys()
    changed = {k for k in before if before[k] != after[k]}
    assert changed == ({k for k in before if k.endswith("_backward_gradients_kernel")} if edit else set())
    launches = re.findall(r"_backward_gradients_kernel\[grid\]\((?:.*\n)*?\s+num_warps=(\d+),", text)
    assert launches and all(w == str(warps) for w in launches) if warps else text.count("num_warps=") == \
        module_text.count("num_warps=")


def test_an_edit_that_finds_nothing_says_so(module_text):
    with pytest.raises(SystemExit, match="no value-block loop"):
        backward_ablation.half_value_blocks("def kda_backward_gradients_kernel():\n    pass\n")
