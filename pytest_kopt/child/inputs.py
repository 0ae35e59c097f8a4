"""The buffers of one problem instance, owned by the harness: declared shapes, the spec, fills and poison."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from . import HarnessError

#: A C spelling of each harness dtype, for a fix that names the type a ``solve()`` pointer should have.
C_SPELLING = {"float32": "float", "float64": "double", "float16": "__half", "bfloat16": "__nv_bfloat16",
              "int32": "int", "uint32": "unsigned int", "int64": "int64_t", "uint64": "uint64_t", "int16": "short",
              "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}

#: The dim a dtype case adds to its dims (:func:`pytest_kopt.gates.correctness.cases`): given only to a function
#: that takes it (:func:`taken`).
DTYPE_DIM = "dtype"


def taken(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for calling ``fn``: without :data:`DTYPE_DIM` when ``fn`` has neither a parameter of that name nor
    ``**kwargs`` (a ``setup()`` or ``shapes()`` that makes one dtype only); every other key as it is."""
    if DTYPE_DIM not in kwargs:
        return kwargs
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if DTYPE_DIM in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k != DTYPE_DIM}

def signature(fn: Any, what: str, path: str) -> Any:
    """``inspect.signature(fn)`` of an entry point kopt calls by keyword (``reference``, ``setup``), ``what`` its
    name, ``path`` its file. Raises HarnessError('contract') naming the file and the fix for a callable without a
    Python signature (a builtin such as ``torch.add`` bound as ``reference = torch.add``): it cannot take the
    buffers by name."""
    import inspect

    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise HarnessError("contract", f"{path}: {what} is {fn!r}, which has no Python signature ({exc}), so it "
                           "cannot take the buffers by name", path=path, line=def_line(path, what),
                           fix=f"wrap it in a def that takes the buffers by name, e.g. def {what}(x, y, **_): "
                               "torch.add(x, x, out=y)") from None


INT_POISON = -0x5A5A5A5A  # sentinel written into integer outputs before a call
#: The poison of a float output before the second call on the same inputs, when the request draws none: half the
#: dtype's most negative finite value (exact in it). With NaN before the first call, an element left unwritten
#: differs from both, even where the reference is NaN itself (the verdict's UNWRITTEN guard). The gates draw the
#: value per seed (:func:`pytest_kopt.gates.inputs.second_poisons`), so a kernel cannot know it ahead.
SECOND_POISON = {"float64": -8.988465674311579e307, "float32": -1.7014117331926443e38,
                 "bfloat16": -1.6947656946257678e38, "float16": -32752.0, "float8_e4m3fn": -224.0,
                 "float8_e5m2": -28672.0}


def poison(torch: Any, t: Any, second: bool = False, value: float | None = None) -> None:
    """Fill ``t`` with the poison value: NaN for floats (with ``second``: ``value``, else :data:`SECOND_POISON`),
    True for bools, :data:`INT_POISON` (or the type's maximum, unsigned) for integers."""
    name = str(t.dtype).replace("torch.", "")
    if t.dtype.is_floating_point and second and (value is not None or name in SECOND_POISON):
        t.fill_(value if value is not None else SECOND_POISON[name])
    elif t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(INT_POISON if torch.iinfo(t.dtype).min < 0 else torch.iinfo(t.dtype).max)


def declared_shapes(ref: Any, dims: dict[str, Any], ref_path: str) -> dict[str, tuple[list[int], str | None,
                                                                                      list[int] | None]]:
    """The reference's ``shapes(**dims)``: buffer name -> (shape, dtype or None, strides or None). An entry is
    ``(shape, dtype)``, ``(shape, dtype, strides)`` (a layout the problem prescribes, in elements) or a bare shape (a
    tuple of ints, or one int); dtypes are torch names without ``torch.`` (``float32``). {} when the reference
    defines no ``shapes``. Raises HarnessError('contract') when it raises or an entry is malformed."""
    if not callable(getattr(ref, "shapes", None)):
        return {}
    try:
        given = dict(ref.shapes(**taken(ref.shapes, dims)))
    except HarnessError:  # a field format's adapter words its own (its generator needs a GPU)
        raise
    except Exception as exc:
        raise HarnessError("contract", f"{ref_path}: shapes(**dims) raised {type(exc).__name__}: {exc}") from exc
    out: dict[str, tuple[list[int], str | None, list[int] | None]] = {}
    for name, entry in given.items():
        parts = isinstance(entry, (tuple, list)) and len(entry) in (2, 3) and isinstance(entry[0], (tuple, list))
        shape, dtype, stride = (entry[0], entry[1], entry[2] if len(entry) == 3 else None) if parts \
            else (entry, None, None)
        try:
            dims_list = [int(d) for d in (shape if isinstance(shape, (list, tuple)) else (shape,))]
            strides = None if stride is None else [int(d) for d in stride]
        except (TypeError, ValueError):
            raise HarnessError("contract", f"{ref_path}: shapes()[{name!r}] = {entry!r} is not a shape, (shape, dtype) "
                               "or (shape, dtype, strides)") from None
        if strides is not None and len(strides) != len(dims_list):
            raise HarnessError("contract", f"{ref_path}: shapes()[{name!r}] gives {len(strides)} strides for "
                               f"{len(dims_list)} dims")
        out[str(name)] = (dims_list, None if dtype is None else dtype_name(dtype, f"shapes()[{name!r}]", ref_path),
                          strides)
    return out


def dtype_name(dtype: Any, what: str, ref_path: str) -> str:
    """The harness's name of a dtype a reference gives (``torch.float16``, ``"float16"``, ``"half"``: all
    ``"float16"``; torch's own name for it, without ``torch.``). Raises HarnessError('contract'), naming ``what``
    (e.g. ``shapes()['x']``) in ``ref_path``, when it is no torch dtype (``"float33"``)."""
    import torch

    text = str(dtype).replace("torch.", "")
    found = dtype if isinstance(dtype, torch.dtype) else getattr(torch, text, None) if isinstance(dtype, str) \
        else None
    if not isinstance(found, torch.dtype):
        raise HarnessError("contract", f"{ref_path}: {what} gives dtype {dtype!r}, which is not a torch dtype",
                           fix=f"give a torch dtype name in {what} (float32, float16, bfloat16, int32, int64...)",
                           path=ref_path, line=def_line(ref_path, "shapes"))
    return str(found).replace("torch.", "")


def def_line(path: str | None, name: str) -> int | None:
    """The line of the last module-level binding of ``name`` in the Python file ``path`` (``def``, assignment, or
    ``from ... import``); None when it has none (or no file)."""
    import ast

    try:
        tree = ast.parse(open(str(path), "rb").read())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    line = None
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name \
                or isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets) \
                or isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name \
                or isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == name for a in n.names):
            line = n.lineno
    return line


def made_shapes(made: dict[str, Any]) -> dict[str, tuple[list[int], str]]:
    """``shapes()`` of a field problem's adapter: each tensor its generator made, as (shape, dtype), so the judge
    holds a candidate's reported buffers to the problem's own (:func:`pytest_kopt.child.inputs.check_spec`): a
    report that reshaped ``data`` would have the reference and the problem's check run on another problem."""
    return {k: (list(v.shape), str(v.dtype).replace("torch.", "")) for k, v in made.items()
            if hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, (int, float))}


def overlapping(shape: list[int], stride: list[int]) -> bool:
    """True when two elements of a strided layout share memory (a stride of 0 on a dim of more than one element, as
    ``expand()`` makes, or strides too small for the dims inside them)."""
    dims = sorted((st, n) for n, st in zip(shape, stride) if n > 1)
    need = 1
    for st, n in dims:
        if st < need:
            return True
        need = st * n
    return False


def contiguous_stride(shape: list[int]) -> list[int]:
    """Row-major strides (elements) of ``shape``."""
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(1, n)
    return list(reversed(stride))


def fill_drawn(torch: Any, t: Any, plan: dict[str, Any], gen: Any) -> None:
    """Fill ``t`` in place following the plan's regime (see :func:`pytest_kopt.gates.inputs.draw_plan`); integer
    tensors get U{0..15}, booleans U{0, 1}."""
    shape, dev = tuple(t.shape), t.device
    if t.dtype.is_floating_point:
        r = plan["regime"]
        if r == "uniform":
            v = (torch.rand(shape, generator=gen, device=dev) * 2 - 1) * plan["scale"]
        elif r == "small_int":
            v = torch.randint(plan["int_lo"], plan["int_hi"] + 1, shape, generator=gen, device=dev).float()
        elif r == "wide":
            mag = (torch.rand(shape, generator=gen, device=dev) * 2 - 1) * plan["decades"]
            v = torch.randn(shape, generator=gen, device=dev) * torch.pow(10.0, mag)
        else:
            v = torch.randn(shape, generator=gen, device=dev) * plan["scale"]
        t.copy_(v)
    elif t.dtype == torch.bool:
        t.copy_(torch.randint(0, 2, shape, generator=gen, device=dev).bool())
    else:
        t.copy_(torch.randint(0, 16, shape, generator=gen, device=dev))


def keep_structure(torch: Any, t: Any, like: Any) -> None:
    """Give ``t`` (values just drawn) the structure of ``like`` (the problem's own values at the same shape) that a
    kernel may rely on without computing anything else: symmetric over the last two dims where ``like`` is (a
    matrix for eigh or Cholesky), and exactly zero where ``like`` is (a triangle, a band, a mask, a zeroed output
    buffer that the kernel writes only in part)."""
    if t.dim() >= 2 and t.shape[-1] == t.shape[-2] > 1 and torch.equal(like, like.transpose(-1, -2)):
        t.copy_((t + t.transpose(-1, -2)) / 2)
    zero = like == 0
    if bool(zero.any()):
        t.masked_fill_(zero, 0)


class Inputs:
    """The buffers of one problem instance, owned by the harness: every tensor is a fresh plain ``torch.Tensor``
    allocated here (so a candidate's ``setup`` cannot hand in subclasses, proxies or aliased views).

    ``spec`` lists the buffers in call order: ``{name, role, shape, stride, dtype, source}``, ``role`` being
    ``input``, ``output`` (poisoned before every call) or ``inout`` (an output that is also an input, ``inplace`` in
    ``ref.py``: filled like an input, compared like an output);
    ``source`` is ``drawn`` (filled from the plan), ``make_inputs`` (the reference's generator) or ``setup``
    (integer/bool tensors from a Triton ``setup``, kept as given and shipped to the reference process).
    ``scalars`` holds non-tensor arguments (dims and ``setup``'s plain values)."""

    def __init__(self, torch: Any, spec: list[dict[str, Any]], scalars: dict[str, Any], device: str) -> None:
        self.torch = torch
        self.spec = spec
        self.scalars = scalars
        self.device = device
        self.tensors: dict[str, Any] = {}
        for s in spec:
            self.tensors[s["name"]] = torch.empty_strided(s["shape"], s["stride"], dtype=getattr(torch, s["dtype"]),
                                                          device=device)

    @property
    def outputs(self) -> list[str]:
        """Names of the buffers a call writes (outputs and in-place outputs)."""
        return [s["name"] for s in self.spec if s["role"] in ("output", "inout")]

    def fill(self, plan: dict[str, Any], seed: int, ref: Any, dims: dict[str, Any], given: dict[str, Any]) -> None:
        """Fill inputs for ``seed`` (drawn, make_inputs or given setup values); poison the outputs. A field
        problem's adapter that allows kopt's value regimes (``draws_regimes``) has the floating-point tensors its
        generator made redrawn in the plan's regime (but ``problem``: its own values), at their shapes and dtypes,
        keeping their exact zeros and their symmetry (:func:`keep_structure`); integer tensors stay as made."""
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(int(seed))
        made: dict[str, Any] = {}
        if callable(getattr(ref, "make_inputs", None)):
            made = dict(ref.make_inputs(seed=int(seed), **taken(ref.make_inputs, dims)))
        redraw = getattr(ref, "draws_regimes", False) and plan.get("regime") not in (None, "problem")
        for s in self.spec:
            t = self.tensors[s["name"]]
            if s["role"] == "output":
                poison(torch, t)
            elif s["name"] in made:
                value = torch.as_tensor(made[s["name"]]).to(device=self.device, dtype=t.dtype).reshape(t.shape)
                if redraw and t.dtype.is_floating_point:
                    fill_drawn(torch, t, plan, gen)
                    keep_structure(torch, t, value)
                else:
                    t.copy_(value)
            elif s["source"] == "setup":
                t.copy_(given[s["name"]])
            else:
                fill_drawn(torch, t, plan, gen)

    def poison_outputs(self, second: bool = False, values: dict[str, float] | None = None) -> None:
        """NaN (or a sentinel; ``second``: the second poison, ``values[name]`` where given) into every output before
        a call (not into in-place outputs, which hold the call's input)."""
        for s in self.spec:
            if s["role"] == "output":
                poison(self.torch, self.tensors[s["name"]], second, (values or {}).get(s["name"]) if second else None)

    def kwargs(self) -> dict[str, Any]:
        """Arguments by name: tensors and scalars."""
        return {**self.scalars, **self.tensors}

    @property
    def nbytes(self) -> int:
        """Bytes of every buffer of this set."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def spec_from_params(ref: Any, ref_path: str, params: list[dict[str, Any]], dims: dict[str, Any],
                     made: dict[str, Any], inplace: list[str] | tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Buffer spec of a CUDA ``solve``: dtype from the signature, shape from ``make_inputs``, ``shapes()`` or
    upstream's flat fallback (the product of the two largest integer dims) for a buffer neither names."""
    declared = declared_shapes(ref, dims, ref_path)
    ints = sorted((int(v) for v in dims.values() if isinstance(v, int)), reverse=True)
    flat = ints[0] * ints[1] if len(ints) >= 2 else (ints[0] if ints else 1)
    spec = []
    for p in params:
        if p["role"] == "scalar":
            continue
        stride = None
        if p["name"] in made:
            shape, source = list(made[p["name"]].shape), "make_inputs"
        elif p["name"] in declared:
            shape, dtype, stride = declared[p["name"]]
            source = "drawn"
            if dtype is not None and dtype != p["dtype"]:
                ctype = p.get("ctype") or p["dtype"]
                raise HarnessError("contract", f"{ref_path}: shapes() gives buffer {p['name']!r} dtype {dtype}, but "
                                   f"solve() takes it as a {ctype}* ({p['dtype']})",
                                   fix=f"make the two agree: give {p['name']} as {p['dtype']!r} in shapes() of "
                                       f"{os.path.basename(ref_path)}, or declare solve()'s {p['name']} as "
                                       f"{C_SPELLING.get(dtype, 'the C type of ' + dtype)}* if {dtype} is the "
                                       "task's",
                                   path=ref_path, line=def_line(ref_path, "shapes"))
        else:
            shape, source = [flat], "drawn"
        role = "inout" if p["name"] in inplace and p["role"] == "output" else p["role"]
        spec.append({"name": p["name"], "role": role, "shape": list(shape),
                     "stride": list(stride) if stride else contiguous_stride(list(shape)), "dtype": p["dtype"],
                     "source": source})
    return spec


def spec_from_setup(torch: Any, setup_result: Any, path: str, keep: bool = True,
                    inplace: list[str] | tuple[str, ...] = ()
                    ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], list[str]]:
    """Spec, scalars, (``keep``) host copies of the integer tensors, and the names of the outputs the candidate
    returns, from a Triton/Python ``setup()`` result: ``{"inputs": {name: tensor or value}, "outputs": [names]}``.
    An output named among the inputs is written in place (an ``inout`` buffer when ``inplace`` names it); one that
    is not is returned by ``run_kernel``; without ``"outputs"``, every output is returned (``["*"]``: named by the
    return value itself). Raises HarnessError('contract')."""
    if not isinstance(setup_result, dict) or "inputs" not in setup_result:
        raise HarnessError("contract", f"{path}: setup() must return {{'inputs': {{...}}, 'outputs': [names]}}")
    inputs = dict(setup_result["inputs"])
    outputs = list(setup_result["outputs"]) if "outputs" in setup_result else None
    if outputs is not None and not outputs:
        raise HarnessError("contract", f"{path}: setup() lists no outputs, so nothing can be checked",
                           fix="list the outputs (in place: names among its inputs; returned: other names), or leave "
                               "out 'outputs' when run_kernel() returns them")
    for name in outputs or []:
        if name in inputs and not isinstance(inputs[name], torch.Tensor):
            raise HarnessError("contract", f"{path}: output {name!r} is not a tensor among setup()'s inputs")
    returned = ["*"] if outputs is None else [n for n in outputs if n not in inputs]
    spec, scalars, kept = [], {}, {}
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            role = ("inout" if name in inplace else "output") if name in (outputs or []) else "input"
            source = "drawn" if (role == "output" or v.dtype.is_floating_point) else "setup"
            spec.append({"name": name, "role": role, "shape": list(v.shape), "stride": list(v.stride()),
                         "dtype": str(v.dtype).replace("torch.", ""), "source": source})
            if source == "setup" and keep:
                kept[name] = v.detach().cpu().contiguous()
        else:
            scalars[name] = v
    return spec, scalars, kept, returned


def returned_outputs(torch: Any, value: Any, names: list[str], inp: "Inputs", who: str,
                     required: list[str] | None = None) -> dict[str, Any]:
    """A call's return value as ``{output name: tensor}``: a tensor, a tuple/list of tensors (named ``names`` in
    order, else ``out0``, ``out1``...), a dict by name, or None. A tensor that is one of the call's own in-place
    outputs (``return y`` after writing ``y``) is no returned output. ``names`` ``["*"]``: the return value names its
    outputs; ``[]``: every output is in place, and a value that comes back would be ignored (an error, never a
    silent NaN). ``required`` (default: ``names``) must all come back. Raises HarnessError('contract')."""
    in_place = {inp.tensors[n].data_ptr() for n in inp.outputs if inp.tensors[n].numel()}
    named = [n for n in names if n != "*"]
    if value is None or (isinstance(value, torch.Tensor) and value.numel() and value.data_ptr() in in_place):
        got: dict[str, Any] = {}
    elif isinstance(value, dict):
        got = {str(k): v for k, v in value.items()}
    elif isinstance(value, (tuple, list)):
        keys = named if len(named) == len(value) else [f"out{i}" for i in range(len(value))] if len(value) > 1 \
            else ["out"]
        got = dict(zip(keys, value))
    else:
        got = {named[0] if named else "out": value}
    got = {k: v for k, v in got.items() if not (isinstance(v, torch.Tensor) and v.numel()
                                                and v.data_ptr() in in_place)}
    bad = [k for k, v in got.items() if type(v) is not torch.Tensor]
    if bad:
        raise HarnessError("contract", f"{who} returned {', '.join(repr(k) for k in bad)}, which is not a plain "
                           "torch.Tensor", fix="return tensors (a tensor, a tuple of them, or a dict by name)")
    if got and not names:
        raise HarnessError("contract", f"{who} returned a value ({', '.join(got)}), but its outputs "
                           f"({', '.join(inp.outputs)}) are written in place, so the returned value would be "
                           "ignored", fix="write the result into the output buffer (y.copy_(result)), or list a "
                                          "returned output in setup()'s 'outputs' by a name that is not an input")
    want = named if required is None else required
    missing = [n for n in want if n not in got]
    if missing or ("*" in names and required is None and not got):
        raise HarnessError("contract", f"{who} returned {', '.join(got) or 'nothing'}, but "
                           f"{', '.join(missing) or 'its outputs'} should come back from it",
                           fix="return the outputs setup() lists but does not allocate (a tensor, a tuple, or a dict "
                               "by name), or write them in place")
    return got


def check_spec(ref: Any, spec: list[dict[str, Any]], dims: dict[str, Any], ref_path: str) -> None:
    """In the reference's process: every buffer the reference's ``shapes(**dims)`` names must have that shape, dtype
    and (when it prescribes one) layout in the candidate's spec, so a Triton/Python ``setup()`` cannot shrink the
    problem it is judged (and timed) on, or pick an easier layout. A buffer that ``shapes()`` gives no strides for
    must be row-major (contiguous). No ``shapes()``: only the layouts are checked. Raises HarnessError('contract')."""
    declared = declared_shapes(ref, dims, ref_path)
    for s in spec:
        shape, dtype, stride = declared.get(s["name"], (None, None, None))
        if shape is not None and (list(s["shape"]) != shape or (dtype is not None and dtype != s["dtype"])):
            want = f"{dtype or s['dtype']}{shape}"
            raise HarnessError("contract", f"the candidate's buffer {s['name']!r} is {s['dtype']}{list(s['shape'])} "
                               f"but {ref_path}'s shapes() says {want} for these dims: "
                               "setup() must build the problem the dims describe",
                               fix=f"make the candidate's setup() build {s['name']} as {want} at these dims (or, if "
                                   f"shapes() is the one that is wrong, correct it in {ref_path})")
        want = stride if stride is not None else contiguous_stride(list(s["shape"]))
        if [st for st, n in zip(s["stride"], s["shape"]) if n > 1] != [st for st, n in zip(want, s["shape"]) if n > 1]:
            what = "the layout shapes() gives" if stride is not None else "row-major (contiguous)"
            raise HarnessError("contract", f"the candidate's buffer {s['name']!r} has strides {list(s['stride'])}, "
                               f"not {want}, {what}: a kernel judged on another layout solves another problem",
                               fix=f"allocate {s['name']} {'with that layout' if stride is not None else 'contiguous'} "
                                   "in setup(), or give its layout as (shape, dtype, strides) in ref.shapes()")


def check_layout(spec: list[dict[str, Any]], path: str) -> None:
    """Every buffer of a spec must own its elements: no overlap (an ``expand()``ed or stride-0 buffer) and at least
    one element. Raises HarnessError('contract') naming the buffer."""
    for s in spec:
        if overlapping(list(s["shape"]), list(s["stride"])):
            raise HarnessError("contract", f"{path}: buffer {s['name']!r} (shape {list(s['shape'])}, strides "
                               f"{list(s['stride'])}) has elements that share memory (an expand() or a stride of 0)",
                               fix=f"allocate {s['name']} with torch.empty(shape) (or .contiguous()), not a view "
                                   "that repeats elements")
        n = 1
        for d in s["shape"]:
            n *= int(d)
        if n == 0:
            raise HarnessError("contract", f"{path}: buffer {s['name']!r} has no elements (shape {list(s['shape'])}), "
                               "so nothing can be computed or compared",
                               fix="give dims that make every buffer non-empty (a zero dim?)")


def same_values(torch: Any, a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` hold the same values, NaN equal to NaN in the same place (an input drawn or made
    with NaN in it is unchanged when it still holds those NaNs)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        return False
    both = torch.isnan(a) & torch.isnan(b)
    return bool(((a == b) | both).all())


def changed_elements(torch: Any, a: Any, b: Any) -> int:
    """How many elements of ``a`` differ from ``b`` (NaN equal to NaN in the same place)."""
    diff = a != b
    if a.dtype.is_floating_point or a.dtype.is_complex:
        diff &= ~(torch.isnan(a) & torch.isnan(b))
    return int(diff.sum())


def aliases(torch: Any, inp: Inputs, got: dict[str, Any]) -> dict[str, str]:
    """Returned outputs whose memory is an input buffer's: ``{output: input}`` (a GPU MODE ``data`` that carries its
    output buffer is written and returned; ``return x.t()`` is a view of ``x``)."""
    by_storage = {inp.tensors[s["name"]].untyped_storage().data_ptr(): s["name"] for s in inp.spec
                  if s["role"] == "input" and inp.tensors[s["name"]].numel()}
    return {name: by_storage[t.untyped_storage().data_ptr()] for name, t in got.items()
            if getattr(t, "numel", lambda: 0)() and t.untyped_storage().data_ptr() in by_storage}


def setup_digest(arrays: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a ``setup()``'s integer tensors (CPU tensors by name): what the candidate reports as
    ``setup_sha`` and the judge checks the arrays it loads against."""
    h = hashlib.sha256()
    for name, t in sorted(arrays.items()):
        h.update(name.encode() + t.numpy().tobytes())
    return h.hexdigest()
