"""``@triton.autotune`` in a harness process: tune once, then pin.

The autotuner benchmarks every config on the first call of each key; a timed run, an ncu profile or a SASS check
that includes that tuning measures the configs it threw away (SKILL.md: hard-code the config before profiling).
So the compile gate's process lets it choose (on a GPU) or states the first config (without one, where it cannot
time anything), and every later process runs that one config: :func:`install` wraps ``Autotuner.run`` in the
process, in one of four modes:

- ``tune``: Triton's own tuning; the choice is recorded (the compile gate on a GPU);
- ``pin``: the recorded config of each kernel, no tuning (every later gate; correctness under Triton's CPU
  interpreter, whose launches cannot be timed, pins each config in turn: :func:`pytest_kopt.gates.correctness.config_pins`);
- ``first``: each kernel's first config, no tuning (a CPU run given no pin);
- ``each``: every config launched in turn (the ahead-of-time compile without a GPU, which captures the launches).
"""

from __future__ import annotations

from typing import Any

#: kernel name -> {"config": the config's kwargs, "configs": how many it has, "all": every config's kwargs, in
#: order, "kernel": the compiled kernel or None}
CHOSEN: dict[str, dict[str, Any]] = {}


def config_kwargs(config: Any) -> dict[str, Any]:
    """A ``triton.Config``'s meta-parameters and launch options (num_warps, num_stages...) as plain values."""
    return {k: v for k, v in config.all_kwargs().items() if isinstance(v, (int, float, bool, str))}


def describe(kwargs: dict[str, Any]) -> str:
    """``BLOCK_M=64, num_warps=4`` for a config's kwargs."""
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


def _prunes(tuner: Any) -> bool:
    """True when the autotuner rules configs out per call (``prune_configs_by``: an early prune or a perf model)."""
    return bool(getattr(tuner, "early_config_prune", None) or getattr(tuner, "perf_model", None))


def install(mode: str, pins: dict[str, dict[str, Any]] | None = None) -> bool:
    """Wrap ``triton.runtime.autotuner.Autotuner.run`` for ``mode`` (see the module); ``pins`` maps a kernel's name
    to the config kwargs to run (``pin``). Returns False when triton has no autotuner to wrap. Raises KeyError in a
    launch when a pin names no config of the kernel (its configs changed since the compile gate)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return False
    original = getattr(Autotuner.run, "__kopt_original__", Autotuner.run)
    # a warm process imports a kernel file once and serves several requests, each installing its own policy: a
    # config remembered on the autotuner under an earlier policy (another request's pin) is not this one's
    token = object()

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = self.base_fn.__name__
        configs = self.configs
        pinned = getattr(self, "__kopt_pinned__", None)  # the timed loop's path: one dict lookup, no matching
        if pinned is not None and pinned[0] is token and mode != "each" and not _prunes(self):
            return self.fn.run(*args, **kwargs, **pinned[1])
        if mode == "tune" or (len(configs) < 2 and mode != "each") or (mode == "pin" and name not in (pins or {})):
            ret = original(self, *args, **kwargs)
            chosen = self.best_config
        else:
            self.nargs = dict(zip(self.arg_names, args))
            if mode == "pin":
                want = pins[name]  # type: ignore[index]
                matching = [c for c in configs if config_kwargs(c) == want]
                if not matching:
                    raise KeyError(f"{name}: no config of its @triton.autotune is {describe(want)}, the one the "
                                   "compile gate pinned")
                # a config the kernel's own pruning rules out for this call's arguments (another shape) is not
                # run: its first admitted config is, as Triton would pick among those
                pruned = list(self.prune_configs(kwargs)) if _prunes(self) else configs
                run_configs = [c for c in matching if c in pruned][:1] or pruned[:1]
            elif mode == "each":
                run_configs = list(self.prune_configs(kwargs))
            else:
                pruned = list(self.prune_configs(kwargs)) if _prunes(self) else configs
                run_configs = list(pruned[:1])
            ret = None
            for config in run_configs:
                full = {**self.nargs, **kwargs, **config.all_kwargs()}
                if config.pre_hook is not None:
                    config.pre_hook(full)
                ret = self.fn.run(*args, **kwargs, **config.all_kwargs())
            chosen = run_configs[0]
            self.best_config = chosen
            self.nargs = None
            if mode in ("pin", "first") and chosen.pre_hook is None:
                self.__kopt_pinned__ = (token, chosen.all_kwargs())
        CHOSEN[name] = {"config": config_kwargs(chosen), "configs": len(configs),
                        "all": [config_kwargs(c) for c in configs], "kernel": ret}
        return ret

    run.__kopt_original__ = original  # type: ignore[attr-defined]
    Autotuner.run = run  # type: ignore[method-assign]
    return True


def chosen() -> dict[str, dict[str, Any]]:
    """Per autotuned kernel launched in this process: ``config`` (kwargs), ``configs`` (how many it has) and
    ``all`` (every config's kwargs, in the decorator's order: the CPU's correctness runs each of them)."""
    return {name: {"config": c["config"], "configs": c["configs"], "all": c["all"]} for name, c in CHOSEN.items()}
