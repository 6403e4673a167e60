"""Host code of the compiled modules as real Python modules (imported and tested here), whose
source below their marker line the printer emits into every compiled module."""

from pathlib import Path

MARKER = "# --- emitted into every compiled module (above: what this file needs to be imported) ---"


def emitted(module: str) -> list[str]:
    """The lines of runtime/<module>.py below its marker: what a compiled module carries."""
    text = (Path(__file__).parent / f"{module}.py").read_text()
    return text[text.index(MARKER) + len(MARKER):].strip("\n").splitlines()
