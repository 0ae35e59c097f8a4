"""Parse Nsight Compute ``--csv`` exports (long ``--metrics``/``details`` pages and the
wide ``raw`` page) into launches whose metric values are converted to base units."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from decimal import Decimal

__all__ = [
    "NcuParseError",
    "NcuMetric",
    "NcuLaunch",
    "parse_ncu_csv",
    "to_base_unit",
    "find_launch",
    "metric_value",
]


class NcuParseError(ValueError):
    """Raised when ncu CSV text cannot be turned into launches, or a launch cannot be chosen.

    The message names the problem (missing header, zero metric rows, no/ambiguous kernel
    match with the kernel names seen)."""


@dataclass(frozen=True, slots=True)
class NcuMetric:
    """One metric of one launch.

    ``value`` is already converted to the base unit named by ``unit`` (see
    :func:`to_base_unit`: ns, byte, byte/second, Hz; any other unit such as %, cycle,
    inst/cycle is kept as printed). ``value`` is None when the cell is blank, "n/a",
    "nan"/"inf" or otherwise non-numeric. ``raw`` is the cell text exactly as exported."""

    name: str
    unit: str
    value: float | None
    raw: str


@dataclass(frozen=True, slots=True)
class NcuLaunch:
    """One profiled kernel launch (one ncu ``ID``) and its metrics keyed by name.

    Identity fields are the exported strings ("" when the column is absent);
    ``block_size``/``grid_size`` look like "(256, 1, 1)". Metric key rules are documented
    in :func:`parse_ncu_csv`."""

    id: int
    kernel_name: str
    block_size: str
    grid_size: str
    device: str
    cc: str
    metrics: dict[str, NcuMetric] = field(default_factory=dict)


# Scale tables (rule source: the unit strings Nsight Compute 2025.3 prints, e.g. "us",
# "Mbyte", "Tbyte/s", "Ghz"; ncu byte prefixes are decimal, 1 Kbyte = 1000 byte).
_TIME = {"ps": "0.001", "psecond": "0.001", "ns": "1", "nsecond": "1", "us": "1e3",
         "usecond": "1e3", "ms": "1e6", "msecond": "1e6", "s": "1e9", "second": "1e9"}
_BYTES = {"byte": "1", "b": "1", "kbyte": "1e3", "kb": "1e3", "mbyte": "1e6", "mb": "1e6",
          "gbyte": "1e9", "gb": "1e9", "tbyte": "1e12", "tb": "1e12", "pbyte": "1e15",
          "kibyte": "1024", "kib": "1024", "mibyte": "1048576", "mib": "1048576",
          "gibyte": "1073741824", "gib": "1073741824",
          "tibyte": "1099511627776", "tib": "1099511627776"}
_FREQ = {"hz": "1", "khz": "1e3", "mhz": "1e6", "ghz": "1e9", "thz": "1e12"}
_PER_SECOND = ("/s", "/second", "/sec")


def _scale(unit: str) -> tuple[Decimal, str] | None:
    u = unit.strip().lower()
    if u in _TIME:
        return Decimal(_TIME[u]), "ns"
    if u in _BYTES:
        return Decimal(_BYTES[u]), "byte"
    if u in _FREQ:
        return Decimal(_FREQ[u]), "Hz"
    for suffix in _PER_SECOND:
        if u.endswith(suffix) and u[: -len(suffix)] in _BYTES:
            return Decimal(_BYTES[u[: -len(suffix)]]), "byte/second"
    return None


def to_base_unit(value: float, unit: str) -> tuple[float, str]:
    """Convert ``value`` given in ``unit`` to its base unit; return ``(value, base_unit)``.

    Table (unit names matched case-insensitively, rule source: ncu 2025.3 CSV units):
      * time  ps/psecond, ns/nsecond, us/usecond, ms/msecond, s/second -> "ns"
      * bytes byte, Kbyte, Mbyte, Gbyte, Tbyte, Pbyte (decimal, x1000 steps, as ncu
        prints them; also KB/MB/GB/TB) and KiB/MiB/GiB/TiB or Kibyte... (x1024) -> "byte"
      * throughput <any byte unit>/s, /second or /sec -> "byte/second"
      * frequency hz, Khz, Mhz, Ghz, Thz -> "Hz"
    Everything else (%, cycle, inst, "cycle/usecond", "Kbyte/block", "sector/s", "") is
    returned unchanged with its original unit string. The multiplication is done in
    decimal on ``repr(value)`` so e.g. 1.98 Ghz gives exactly 1.98e9. Never raises for
    an unknown unit; non-finite values pass through the multiplication unchanged.
    """
    scaled = _scale(unit)
    if scaled is None:
        return value, unit
    factor, base = scaled
    if factor == 1:
        return float(value), base
    return float(Decimal(repr(float(value))) * factor), base


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _parse_number(text: str) -> float | None:
    # Commas are thousands separators only (ncu prints "189,068,032" and "111,604.90").
    s = text.strip().replace(",", "")
    if not _NUMBER.fullmatch(s):
        return None
    return float(s)


def _make_metric(name: str, unit: str, raw: str) -> NcuMetric:
    number = _parse_number(raw)
    if number is None:
        return NcuMetric(name, unit, None, raw)
    value, base = to_base_unit(number, unit)
    return NcuMetric(name, base, value, raw)


_IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
             "Stream", "Block Size", "Grid Size", "Device", "CC")


def _bare_metric_name(column: str) -> str:
    """``FBSP.TriageCompute.dramc__x.avg`` -> ``dramc__x.avg`` (from first ``__`` part)."""
    parts = column.split(".")
    for i, part in enumerate(parts):
        if "__" in part:
            return ".".join(parts[i:])
    return column


def parse_ncu_csv(text: str) -> list[NcuLaunch]:
    """Parse the text of an ``ncu --csv`` export into launches in order of first appearance.

    Rules (source: Nsight Compute 2025.3 ``--csv`` output, ``--metrics``, ``--page details``
    and ``--page raw``):
      * Everything before the header is skipped (``==PROF==``/``==WARNING==``/``==ERROR==``
        banners, program stdout). The header is the first line whose first CSV field is
        ``ID``. Columns are looked up by name, never by position.
      * Long form (header has ``Metric Name``): one row per metric; rows with an empty
        metric name (details-page rule rows) are skipped. Key = metric name as printed;
        when a ``Section Name`` is present the metric is also stored under
        ``"<Section Name>/<Metric Name>"``. For a plain name repeated within one launch
        the first row wins (the qualified key keeps each one).
      * Wide form (no ``Metric Name``): every non-identity column is a metric; the row
        right after the header whose identity columns are all empty holds the units.
        Key = column header as printed, plus (if not already a key) the bare metric name
        starting at the first ``.``-component containing ``__``
        (``FBSP.TriageCompute.dramc__throughput.avg.pct`` -> ``dramc__throughput.avg.pct``).
      * Rows are grouped by integer ``ID`` (rows whose ID is not an integer are ignored);
        identity fields come from the first row of each ID.
      * Values: commas are thousands separators, never a decimal point ("5,376" -> 5376);
        blank / "n/a" / "nan" / other non-numeric -> None; numbers are converted with
        :func:`to_base_unit`.
    Raises NcuParseError when no header row is found or when zero metric rows are parsed.
    """
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    start = None
    for i, line in enumerate(lines):
        first = next(csv.reader([line]), [])
        if first and first[0].strip() == "ID":
            start = i
            break
    if start is None:
        raise NcuParseError('no CSV header row found (expected a line starting with "ID")')
    reader = csv.reader(lines[start:])
    header = [h.strip() for h in next(reader)]
    col = {name: i for i, name in reversed(list(enumerate(header)))}

    def cell(row: list[str], name: str) -> str:
        i = col.get(name)
        return row[i] if i is not None and i < len(row) else ""

    long_form = "Metric Name" in col
    if long_form and "Metric Value" not in col:
        raise NcuParseError('long-form CSV has a "Metric Name" column but no "Metric Value"')
    wide_cols = [(i, h) for i, h in enumerate(header) if h and h not in _IDENTITY]
    units: dict[int, str] = {}
    builders: dict[int, NcuLaunch] = {}
    count = 0
    for rowno, row in enumerate(reader):
        if not any(c.strip() for c in row):
            continue
        if not long_form and rowno == 0 and not any(cell(row, n).strip() for n in _IDENTITY):
            units = {i: row[i].strip() for i, _ in wide_cols if i < len(row)}
            continue
        try:
            launch_id = int(cell(row, "ID").strip())
        except ValueError:
            continue
        launch = builders.get(launch_id)
        if launch is None:
            launch = NcuLaunch(launch_id, cell(row, "Kernel Name"), cell(row, "Block Size"),
                               cell(row, "Grid Size"), cell(row, "Device"), cell(row, "CC"))
            builders[launch_id] = launch
        metrics = launch.metrics
        if long_form:
            name = cell(row, "Metric Name").strip()
            if not name:
                continue
            metric = _make_metric(name, cell(row, "Metric Unit").strip(),
                                  cell(row, "Metric Value"))
            metrics.setdefault(name, metric)
            section = cell(row, "Section Name").strip()
            if section:
                metrics[f"{section}/{name}"] = metric
            count += 1
        else:
            for i, name in wide_cols:
                if i < len(row):
                    metrics[name] = _make_metric(name, units.get(i, ""), row[i])
                    count += 1
            for _, name in wide_cols:
                if name in metrics:
                    metrics.setdefault(_bare_metric_name(name), metrics[name])
    if count == 0:
        raise NcuParseError("zero metric rows parsed (header found but no metric values)")
    return list(builders.values())


def _strip_brackets(text: str, open_ch: str, close_ch: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_ch:
            depth += 1
        elif ch == close_ch and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _base_name(kernel_name: str) -> str:
    """``void ns::gemm_naive<128>(const float*, int)`` -> ``ns::gemm_naive``."""
    name = _strip_brackets(kernel_name, "<", ">")
    paren = name.find("(")
    if paren > 0:
        name = name[:paren]
    tokens = name.split()
    return tokens[-1] if tokens else kernel_name.strip()


def find_launch(launches: list[NcuLaunch], kernel: str | None) -> NcuLaunch:
    """Return the launch profiling ``kernel``; the LAST match wins (warm-ups come first).

    Matching (rule chosen for this plugin): tier 1, ``kernel_name == kernel`` or the
    demangled base name equals ``kernel`` (base name = name without return type,
    template arguments and parameter list, namespaces kept:
    ``void ns::gemm<128>(const float*)`` -> ``ns::gemm``); tier 2 (only if tier 1 is
    empty), the base name contains ``kernel``, and all tier-2 matches must share one base
    name. With ``kernel=None`` every launch must have the same kernel name.
    Raises NcuParseError listing the kernel names seen when there is no launch, no
    match, or the choice is ambiguous.
    """
    seen = list(dict.fromkeys(launch.kernel_name for launch in launches))
    if not launches:
        raise NcuParseError("no launches to choose from (kernel names seen: none)")
    if kernel is None:
        if len(seen) == 1:
            return launches[-1]
        raise NcuParseError(f"kernel not specified and launches have several kernel names: {seen}")
    exact = [l for l in launches if kernel in (l.kernel_name, _base_name(l.kernel_name))]
    if exact:
        return exact[-1]
    partial = [l for l in launches if kernel in _base_name(l.kernel_name)]
    bases = list(dict.fromkeys(_base_name(l.kernel_name) for l in partial))
    if len(bases) == 1:
        return partial[-1]
    if bases:
        raise NcuParseError(f"kernel {kernel!r} is ambiguous: matches {bases}; kernel names seen: {seen}")
    raise NcuParseError(f"no launch matches kernel {kernel!r}; kernel names seen: {seen}")


def metric_value(launch: NcuLaunch, *aliases: str) -> float | None:
    """Return the base-unit value of the first alias present in ``launch.metrics`` with a
    non-None value, else None (never raises; see NcuMetric.unit for the unit)."""
    for alias in aliases:
        metric = launch.metrics.get(alias)
        if metric is not None and metric.value is not None:
            return metric.value
    return None
