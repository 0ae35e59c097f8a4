"""Reference of the coverage cases (leak_malloc.cu, scratch_malloc.cu, leak_list.py): y = 2 x, fp32."""
atol = 0.0
rtol = 0.0


def shapes(n):
    """x, the input, and y, the output: n fp32 values each."""
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}


def workload_model(n):
    """One multiply per element; bytes_min reads x and writes y once."""
    return {"flops": n, "bytes_min": 8 * n}


def reference(x, y, **_):
    """Write 2 x into y in place (exact in fp32)."""
    y.copy_(2.0 * x)
