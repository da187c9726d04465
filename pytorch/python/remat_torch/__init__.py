"""remat as a PyTorch device: tensors and modules moved to `remat_torch.device` are kept by
remat's runtime under a memory budget, evicted when it is reached and recomputed when read.

    import torch, remat_torch
    remat_torch.set_budget(256 << 20)           # bytes; a hard cap on reserved memory
    model = model.to(remat_torch.device)
    for x, y in batches:
        with remat_torch.step():                # optional: marks a training step
            loss = loss_fn(model(x.to(remat_torch.device)), y.to(remat_torch.device))
            opt.zero_grad(); loss.backward(); opt.step()
    print(remat_torch.stats())

Every operator runs its CPU kernel over remat's memory, so the results are bitwise those of
the same program on the CPU. Build with CMake; the module is in build/python (PYTHONPATH).
"""
import contextlib
import types

import torch

from . import _C

_NAME = "remat"


def _register():
    if torch._C._get_privateuse1_backend_name() != _NAME:
        torch.utils.rename_privateuse1_backend(_NAME)
    module = types.ModuleType("torch." + _NAME)
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module._is_in_bad_fork = lambda: False
    module.manual_seed_all = lambda seed: None
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    # One device: selecting it changes nothing (torch.load's map_location enters it).
    module.device = lambda device=None: contextlib.nullcontext()
    torch._register_device_module(_NAME, module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                         for_storage=True)


def _optimizers_loop_per_tensor():
    """Optimizers default to their per-tensor loop on the device, as they do on the CPU.

    torch counts every PrivateUse1 device among those with foreach kernels, and a foreach
    call is one operator over every parameter: its results (weight decay's copy of every
    gradient, say) are one remat op's outputs, resident together, where the per-tensor loop
    needs one parameter's worth at a time. An optimizer given foreach=True still uses them.
    """
    import torch.optim.optimizer as optimizer

    supported = optimizer._get_foreach_kernels_supported_devices

    def without_remat():
        return [d for d in supported() if d != _NAME]

    optimizer._get_foreach_kernels_supported_devices = without_remat


_register()
_optimizers_loop_per_tensor()

device = torch.device(_NAME, 0)


def set_budget(nbytes):
    """Caps the runtime's reserved bytes at `nbytes` (None: no cap)."""
    _C.set_budget(2**64 - 1 if nbytes is None else int(nbytes))


def budget():
    return _C.budget()


def set_policy(name):
    """The policy (`policies()`), set before any tensor is on the device: an eviction policy
    alone ("dtr", the default, and others), or "auto", which records the steps marked with
    `step()`, plans them and follows the plan where it recomputes less than DTR
    (`plan_report()` says which)."""
    _C.set_policy(name)


def set_host_memory(nbytes):
    """Host memory (bytes) the program's state may wait in while a step marked with `step()`
    does not read it (AdamW's moments during the forward and backward passes), out of the
    budget; 0, the default: none. Set before any tensor is on the device. stats() counts
    offloads, restores and offloaded_bytes."""
    _C.set_host_memory(int(nbytes))


def set_costs(kind):
    """What operators cost to the eviction policy: "estimated" (the default), from each call's
    arithmetic and memory traffic, the same on every run, so two runs of a program evict and
    recompute the same tensors; or "measured", each operator timed on its first runs, closer to
    this machine but varying from run to run. Applies to the calls made after it."""
    _C.set_costs(kind)


def costs():
    return _C.costs()


def set_execution(name):
    """What runs the operators' kernels (`executions()`), set before any tensor is on the
    device: "cpu", each operator's CPU kernel over host memory; "simulated_cuda", the runtime
    on a simulated CUDA device (its memory is host memory), the CPU kernels launched on its
    stream, with races, invalid accesses and the host's waits for the device reported by
    `execution_problems()` and `host_waits()`. The default: the environment's
    REMAT_TORCH_EXECUTION, else "cpu"."""
    _C.set_execution(name)


def execution():
    return _C.execution()


def executions():
    return _C.executions()


def execution_problems():
    """Races and invalid accesses the execution saw since `clear_execution_problems()`, one
    line each (none on "cpu")."""
    return _C.execution_problems()


def clear_execution_problems():
    _C.clear_execution_problems()


def host_waits():
    """The times the host waited for the device so far (0 on "cpu")."""
    return _C.host_waits()


def _side_read(tensor, record_stream):
    """For tests, on "simulated_cuda": a read of `tensor`'s storage on another stream, which
    the runtime is told about (record_stream) or not."""
    _C._side_read(tensor, bool(record_stream))


def policy():
    return _C.policy()


def policies():
    return ["auto"] + list(_C.policies())


def plan_report():
    """Where policy "auto" stands: a dict with phase ("off" under another policy,
    "unconstrained", "warm-up", "recording", "trial", "plan" or "dtr"), source (the plan
    followed or tried), steps, dtr_step_overhead, plan_step_overhead, dtr_step_seconds,
    plan_step_seconds (the trial keeps the plan where it ran no slower), planning_seconds and
    screened (each candidate's simulated_overhead)."""
    return dict(_C.plan_report())


def stats():
    """A dict: peak_reserved_bytes, evictions, recomputations, compute_overhead and more."""
    return dict(_C.stats())


def held_tensors():
    """What the program holds on the device, by the operator that made it: a list of dicts
    (op, tensors, bytes, resident_bytes, pinned_bytes), the most resident bytes first."""
    return list(_C.held_tensors())


def reset_peaks():
    _C.reset_peaks()


def evict_all():
    """Evicts every storage that can be evicted now (they come back when read)."""
    return _C.evict_all()


class cpu_memory:
    """Counts the CPU tensor bytes allocated inside the block, on any thread, and their
    frees: `peak_bytes` above what was live when it began, `live_bytes` now (Note [Measuring
    a step's CPU memory]). A compiled step's peak, which the profiler sees only as the net
    of each compiled call:

        with remat_torch.cpu_memory() as meter:
            loss_fn(compiled(x), y).backward()
        print(meter.peak_bytes)
    """

    def __enter__(self):
        self._meter = _C._CpuMemoryMeter()
        return self

    def __exit__(self, *exc):
        self.peak_bytes = self._meter.peak_bytes()
        self.live_bytes = self._meter.live_bytes()
        del self._meter
        return False


def __getattr__(name):
    # torch.compile's partitioner loads Inductor: only when asked for.
    if name == "TorchTooOld":
        from .torch_hooks import TorchTooOld
        return TorchTooOld
    if name in ("compile", "RematPartitioner", "partition_reports", "BudgetTooSmall",
                "Replan"):
        from . import partitioner
        return getattr(partitioner, name)
    raise AttributeError(f"module 'remat_torch' has no attribute {name!r}")


@contextlib.contextmanager
def step():
    """Marks a training step (the runtime numbers its ops and can plan repeated steps).

    An error inside the step propagates as it is (the step is ended on the way, an error of
    that ending only warned of); an error of ending the step itself (a followed plan's
    deferred operators run then) is raised from the end of the block.
    """
    scope = _C._StepScope()
    try:
        yield
    except BaseException:
        del scope  # ends it; the body's error is the one to see
        raise
    scope.end()
