"""The package version (pyproject.toml says the same), a module of its own so that the driver
reads it without importing the package's __init__."""

__version__ = "0.1.0"
