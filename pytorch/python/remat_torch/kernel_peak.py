"""The peak of the kernels Inductor made from a plan (Note [The kernels' peak checked]).

Note [The kernels' peak checked]
The peak model (`peak_model.py`) reads fx nodes; Inductor runs kernels. Its scheduler
groups nodes into kernels that write several buffers at once, lowers a batch norm's
backward into kernels of its own, and does or does not write a result into a dying input,
so the model is off by a fraction of a percent either way (resnet18 at batch 16: 459 KB
under, on a 115 MB step). The kernels themselves are exact: after fusion, this pass
(Inductor's `_post_fusion_custom_pass`) puts the kernels in the order Inductor would (its
peak-memory reordering, when on, so that the order checked is the order that runs),
walks them with the timeline the generated code keeps (`kernel_timeline.py`, Note [The
timeline the generated code keeps]), adds at each extern call the measured workspace of
the operator it calls (Note [A kernel's workspace is its own operator's]) and the outputs
of a multi-output operator that nothing reads (the call makes them; no scheduler buffer
stands for them), holds from an extern call whose outputs nothing reads at all to the
graph's end what it made (the code holds it there), adds the bytes of any input no
kernel reads (the compiled call holds those until it returns), and hands the peak to the
partitioner that made the plan. On the models of compile_test and torchvision's
mobilenet_v3_small, every plan's step measured what this sum said, to the byte, on the
CPU. The partitioner keeps the plan if the step's peak is within the budget, and
otherwise raises: `remat_torch.compile` then compiles again, its search knowing that
plan's real peak.

Inductor's buffer reuse (`allow_buffer_reuse`, on by default) keeps a dead buffer until
a new one of its size takes it; its wrapper is made to take one only where that costs no
peak by this timeline (Note [Reuse that costs no peak]), so the kernels' sum holds with it,
and the check, run once the wrapper has planned, adds what the buffers it reused hold
(nothing, unless Inductor changed the order after this pass). The search asks the same
question before compiling (`probe_kernel_peak`): Inductor lowers and schedules a copy of
each candidate's graphs and stops after fusion, told which of the backward's inputs
AOTAutograd will donate (Note [The backward's donated inputs]); a few seconds a plan,
remembered for the process.
"""
import operator

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomSchedulerPass

from .buffer_reuse import plan_reuse_by
from .kernel_timeline import input_bytes, memory_timeline
from .peak_model import _nbytes, _value_of, _workspace


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
    (the call makes them; no buffer stands for them). Only for the fx operator the kernel
    calls (Note [A kernel's workspace is its own operator's])."""
    from torch._inductor import ir
    from torch._inductor.scheduler import ExternKernelSchedulerNode
    if (not isinstance(node, ExternKernelSchedulerNode) or node.node is None
            or isinstance(node.node, ir.MultiOutput)):
        return 0
    called = _called_operator(node.node)
    return max((_workspace(origin) + _unread_outputs(origin) for origin in node.node.origins
                if _operator_name(origin.target) == called), default=0)


# Note [A kernel's workspace is its own operator's]
# An extern kernel's origins are the fx nodes it came from, and it need not call their
# operator: Inductor lowers max_pool2d's backward on the CPU into a scatter_reduce_ into a
# zeroed buffer, which takes no workspace, while the backward run alone took 12.5 MB above
# its output (resnet18's step was judged 5 MB over its measured peak). A multi-output
# operator's results (`MultiOutput`) are taken from its call, which ran the step before.
# The workspace counts only where the kernel calls the origin's operator.
def _operator_name(target):
    """'convolution' for aten.convolution.default; None for what is not an operator."""
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", None)


def _called_operator(kernel):
    """The name of the operator an extern kernel calls, from its op overload or its
    kernel's name ('extern_kernels.convolution', 'aten.scatter_reduce_.two')."""
    called = _operator_name(getattr(kernel, "op_overload", None))
    if called is not None:
        return called
    name = getattr(kernel, "python_kernel_name", None) or ""
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] in ("aten", "torch"):
        return parts[-2]
    return parts[-1] or None


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
        if name not in read and not is_nonfreeable_buffers(StarDep(name)):
            total += input_bytes(value)
    return total


class _KernelBytes:
    """What a graph's kernels take, read after fusion."""

    def __init__(self, nodes):
        self.nodes = _in_peak_order(nodes)
        self.timeline = memory_timeline(self.nodes)
        self.workspace = [_kernel_workspace(node) for node in self.nodes]
        self.dead = [_dead_call(node) for node in self.nodes]
        self.unread = _unread_inputs()

    def totals(self, reuses=()):
        """Bytes live while each node runs, buffers and workspace, with the buffers in
        `reuses` held until reused; the graph's non-freeable inputs (parameters,
        tangents) and the inputs no kernel reads not counted."""
        held, totals = 0, []
        for live, workspace, dead in zip(self.timeline.with_reuse(reuses), self.workspace,
                                         self.dead):
            totals.append(held + live + workspace)
            held += dead
        return totals

    def peak(self, reuses=()):
        """The peak bytes the kernels take (`totals`, and the inputs no kernel reads)."""
        return max(self.totals(reuses), default=0) + self.unread


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
        kernels, is_backward = _KernelBytes(nodes), V.graph.is_backward
        plan_reuse_by(kernels.nodes, kernels.totals(), lambda reuses: (
            self.partitioner.kernels_measured(plan, is_backward, kernels.peak(reuses))))
        return kernels.nodes


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
        raise _Probed(_KernelBytes(nodes).peak())  # Note [Reuse that costs no peak]


def probe_kernel_peak(gm, is_backward, donated=None):
    """The kernels' peak of `gm` as Inductor would make them, without making them: Inductor
    lowers and schedules a copy of the graph and stops after fusion. `donated`: the
    backward's inputs AOTAutograd lets Inductor write into. None where Inductor cannot
    say."""
    import copy
    from unittest import mock

    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    error = None
    with (config.patch(_post_fusion_custom_pass=_Probe(), fx_graph_cache=False),
          mock.patch("torch._inductor.graph.get_donated_idxs", lambda: donated)):
        try:
            compile_fx_inner(copy.deepcopy(gm), inputs, is_backward=is_backward)
        except Exception as raised:  # noqa: BLE001 (the probe's own stop, wrapped or not)
            error = raised
    probed = _cause(error, _Probed)
    return None if probed is None else probed.peak


# Note [The backward's donated inputs]
# AOTAutograd donates to the backward each saved tensor that shares no storage with the
# forward's inputs, its outputs to the user or the backward's outputs, and tells Inductor
# through the compile's tracing context, which a probe does not run in. Inductor may
# write a result into a donated input where it dies (GPT's logits: 256 KiB a step), so a
# probe told nothing judged the backward that much above what it measured.
def donated_inputs(fw, bw):
    """The indices of `bw`'s inputs AOTAutograd will donate, as it finds them; None where
    it donates none."""
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd.graph_compile import collect_fw_donated_buffer_idxs
    if not functorch_config.donated_buffer:
        return None
    fw_outputs = next(reversed(fw.graph.find_nodes(op="output"))).args[0]
    bw_inputs = bw.graph.find_nodes(op="placeholder")
    bw_outputs = next(reversed(bw.graph.find_nodes(op="output"))).args[0]
    produced = {node.name for node in fw_outputs if isinstance(node, fx.Node)}
    saved = [i for i, node in enumerate(bw_inputs) if node.name in produced]
    tensors = [i for i in saved if isinstance(_value_of(bw_inputs[i]), torch.Tensor)]
    donated = collect_fw_donated_buffer_idxs(
        [_value_of(node) for node in fw.graph.find_nodes(op="placeholder")],
        [_value_of(node) for node in fw_outputs[:len(fw_outputs) - len(saved)]],
        [_value_of(node) for node in bw_outputs], [_value_of(bw_inputs[i]) for i in tensors])
    return [tensors[i] for i in donated]


def probe_step_peak(fw, bw, held):
    """The step's peak as the kernels of `fw` and `bw` would take it (Note [The kernels'
    peak checked]), the graph's inputs (`held`) included; None where Inductor cannot say."""
    from .peak_model import held_through_backward
    forward = probe_kernel_peak(fw, is_backward=False)
    backward = (probe_kernel_peak(bw, is_backward=True, donated=donated_inputs(fw, bw))
                if forward is not None else None)
    if backward is None:
        return None
    return held + max(forward, held_through_backward(fw, bw) + backward)
