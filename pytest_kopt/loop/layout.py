"""The run directory's layout (SKILL.md's output contract), defined once: every folder and file name of a run, and
which run folder a kernel path is (a branch, an ablation), for the loop, the settings and the plugin.

Plain path arithmetic plus :meth:`RunLayout.contained`, the one test of whether a path an agent wrote stays inside
the run (symlinks resolved). Nothing here reads a file's content.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The kernel file of a branch or ablation folder (and of an iteration's champion copy): one of these names.
KERNEL_NAMES = ("kernel.cu", "kernel.py")
KERNEL_SUFFIXES = (".cu", ".py")
#: A branch folder's name: b1, b2, ... (SKILL.md 3d: ``branches/b{1..K}``).
BRANCH_RE = re.compile(r"^b([1-9][0-9]*)$")
ITERATION_RE = re.compile(r"^iterv([1-9][0-9]*)$")
BRANCHES = "branches"
ABLATIONS = "ablations"


def branch_name(k: int) -> str:
    """The folder name of branch ``k`` (1-based): ``b{k}``."""
    return f"b{k}"


def branch_index(name: str) -> int | None:
    """``k`` of a branch name ``b{k}``; None for any other name (``b1_old``, ``b0``, ``B2``)."""
    m = BRANCH_RE.match(name)
    return int(m.group(1)) if m else None


class _At:
    """A file or folder of a layout by its name: ``layout.state`` is ``layout.folder / "state.json"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, layout: Any, owner: type | None = None) -> Path:
        return layout.folder / self.name


@dataclass(frozen=True, slots=True)
class Place:
    """Where a kernel sits in a run: ``kind`` (``branch`` or ``ablation``), ``iteration`` (i of ``iterv{i}``) and
    ``name`` (the branch's ``b{k}``, or the ablation's method id)."""

    kind: str
    iteration: int
    name: str


@dataclass(frozen=True, slots=True)
class IterationLayout:
    """``iterv{i}/`` of a run: the agent's inputs (``methods.json``, ``branches/b{k}/``, ``ablations/<method>/``),
    the evidence it reads and the close's records."""

    root: Path
    index: int

    @property
    def dir(self) -> Path:
        return self.root / f"iterv{self.index}"

    @property
    def folder(self) -> Path:
        return self.dir

    @property
    def name(self) -> str:
        return f"iterv{self.index}"

    @property
    def branches_dir(self) -> Path:
        return self.dir / BRANCHES

    @property
    def ablations_dir(self) -> Path:
        return self.dir / ABLATIONS

    def branch_dir(self, branch: int | str) -> Path:
        """``branches/b{k}/`` by index or name."""
        return self.branches_dir / (branch_name(branch) if isinstance(branch, int) else branch)

    def ablation_dir(self, method: str) -> Path:
        return self.ablations_dir / method

    def base_file(self, method: str) -> Path:
        """``ablations/<method>/base``: the branch the ablation removes the method from."""
        return self.ablation_dir(method) / "base"

    def kernel(self, suffix: str) -> Path:
        """The champion's copy, ``iterv{i}/kernel.<ext>`` (``suffix`` ``.cu`` or ``.py``)."""
        return self.dir / f"kernel{suffix}"

    # the agent's input and the iteration's evidence
    methods = _At("methods.json")
    analysis = _At("analysis.md")
    roofline = _At("roofline.json")
    ncu_top = _At("ncu_top.json")
    best_input_rep = _At("best_input.ncu-rep")
    # the close's records
    champion_rep = _At("kernel.ncu-rep")
    champion_ncu_top = _At("kernel_ncu_top.json")
    champion_roofline = _At("kernel_roofline.json")
    branch_results = _At("branch_results.json")
    attribution = _At("attribution.json")
    sass_check = _At("sass_check.json")
    bench = _At("bench.json")
    decision = _At("decision.json")
    decision_ablations = _At("decision_ablations.json")
    report = _At("report.json")
    report_ablations = _At("report_ablations.json")
    # the machine each step of the close ran on (env.json of that step: pytest_kopt.loop.envs)
    env = _At("env.json")
    env_ablations = _At("env_ablations.json")


@dataclass(frozen=True, slots=True)
class RunLayout:
    """The files of one run directory ``root`` (``run_YYYYMMDD_HHMMSS/``), as SKILL.md names them, plus the
    run's private copies (``reference/``) and its step lock."""

    root: Path

    @classmethod
    def of(cls, run_dir: Path | str) -> "RunLayout":
        """The layout of ``run_dir`` (taken as given: an absolute path makes absolute paths)."""
        return cls(Path(run_dir))

    @property
    def folder(self) -> Path:
        return self.root

    state = _At("state.json")
    env = _At("env.json")
    stop = _At("stop.json")
    summary = _At("summary.md")
    speedup_png = _At("speedup.png")
    roofline_drift_png = _At("roofline_drift.png")
    baseline_dir = _At("baseline")
    #: the run's private copy of the reference and the modules beside it that it imports
    reference_dir = _At("reference")
    #: held by the step (``--kopt-init``/``--kopt-run``) that works on the run; its holder's pid beside it
    lock = _At(".kopt-step.lock")
    lock_holder = _At(".kopt-step.json")

    def baseline_kernel(self, name: str) -> Path:
        """``baseline/<name>``: the run's copy of the baseline kernel."""
        return self.baseline_dir / name

    def reference(self, name: str) -> Path:
        """``reference/<name>``: the run's copy of the reference file."""
        return self.reference_dir / name

    def iteration(self, i: int) -> IterationLayout:
        return IterationLayout(self.root, int(i))

    def relative(self, path: Path | str) -> str:
        """``path`` relative to the run (``iterv1/kernel.cu``), or the path itself when it lies elsewhere."""
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def place(self, kernel: Path | str) -> Place | None:
        """Where ``kernel`` sits, by its path's shape: ``iterv{i}/branches/b{k}/kernel.<ext>`` (a branch) or
        ``iterv{i}/ablations/<method>/kernel.<ext>`` (an ablation); None for any other path. Lexical: nothing is
        resolved (see :meth:`contained` for that)."""
        try:
            parts = Path(kernel).relative_to(self.root).parts
        except ValueError:
            return None
        if len(parts) != 4 or parts[3] not in KERNEL_NAMES or parts[1] not in (BRANCHES, ABLATIONS):
            return None
        m = ITERATION_RE.match(parts[0])
        if m is None or (parts[1] == BRANCHES and branch_index(parts[2]) is None):
            return None
        return Place("branch" if parts[1] == BRANCHES else "ablation", int(m.group(1)), parts[2])

    def branch_of(self, kernel: Path | str) -> str | None:
        """The branch name (``b2``) of a branch kernel, None for anything else."""
        p = self.place(kernel)
        return p.name if p is not None and p.kind == "branch" else None

    def is_branch_kernel(self, kernel: Path | str) -> bool:
        return self.branch_of(kernel) is not None

    def is_ablation_kernel(self, kernel: Path | str) -> bool:
        p = self.place(kernel)
        return p is not None and p.kind == "ablation"

    def artifact_folder(self, kernel: Path | str) -> Path | None:
        """The artifact folder of a branch or ablation kernel of this run (its own folder: the gates write
        ``bench.json``, ``sass/``, ``correctness/`` beside the kernel), None for any other path."""
        return Path(kernel).parent if self.place(kernel) is not None else None

    def contained(self, path: Path, expected: Path | None = None) -> str | None:
        """None when ``path`` resolves (symlinks followed) to itself inside the run, else a problem sentence naming
        the path and where it leads. ``expected``: the path it must be (default ``path``): a symlink anywhere below
        the run, even to a place inside it, is refused, as the gates would write its artifacts where it leads."""
        want = (expected or path)
        try:
            real = path.resolve()
            root = self.root.resolve()
            want_real = root / want.relative_to(self.root)
        except ValueError:
            return f"{path} is not inside the run directory {self.root}"
        except OSError as exc:
            return f"{path} cannot be resolved ({exc})"
        if real == want_real and not path.is_symlink():
            return None
        if real != root and root not in real.parents:
            return f"{path} leads outside the run directory {self.root} (to {real})"
        return f"{path} is a symbolic link (to {real}); the run's folders and kernels must be plain files and folders"


def is_branch_kernel(kernel: Path | str, run_dir: Path | str | None) -> bool:
    """True when ``kernel`` is a branch kernel (``iterv{i}/branches/b{k}/kernel.<ext>``) of the run ``run_dir``;
    False without a run."""
    return run_dir is not None and RunLayout.of(run_dir).is_branch_kernel(kernel)


def artifact_folder(run_dir: Path | str | None, kernel: Path | str) -> Path | None:
    """A run kernel's artifact folder (see :meth:`RunLayout.artifact_folder`); None without a run or for a path
    that is no branch or ablation kernel of it."""
    return None if run_dir is None else RunLayout.of(run_dir).artifact_folder(kernel)
