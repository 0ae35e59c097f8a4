"""Reference for benchmarks/field_cases/guarded.cu and huge.cu: y = 3x + 1 elementwise (fp32, computed in fp64)."""

atol = 1e-6
rtol = 1e-6


def shapes(n):
    """Buffer shapes and dtypes by solve() parameter name."""
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}


def reference(x, y, **_):
    """Write 3x + 1 into y in place."""
    y.copy_((3 * x.double() + 1).float())
