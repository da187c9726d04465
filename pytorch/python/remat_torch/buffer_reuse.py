"""Inductor's buffer reuse judged by the kernels' own timeline (Note [Reuse that costs no
peak]).

Note [Reuse that costs no peak]
With `allow_buffer_reuse` (on by default), Inductor's wrapper keeps a buffer it would free
in a pool by size, dtype and device, and a later allocation of the same key takes it
instead of new memory: the allocator sees neither the free nor the allocation, so the
buffer's bytes stay live at every kernel between the two (Note [A reused buffer is held
until it is reused]). Inductor takes a pooled buffer when the two kernels are adjacent, or
when its estimate of the peak between them plus the buffer stays within its estimate of
the graph's peak. That estimate is its scheduler's raw timeline, which counts buffers
fusion removes and no extern call's workspace; on the benchmark's GPT at its least budget
it let reuse hold buffers across the real peak, and the least any plan needed rose from
34.7 to 41.6 MB. Here the wrapper asks its two questions (`peak_between`,
`update_peak_between`) of the kernels' timeline instead, exact where compared with the
allocator: a reuse is taken only where it costs no peak, so the step keeps reuse's speed
(2% of the GPT's step) and the peak the kernels' sum gives without it. Which buffers were
reused is still read from the planned lines, and the check adds what they hold; where
Inductor ran the nodes in another order than the pass saw, its own estimate stands, and
the check judges what it planned.
"""
from torch._inductor.codegen.wrapper import EfficientPeakEstimate


class KernelPeakEstimate(EfficientPeakEstimate):
    """Answers the questions Inductor's wrapper asks its `EfficientPeakEstimate` while it
    plans buffer reuse, from `totals`: the bytes live while each scheduler node runs (the
    node's index is the one the wrapper's lines carry). Inductor's own estimate is not
    built; its sizing of an allocation (`_get_size`) is kept."""

    def __init__(self, totals):  # not the base's: it builds the raw estimate
        self.totals = list(totals)
        self.overall_peak_memory = max(self.totals, default=0)

    def peak_between(self, freed, allocated):
        """The most bytes live at the nodes strictly between a free and an allocation."""
        return max(self.totals[freed.scheduler_node_index + 1:allocated.scheduler_node_index],
                   default=0)

    def update_peak_between(self, freed, allocated):
        """The freed buffer, now reused, is held at the nodes between."""
        size = self._get_size(allocated.node)
        for i in range(freed.scheduler_node_index + 1, allocated.scheduler_node_index):
            self.totals[i] += size


def plan_reuse_by(nodes, totals, report):
    """Has the wrapper of the graph being compiled plan its buffer reuse against `totals`
    (the bytes live at each of `nodes`, in the order the pass left them), and calls
    `report` with the pairs it reused (freed, reused as) once it has planned them."""
    from torch._inductor import config
    from torch._inductor.virtualized import V
    wrapper, order = V.graph.wrapper_code, [node.get_name() for node in nodes]
    plan = wrapper.memory_plan_reuse

    def planned():
        ran = [node.get_name() for node in V.graph.scheduler.nodes]
        if config.allow_buffer_reuse and ran == order:
            wrapper.estimate_peak = KernelPeakEstimate(totals)
        plan()
        report(reused_pairs(wrapper.lines))

    wrapper.memory_plan_reuse = planned


def reused_pairs(lines):
    """(freed, reused as) names of the buffers the planned `lines` reuse from the pool
    (not the results written into a dying input, which the timeline counts already)."""
    from torch._inductor.codegen.wrapper import FreeIfNotReusedLine, ReuseLine
    freed = {line.node.get_name() for line in lines
             if isinstance(line, FreeIfNotReusedLine) and line.is_reused}
    return [(line.node.get_name(), line.reused_as.get_name()) for line in lines
            if isinstance(line, ReuseLine) and line.node.get_name() in freed]
