"""IR of k3compile: the `k3` layer dialect, the `k3s` schedule dialect, and reference semantics.

Dialects are loaded lazily (see `k3compile.ir.dialects.load_dialects`) so the CLI stays fast.
"""
