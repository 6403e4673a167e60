"""pyproject.toml lists every package of the source tree: a folder with an __init__.py that is
missing there installs in editable mode but not from a wheel (the device machine's install)."""

from __future__ import annotations

import tomllib

from conftest import REPO


def test_every_package_is_listed():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {folder: package for package, folder in setuptools["package-dir"].items()}
    found = set()
    for folder, package in roots.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join([package, *relative.parts]))
    assert found == set(setuptools["packages"]), (found ^ set(setuptools["packages"]))
