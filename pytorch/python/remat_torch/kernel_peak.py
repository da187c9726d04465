"""The peak of the kernels Inductor made from a plan (Note [The kernels' peak checked]).

Note [The kernels' peak checked]
The peak model (`peak_model.py`) reads fx nodes; Inductor runs kernels. Its scheduler
groups nodes into kernels that write several buffers at once, lowers a batch norm's
backward into kernels of its own, and does or does not write a result into a dying input,
so the model is off by a fraction of a percent either way (resnet18 at batch 16: 459 KB
under, on a 115 MB step). The scheduler's own buffers come closer: after fusion, this
pass (Inductor's `_post_fusion_custom_pass`) puts the kernels in the order Inductor would
(its peak-memory reordering, when on, so that the order checked is the order that runs),
walks them with Inductor's memory timeline (each buffer from its kernel to its last
reader, the backward's saved inputs freed after their last reader, less the buffers a
fused kernel makes and alone reads, which its code never allocates), adds each extern
kernel's measured workspace at its step, and hands the peak to the partitioner that made
the plan, with the bytes of any input no kernel reads (the compiled call holds those until
it returns), at each extern call of a multi-output operator the outputs nothing reads
(the call makes them; no scheduler buffer stands for them), and from an extern call whose
outputs nothing reads at all to the graph's end, what it made (the code holds it there).
A kernel that writes its result into a dying input of its size (Inductor decides that
when it writes the kernel, after this pass) counts as two buffers, and a fused kernel
with a reduction keeps every buffer, so the sum errs above the allocator's peak where it
is not exact. The partitioner keeps the plan if the step's peak is within the budget, and
otherwise raises: `remat_torch.compile` then compiles again, its search knowing that
plan's real peak.

Inductor's buffer reuse (`allow_buffer_reuse`) keeps a dead buffer until a new one of its
size wants it, past the free the timeline assumes (29 KB on the GPT of the tests);
`remat_torch.compile` turns it off. The search asks the same question before compiling
(`probe_kernel_peak`): Inductor lowers and schedules a copy of each candidate's graphs
and stops after fusion, a few seconds a plan, remembered for the process.
"""
import operator

import torch
from torch._inductor.custom_graph_pass import CustomSchedulerPass

from .peak_model import _nbytes, _workspace


def _memory_timeline(nodes):
    """(bytes live at each kernel, the freeable graph inputs' bytes) for `nodes` in order,
    by Inductor's own accounting."""
    from torch._inductor import memory
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    graph, scheduler = V.graph, V.graph.scheduler
    inputs = OrderedSet(graph.graph_inputs.keys())
    outputs = OrderedSet(graph.get_output_names())
    _, freeable = memory.prepare_planning_info(
        nodes, scheduler.name_to_buf, scheduler.name_to_fused_node, inputs, outputs)
    _, live = memory.estimate_peak_memory(nodes, freeable, outputs)
    sizes = memory.compute_size_for_scheduler_buffer(scheduler.name_to_buf)
    return [bytes_live - sum(sizes.get(name, (0, 0))[0] for name in _kernel_local(node))
            for node, bytes_live in zip(nodes, live)]


def _kernel_local(node):
    """Names of the buffers a fused kernel makes and alone reads: its code keeps them in
    registers, never allocated. Inductor removes them when it writes the kernel, after this
    pass; its own timeline still counts them."""
    from torch._inductor.virtualized import V
    scheduler = V.graph.scheduler
    inner = node.get_nodes()
    members = {n.get_name() for n in inner}
    if len(members) < 2 or any(n.is_reduction() for n in inner):
        return []  # a reduction's kernel keeps the buffers between its loops
    return [buf.get_name() for buf in node.get_outputs()
            if buf.get_name() not in scheduler.mutation_renames
            and buf.get_name() not in scheduler.mutation_real_name
            and all(user.is_weak or user.get_name() in members for user in buf.users)]


def _in_peak_order(nodes):
    """Inductor's peak-memory reordering, which runs after this pass, applied first: it
    keeps the first of the orders it estimates lowest, so it keeps this one."""
    from torch._inductor import config, memory
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    if not config.reorder_for_peak_memory:
        return nodes
    graph, scheduler = V.graph, V.graph.scheduler
    return memory.reorder_for_peak_memory(
        nodes, scheduler.name_to_buf, scheduler.name_to_fused_node,
        OrderedSet(graph.graph_inputs.keys()), OrderedSet(graph.get_output_names()))


def _kernel_workspace(node):
    """Bytes an extern kernel takes for its call beyond the buffers the scheduler shows:
    its measured workspace, and the outputs of a multi-output operator that nothing reads
    (the call makes them; no buffer stands for them)."""
    from torch._inductor.scheduler import ExternKernelSchedulerNode
    if not isinstance(node, ExternKernelSchedulerNode) or node.node is None:
        return 0
    return max((_workspace(origin) + _unread_outputs(origin) for origin in node.node.origins),
               default=0)


def _dead_call(node):
    """Bytes of an extern call none of whose outputs anything reads (a random operator fx
    would not remove): the generated code keeps its result until the graph returns."""
    from torch._inductor.scheduler import ExternKernelSchedulerNode
    if (not isinstance(node, ExternKernelSchedulerNode) or node.node is None
            or any(not user.is_weak for buf in node.get_outputs() for user in buf.users)):
        return 0
    return max((_nbytes(o) for o in node.node.origins
                if isinstance(o.target, torch._ops.OpOverload)), default=0)


def _unread_outputs(origin):
    values = origin.meta.get("val")
    if not isinstance(values, (tuple, list)):
        return 0
    read = {u.args[1] for u in origin.users if u.target is operator.getitem}
    return sum(v.numel() * v.element_size() for i, v in enumerate(values)
               if i not in read and isinstance(v, torch.Tensor))


def _unread_inputs():
    """Bytes of the graph's freeable inputs no kernel reads (Inductor's timeline leaves
    them out; the compiled call holds them until it returns)."""
    from torch._inductor.utils import is_nonfreeable_buffers
    from torch._inductor.dependencies import StarDep
    from torch._inductor.virtualized import V
    graph = V.graph
    read = {dep.name for node in graph.scheduler.nodes for dep in node.read_writes.reads}
    total = 0
    for name, value in graph.graph_inputs.items():
        if name in read or is_nonfreeable_buffers(StarDep(name)):
            continue
        try:
            total += int(value.get_numel()) * value.get_dtype().itemsize
        except Exception:  # a symbolic or size-less input: nothing to count
            continue
    return total


def kernel_peak(nodes):
    """(nodes in the order they will run, the peak bytes they take: buffers and
    workspace, the graph's non-freeable inputs (parameters, tangents) not counted)."""
    nodes = _in_peak_order(nodes)
    live = _memory_timeline(nodes)
    held, peak = 0, 0
    for node, bytes_live in zip(nodes, live):
        peak = max(peak, held + bytes_live + _kernel_workspace(node))
        held += _dead_call(node)
    return nodes, peak + _unread_inputs()


class KernelPeakCheck(CustomSchedulerPass):
    """Inductor's `_post_fusion_custom_pass` for graphs a RematPartitioner split: measures
    their kernels' peak and lets the partitioner judge it."""

    def __init__(self, partitioner):
        self.partitioner = partitioner

    def __reduce__(self):
        return (KernelPeakCheck, (self.partitioner,))

    def uuid(self):
        return self.partitioner.uuid()

    def __call__(self, nodes):
        from torch._inductor.virtualized import V
        plan = getattr(V.graph.module, "meta", {}).get("remat_plan")
        if plan is None:
            return nodes  # not a graph of one of this partitioner's plans
        nodes, peak = kernel_peak(nodes)
        self.partitioner.kernels_measured(plan, V.graph.is_backward, peak)
        return nodes


def _cause(error, kind):
    """The exception of type `kind` inside `error` (Dynamo wraps a backend's errors)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = getattr(error, "inner_exception", None) or error.__cause__
    return None


class _Probed(Exception):
    def __init__(self, peak):
        super().__init__(peak)
        self.peak = peak


class _Probe(CustomSchedulerPass):
    """A post-fusion pass that measures the kernels' peak and stops the compilation."""

    def __init__(self):
        self.token = object()

    def uuid(self):
        return f"remat-probe-{id(self.token)}"  # never served from a cache

    def __call__(self, nodes):
        _, peak = kernel_peak(nodes)
        raise _Probed(peak)


def probe_kernel_peak(gm, is_backward):
    """The kernels' peak of `gm` as Inductor would make them, without making them: Inductor
    lowers and schedules a copy of the graph and stops after fusion. None where it cannot."""
    import copy

    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    error = None
    with config.patch(_post_fusion_custom_pass=_Probe(), fx_graph_cache=False):
        try:
            compile_fx_inner(copy.deepcopy(gm), inputs, is_backward=is_backward)
        except Exception as raised:  # noqa: BLE001 (the probe's own stop, wrapped or not)
            error = raised
    probed = _cause(error, _Probed)
    return None if probed is None else probed.peak


def probe_step_peak(fw, bw, held):
    """The step's peak as the kernels of `fw` and `bw` would take it (Note [The kernels'
    peak checked]), the graph's inputs (`held`) included; None where Inductor cannot say."""
    from .peak_model import held_through_backward
    forward = probe_kernel_peak(fw, is_backward=False)
    backward = probe_kernel_peak(bw, is_backward=True) if forward is not None else None
    if backward is None:
        return None
    return held + max(forward, held_through_backward(fw, bw) + backward)
