# lit configuration of k3compile's IR tests (run: PATH=.venv/bin:$PATH lit -v tests/filecheck).
#
# Every test is a .mlir (or .toml) file whose `// RUN:` lines drive `k3c` and check its output
# with `filecheck`; both tools are taken from PATH, so put the venv's bin/ first.
import os
import shutil

import lit.formats

config.name = "k3compile"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir", ".toml"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.excludes = ["lit.cfg.py", "Output"]
# Temporaries (%t) and lit's timing cache go under tests/filecheck/Output/ (git-ignored), not
# into an Output/ folder beside every test.
config.test_exec_root = os.path.join(config.test_source_root, "Output")

# k3c and filecheck come from the caller's PATH.
config.environment["PATH"] = os.environ.get("PATH", "")
for tool in ("k3c", "filecheck"):
    if shutil.which(tool, path=config.environment["PATH"]) is None:
        lit_config.fatal(f"'{tool}' is not on PATH; run lit with the venv's bin/ first on PATH")

# %examples: the repository's examples/ folder (tests/filecheck/ -> repo root -> examples/).
_repo_root = os.path.dirname(os.path.dirname(config.test_source_root))
config.substitutions.append(("%examples", os.path.join(_repo_root, "examples")))
