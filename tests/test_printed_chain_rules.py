"""The printer's chain rules in float64: the Triton text of each store (and of its load) against
the semantics the proof takes and torch autograd of ir/reference.py's input forms."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import sympy
import torch

from conftest import recurrence_table
from k3compile.backends.triton.lower import STAGE_CHOICES, write_choices
from k3compile.backends.triton.printer.common import register
from k3compile.checking import exact_backward
from k3compile.checking.prove import derived
from k3compile.ir import k3s
from k3compile.spec import spec_from_table

# The stores' formulas are two texts: the printer's Triton (backends/triton/printer/adjoint_stages.py)
# and exact_backward's sympy, which the proof takes. Here the printer's text for a store (and for
# its load) runs in float64 with numpy standing in for triton.language, in a chunk tile wider than
# the tokens and channels (masked rows and columns holding garbage), and must agree with the
# semantics to 1e-12, which must agree with torch autograd of ir/reference.py's input forms.


class Registers(np.ndarray):
    """A tile in registers: `.to(dtype)` keeps it float64."""

    def to(self, dtype):
        return self


def tile(x) -> Registers:
    return np.asarray(x, dtype=np.float64).view(Registers)


class Memory:
    """A tensor argument: `name + offsets` is a Pointer."""

    def __init__(self, values) -> None:
        self.data = np.array(values, dtype=np.float64).ravel()

    def __add__(self, offsets):
        return Pointer(self, np.asarray(offsets))


class Pointer:
    __array_ufunc__ = None  # `pointer + offsets` is the pointer's, not numpy's

    def __init__(self, memory: Memory, offsets) -> None:
        self.memory, self.offsets = memory, offsets

    def __add__(self, offsets):
        return Pointer(self.memory, self.offsets + np.asarray(offsets))


def masked(pointer: Pointer, mask):
    memory, offsets = pointer.memory, pointer.offsets
    shape = np.broadcast_shapes(offsets.shape, np.shape(mask) if mask is not None else ())
    keep = np.broadcast_to(True if mask is None else mask, shape)
    return memory, np.broadcast_to(offsets, shape), keep


class NumpyTriton:
    """What the printed stores and loads call of triton.language, in float64."""

    float32 = None
    sqrt, exp, log, minimum, maximum = (staticmethod(lambda *a, f=f: tile(f(*a)))
                                        for f in (np.sqrt, np.exp, np.log, np.minimum, np.maximum))

    @staticmethod
    def sigmoid(x):
        return tile(1 / (1 + np.exp(-x)))

    @staticmethod
    def where(condition, a, b):
        return tile(np.where(condition, a, b))

    @staticmethod
    def sum(x, axis=None):
        return tile(np.sum(x, axis=axis))

    @staticmethod
    def load(pointer, mask=None, other=0.0):
        memory, offsets, keep = masked(pointer, mask)
        return tile(np.where(keep, memory.data[np.where(keep, offsets, 0)], other))

    @staticmethod
    def store(pointer, value, mask=None):
        memory, offsets, keep = masked(pointer, mask)
        memory.data[offsets[keep]] = np.broadcast_to(value, offsets.shape)[keep]

    @staticmethod
    def atomic_add(pointer, value, mask=None):
        memory, offsets, keep = masked(pointer, mask)
        np.add.at(memory.data, np.atleast_1d(offsets[keep]), np.atleast_1d(np.broadcast_to(value, offsets.shape)[keep]))


def printed(print_op, op) -> str:
    from k3compile.backends.triton.printer import TritonPrinter
    from k3compile.backends.triton.printer.common import Code

    printer = TritonPrinter()
    printer.code = Code()
    getattr(printer, print_op)(op)
    return printer.code.text()


def reference_forms(layer_op, raw: dict, T: int, K: int) -> dict:
    """ir/reference.py's recurrence_inputs on one head's raw tiles ({name: [T, K] or [T, 1], A_log,
    dt_bias}), as float64 tensors that require grad -> ({name: tensor}, {input: its loaded tile})."""
    from k3compile.ir.reference import recurrence_inputs

    tensors = {name: torch.tensor(np.asarray(value, dtype=np.float64), requires_grad=True)
               for name, value in raw.items()}
    q = tensors.get("q", torch.zeros(T, K, dtype=torch.float64))
    k = tensors.get("k", torch.zeros(T, K, dtype=torch.float64))
    g = tensors.get("g")
    if g is not None:
        g = g[None, :, None] if g.shape[1] == K and layer_op.gate.data == "channel" else g[:, 0][None, :, None]
    beta = tensors["beta"][:, 0][None, :, None] if "beta" in tensors else None
    A_log = tensors["A_log"].reshape(1) if "A_log" in tensors else None
    dt_bias = tensors["dt_bias"].reshape(-1) if "dt_bias" in tensors else None
    q, k, g, beta = recurrence_inputs(layer_op, q[None, :, None], k[None, :, None], g, beta, A_log, dt_bias)
    loaded = {"q": q[0, :, 0], "k": k[0, :, 0]}
    if g is not None:
        loaded["g"] = g[0, :, 0] if layer_op.gate.data == "channel" else g[0, :, 0][:, None]
    if beta is not None:
        loaded["beta"] = beta[0, :, 0][:, None]
    return tensors, loaded


PRINTED_FORMS = [
    ("kda", {"qk_l2norm": True, "gate_input": "softplus", "beta_input": "logits"}),
    ("kda", {"gate_input": "bounded", "gate_lower_bound": -3.0, "beta_input": "logits_neg_eigval"}),
    ("kda", {"gate_input": "clamped", "gate_lower_bound": -1.0}),
    ("gated_deltanet", {"qk_l2norm": True, "gate_input": "bounded", "beta_input": "logits"}),
    ("gated_deltanet", {"gate_input": "softplus", "beta_input": "logits_neg_eigval"}),
    ("gated_deltanet", {"gate_input": "clamped", "gate_lower_bound": -1.0}),
    ("gla", {}),
    ("deltanet", {}),
]


def semantics_in_float64(form, raw: dict, cotangent) -> tuple[np.ndarray, dict]:
    """(load_result, store_gradients) on float64 raw tiles, evaluated at 30 digits."""
    def exact(value):
        return sympy.Float(value, 30) if np.ndim(value) == 0 else sympy.Matrix(np.atleast_2d(value)).applyfunc(
            lambda e: sympy.Float(e, 30))

    exact_raw = {name: exact(value) for name, value in raw.items()}
    epsilon = sympy.Float(1e-6, 30)  # the kernels' and the reference's
    gradients = exact_backward.store_gradients(form, sympy.Matrix(cotangent), exact_raw, epsilon)
    gradients = {name: np.array(sympy.Matrix([g] if np.ndim(raw[name]) == 0 else g).evalf(), dtype=np.float64)
                 .reshape(np.shape(raw[name])) for name, g in gradients.items()}
    return np.array(exact_backward.load_result(form, exact_raw, epsilon).evalf(), dtype=np.float64), gradients


PRINT_LOAD = {k3s.LoadChunkOp: "print_k3s_load_chunk", k3s.LoadGateOp: "print_k3s_load_gate",
              k3s.LoadBetaOp: "print_k3s_load_beta"}


def run_printed(load, store, raw: dict, cotangent, rng) -> tuple[np.ndarray, dict]:
    """The printed load and store on one head's tiles of T tokens and their width, in a tile of 8
    rows and 4 columns whose masked entries hold garbage: (the loaded rows, {name: gradient})."""
    (T, width), rows, cols = cotangent.shape, 8, 4
    key_width = cotangent.shape[1] if store.of.data != "v" else 3
    program = {"H": 1, "HV": 1, "i_h": 0, "i_hv": 0, "K": key_width, "V": width,
               "t_c": np.arange(rows), "m_c": np.arange(rows) < T, "o_k": np.arange(cols),
               "m_k": np.arange(cols) < key_width, "o_v": np.arange(cols), "m_v": np.arange(cols) < width}
    memory = {n: Memory(v) for n, v in raw.items()} | {f"d{n}": Memory(np.zeros(np.size(v))) for n, v in raw.items()}
    padded = rng.standard_normal((rows, cols if width > 1 else 1))
    padded[:T, :width] = cotangent
    namespace = {"tl": NumpyTriton, **program, **memory,
                 register(store.cotangent): tile(padded if width > 1 else padded[:, 0])}
    exec(printed(PRINT_LOAD[type(load)], load), namespace)
    loaded = np.asarray(namespace[register(load.results[0])], dtype=np.float64).reshape(rows, -1)[:T, :width]
    exec(printed("print_k3s_store_cotangent", store), namespace)
    return loaded, {name: memory[f"d{name}"].data.reshape(np.shape(value)) for name, value in raw.items()}


@pytest.mark.parametrize("kind, options", PRINTED_FORMS,
                         ids=[f"{kind}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for kind, o in PRINTED_FORMS])
def test_printed_chain_rules_equal_the_semantics(kind, options, fresh_seed):
    rng = np.random.default_rng(fresh_seed)
    T, K = 5, 3  # tokens and key channels
    spec = spec_from_table(recurrence_table(kind, name=f"{kind}_printed", **options))
    layer_op, module = derived(spec, "derive-backward{chunk-size=8}")
    block = next(op for op in module.walk() if isinstance(op, k3s.ChunkedBackwardOp)).body.block
    loads = {exact_backward.load_form(op).of: op for op in block.ops
             if isinstance(op, (k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp))}
    stores = [op for op in block.ops if isinstance(op, k3s.StoreCotangentOp)]
    for stage in [*loads.values(), *stores]:  # what lower-to-triton writes on a kernel's loads and stores
        for choices in STAGE_CHOICES.get(type(stage), ()):
            write_choices(stage, choices(stage, None))
    for store in stores:
        form = exact_backward.store_form(store)
        width = 1 if form.of == "beta" or (form.of == "g" and not form.channel) else K
        raw = {form.inputs[0]: rng.uniform(-3, 3, (T, width))}
        if form.form == "clamped":  # rows on both sides of the bound
            raw["g"] = float(form.lower_bound) + rng.choice([-1, 1], (T, width)) * rng.uniform(0.1, 2, (T, width))
        if len(form.inputs) == 3:
            raw["A_log"] = rng.uniform(-1, 1)
            raw["dt_bias"] = rng.uniform(-1, 1, width) if form.channel else rng.uniform(-1, 1)
        cotangent = rng.standard_normal((T, width))
        loaded, gradients = semantics_in_float64(form, raw, cotangent)
        printed_loaded, printed_gradients = run_printed(loads[form.of], store, raw, cotangent, rng)

        np.testing.assert_allclose(printed_loaded, loaded, rtol=1e-12, atol=1e-14, err_msg=f"{form.of}'s printed load")
        for name in form.inputs:
            np.testing.assert_allclose(printed_gradients[name], gradients[name], rtol=1e-12, atol=1e-14,
                                       err_msg=f"d{name}: the printed store against the semantics ({form})")
        if form.of == "v":
            continue
        tensors, reference = reference_forms(layer_op, raw, T, K)
        np.testing.assert_allclose(loaded, reference[form.of].detach().numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=f"{form.of}: the semantics' load against the reference's")
        (reference[form.of] * torch.tensor(cotangent)).sum().backward()
        for name in form.inputs:
            np.testing.assert_allclose(gradients[name], tensors[name].grad.numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"d{name}: the semantics against autograd ({form})")


def test_printed_chain_rule_broken_fails(monkeypatch, fresh_seed):
    """The float64 check above is no formality: the bounded sigmoid's derivative s (1 + s) in the
    printed text instead of s (1 - s) fails it, at dg."""
    original = printed
    monkeypatch.setattr(sys.modules[__name__], "printed",
                        lambda print_op, op: original(print_op, op).replace("1.0 - b_s", "1.0 + b_s"))
    with pytest.raises(AssertionError, match="dg: the printed store against the semantics"):
        test_printed_chain_rules_equal_the_semantics("gated_deltanet", {"gate_input": "bounded"}, fresh_seed)
