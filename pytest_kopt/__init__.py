"""pytest-kopt: every gate of an iterative GPU-kernel optimization loop as a pytest item."""

__version__ = "0.1.0"
