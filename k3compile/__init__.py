"""k3compile: a compiler toolkit for Kimi K3-style layers.

    layer = k3compile.compile("examples/kda.toml")
    o, final_state = layer.recurrent(q, k, v, g, beta, output_final_state=True)

Heavy imports (xDSL, torch, triton) happen on first use, so `import k3compile` is cheap.
"""

from k3compile.errors import IRError, K3Error, OutputError, SpecError, UnsupportedError, VerificationError
from k3compile.version import __version__

__all__ = [
    "__version__",
    "compile",
    "load_spec",
    "K3Error",
    "SpecError",
    "IRError",
    "UnsupportedError",
    "OutputError",
    "VerificationError",
]


def compile(spec, out_dir=None, pipeline=None):  # noqa: A001 - the public verb
    # xDSL, torch, triton: `import k3compile` stays cheap
    from k3compile.driver import compile as _compile

    return _compile(spec, out_dir=out_dir, pipeline=pipeline)


compile.__doc__ = "Compile a layer spec (path or LayerSpec) to Triton kernels; see k3compile.driver.compile."


def load_spec(path):
    # tomllib and the schemas: `import k3compile` loads only the errors
    from k3compile.spec import load_spec as _load_spec

    return _load_spec(path)
