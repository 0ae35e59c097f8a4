"""Collection: a kernel file is a :class:`KoptFile`, which yields one :class:`KoptItem` per (gate, case) of the
session's gate table; an item delegates to :func:`pytest_kopt.gates.table.run` and renders the gate's errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from .. import registry
from ..errors import Blocked, KoptError, NotApplicable
from ..gates.inputs import draw_plan
from ..gates.table import Gate, planned_figures, run
from .stash import STATE

#: The marker of a gate item that runs on the GPU, namespaced: a user's own ``gpu`` marker is theirs to define.
GPU_MARKER = "kopt_gpu"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Collect the session's kernel files (``--kopt-baseline``, ``--kopt-candidate``) as :class:`KoptFile`, whose
    node id is :func:`node_path`."""
    if file_path.resolve() in _kernels(parent.config):
        return KoptFile.from_parent(parent, path=file_path, nodeid=node_path(parent.config, file_path))
    return None


def node_path(config: pytest.Config, file_path: Path) -> str:
    """A kernel file's node id: its path relative to the root folder, ``../`` included for one outside it. (pytest
    names a file given on the command line outside the root by its path relative to that argument, which is empty:
    two such kernels shared the node id ``""``, and xdist's loadscope ran the first one's items twice and the
    second's never.)"""
    return Path(os.path.relpath(file_path, config.rootpath)).as_posix()


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """A Triton/Python kernel given to kopt is not a test module: keep pytest's python plugin from importing it
    (that would import torch/triton into the pytest process and collect its functions)."""
    if module_path.resolve() in _kernels(parent.config):
        return NotATestModule.from_parent(parent, path=module_path)
    return None


def _kernels(config: pytest.Config) -> frozenset[Path]:
    state = config.stash.get(STATE, None)
    return state.kernels if state is not None else frozenset()


class NotATestModule(pytest.File):
    """Stands in for the python plugin's Module of a kernel file; collects nothing (KoptFile has the items)."""

    def collect(self) -> list[pytest.Item]:
        """Nothing: the kernel's items come from :class:`KoptFile`."""
        return []


class KoptFile(pytest.File):
    """A kernel file: one :class:`KoptItem` per gate and case, in table order (``correctness[seed=7]``)."""

    def collect(self) -> Iterator[pytest.Item]:
        """The items of the session's gate table for this kernel (``--kopt-run`` leaves out the gates that run for
        the champion alone)."""
        state = self.config.stash[STATE]
        ctx = state.context(self.config, self.path, self.nodeid.split("::")[0])
        for gate in state.gates:
            if state.settings.loop_mode == "run" and not gate.per_branch:
                continue
            for suffix, case in gate.items(ctx):
                item = KoptItem.from_parent(self, name=gate.name + suffix, gate=gate, case=case)
                item.add_marker(pytest.mark.kopt(gate.name))
                if gate.on_gpu(ctx.kind):
                    item.add_marker(GPU_MARKER)
                yield item


class KoptItem(pytest.Item):
    """One gate run on one kernel (and one case); delegates to the table and renders its errors."""

    def __init__(self, *, gate: Gate, case: Any = None, **kwargs: Any) -> None:
        # pytest 9.2 keys --lf's record by a structured node id, and parses ``name[params]`` from the recorded text
        # into a name and params: an item whose name carries its case must be built the same way (as pytest's own
        # parametrized functions are), or --lf finds none of its failures
        name, parent = kwargs.get("name", ""), kwargs.get("parent")
        base, sep, params = name.partition("[")
        parent_id = getattr(parent, "id", None)
        if sep and params.endswith("]") and "nodeid" not in kwargs and hasattr(parent_id, "with_params"):
            kwargs["nodeid"] = parent_id.child(base).with_params(params[:-1])
        super().__init__(**kwargs)
        self.gate = gate
        self.case = case

    @property
    def label(self) -> str:
        """The case's label (``seed=7``), "" for a gate without cases."""
        return self.name[len(self.gate.name):].strip("[]")

    def runtest(self) -> None:
        """Run the gate; Blocked and NotApplicable become skips (naming the gate that blocked it), a gate error a
        failure with its status and exit code; figures go to ``user_properties`` (and so to junit XML)."""
        state = self.config.stash[STATE]
        ctx = state.context(self.config, self.path, self.nodeid.split("::")[0])
        if self.path not in state.kicked:
            state.kicked.add(self.path)
            ctx = self._kickoff(state)
        self.user_properties += [("kopt_gate", self.gate.name), ("kopt_kernel", str(ctx.kernel)),
                                 ("kopt_case", self.label or None)]
        try:
            # the files this item judges by, as they were at the session's start
            state.pins.verify([ctx.kernel, ctx.ref, *registry.files()[:1]], gate=self.gate.name)
            outcome = run(self.gate, ctx, self.case, self.label)
        except NotApplicable as exc:
            self.user_properties.append(("kopt_status", "NOT_APPLICABLE"))
            pytest.skip(f"not applicable: {exc}")
        except Blocked as exc:
            fix = exc.fix or f"make the {exc.gate} item pass (its own fix says how): this one runs once it does"
            self.user_properties += [("kopt_status", "SKIPPED"), ("kopt_blocked_by", exc.gate), ("kopt_fix", fix)]
            if exc.details:  # the item that met the cause keeps its long text; the skip reason stays one line
                self.user_properties.append(("kopt_details", exc.details[-4000:]))
            self.user_properties += [(k, v) for k, v in planned_figures(self.gate, ctx, self.case).items()
                                     if isinstance(v, (int, float, str, bool))]
            pytest.skip(str(exc))
        except KoptError as exc:
            if not exc.gate:
                exc.gate = self.gate.name
            self.user_properties += [("kopt_status", exc.status), ("kopt_exit_code", exc.exit_code),
                                     ("kopt_message", exc.message), ("kopt_path", exc.path),
                                     ("kopt_line", exc.line), ("kopt_fix", exc.fix),
                                     ("kopt_details", (exc.details or "")[-4000:] or None)]
            self.user_properties += [(k, v) for k, v in exc.figures.items() if isinstance(v, (int, float, str, bool))]
            raise
        self.user_properties.append(("kopt_status", "PASSED"))
        self.user_properties += [(k, v) for k, v in outcome.figures.items() if isinstance(v, (int, float, str, bool))]
        if outcome.summary:
            self.user_properties.append(("kopt_summary", outcome.summary))

    def _kickoff(self, state: Any) -> Any:
        """At a kernel's first item in this process, ask the scheduler (:class:`pytest_kopt.scheduler.Scheduler`) to
        start what its later items wait for, so it runs beside the hardware, preflight and plan items: nvcc for
        every ``.cu`` kernel this process collected a compile item of (once per process), this kernel's ncu
        profile (when it has an ncu item and a GPU) and SASS dump (when it has a sass item) after its build, this
        kernel's warm harness processes when it has items that use them, matplotlib's import for its roofline.
        Notes, per kernel, the gates this process collected (``Context.collected``), and returns this kernel's
        context with them."""
        mine = [i for i in self.session.items if isinstance(i, KoptItem)]
        for item in mine:
            key = Path(item.path).resolve()
            state.collected[key] = state.collected.get(key, frozenset()) | {item.gate.name}
        compiles = {i.path: i for i in mine if i.gate.name == "compile"}
        ctx = state.context(self.config, self.path, self.nodeid.split("::")[0])
        # the SASS dump of this kernel only: under xdist every worker collects every kernel, and runs few of them
        sass = frozenset({ctx.kernel}) if "sass" in ctx.collected else frozenset()
        profile = frozenset({ctx.kernel}) if "ncu" in ctx.collected and ctx.gpu else frozenset()
        if profile:  # the profile's request draws its plan: here, so the build's thread never runs hypothesis
            try:
                draw_plan(ctx.settings.seeds[0], 0, ctx.regimes)
            except (IndexError, ValueError):  # no seed, an unknown regime: the gates report it; nothing ahead
                profile = frozenset()
        # this kernel's build first, then those of the kernels planned for this worker (under xdist each worker
        # starts every kernel's build, and one whose build another worker runs waits for it holding a job: in the
        # same order everywhere, the workers' jobs all waited on the same few builds)
        planned = {k: i for i, k in enumerate(state.planned)}
        order = sorted(compiles.values(), key=lambda i: (Path(i.path).resolve() != ctx.kernel,
                                                         planned.get(Path(i.path).resolve(), len(planned))))
        state.ahead.start_builds([state.context(self.config, i.path, i.nodeid.split("::")[0]) for i in order],
                                 sass, profile)
        if ctx.collected & state.gates.harness:
            state.ahead.prestart_harness(ctx)
        if "roofline" in ctx.collected:  # matplotlib's import off the roofline item
            state.ahead.import_plotting_ahead()
        return ctx

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        """Gate errors as their own text (file:line, message, details, fix); anything else as a traceback."""
        if isinstance(excinfo.value, KoptError):
            return excinfo.value.render()
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        """Location shown by pytest: the kernel file and the gate name."""
        return self.path, 0, f"kopt {self.name}"
