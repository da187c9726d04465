"""Bytes live while each of Inductor's kernels runs, as its generated code allocates them.

Note [The timeline the generated code keeps]
Inductor's own timeline (`torch._inductor.memory`) follows its scheduler nodes: each
buffer from the node that makes it to its last reader. The code Inductor writes after
fusion differs from it in four ways, each seen against the allocator's count on the
models of compile_test and torchvision's mobilenet_v3_small:

1. A freeable graph input is sized by its last read, which can cover a part of it
   (Note [An input's bytes are its own, not a read's]).
2. A fused kernel keeps the buffers that it makes and alone reads in registers; they
   are never allocated (unless a reduction's loops pass them between each other). Nor
   are the views a kernel writes into another buffer (a cat's inputs, in its output).
3. A kernel writes a result into an input that dies there, when their sizes match
   (Inductor's `decide_inplace_update`, made when it writes the kernel): one buffer,
   not two. Asked here of each node with the nodes before it complete, as Inductor asks.
4. On the CPU, the C++ backend writes consecutive nodes between two extern calls as one
   function: every output of the group is allocated before it runs, and what its nodes
   read last is freed after it returns.

`memory_timeline` applies all four to Inductor's buffer lifetimes.
"""


class KernelTimeline:
    """Bytes live while each kernel runs (`live`, one figure per node in the order they
    run), and where each buffer's allocation and free fall (`spans`: name -> (the first
    node of the function that allocates it, the last of the function after which it is
    freed, or None where the graph returns it))."""

    def __init__(self, live, spans):
        self.live, self.spans = live, spans

    def with_reuse(self, reuses):
        """`live` with the buffers Inductor's planning reused (`reuses`: (freed, reused
        as) name pairs) held from their free to the allocation that takes them
        (Note [A reused buffer is held until it is reused])."""
        live = list(self.live)
        for freed, taken in reuses:
            if freed not in self.spans or taken not in self.spans:
                continue
            (_, last, size), (first, _, _) = self.spans[freed], self.spans[taken]
            if last is None:
                continue  # a graph output is never freed, so never reused
            for i in range(last + 1, first):
                live[i] += size
        return live


# Note [A reused buffer is held until it is reused]
# With `allow_buffer_reuse`, Inductor's wrapper keeps a buffer it would free in a pool by
# its size, dtype and device, and an allocation of the same key later takes it instead of
# new memory (where its peak estimate, made this timeline by Note [Reuse that costs no
# peak], says holding it costs nothing). The allocator sees no free and no allocation: the
# buffer's bytes stay live at every kernel between. Which pairs Inductor reused is read
# from its planned lines, so the timeline needs no model of its choice.
def memory_timeline(nodes):
    """The KernelTimeline of `nodes` (in the order they run), the graph's non-freeable
    inputs (parameters, tangents) not counted."""
    from torch._inductor import memory
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    graph, scheduler = V.graph, V.graph.scheduler
    outputs = OrderedSet(graph.get_output_names())
    _, freeable = memory.prepare_planning_info(
        nodes, scheduler.name_to_buf, scheduler.name_to_fused_node,
        OrderedSet(graph.graph_inputs.keys()), outputs)
    for name, buffer in freeable.items():  # Note [An input's bytes are its own, not a read's]
        buffer.mpi_buffer.size_free = max(buffer.mpi_buffer.size_free,
                                          input_bytes(graph.graph_inputs.get(name)))
    lifetimes, _, _ = memory.compute_memory_timeline(nodes, freeable, outputs)
    made, freed = [0] * len(nodes), [0] * (len(nodes) + 1)
    for life in lifetimes:
        made[life.start_step] += life.size_alloc
        if life.end_step != -1:
            freed[life.end_step + 1] += life.size_free
    # prepare_planning_info sized every scheduler buffer (its `mpi_buffer`)
    never_made = [sum(scheduler.name_to_buf[name].mpi_buffer.size_alloc for name in names
                      if name in scheduler.name_to_buf)
                  for names in _never_allocated(nodes)]
    made_by, freed_before = _running_sums(made), _running_sums(freed)
    groups = _kernel_groups(nodes)
    live = [made_by[last] - freed_before[first] - sum(never_made[first:last + 1])
            for first, last in groups]
    spans = {life.buffer.get_name(): (groups[life.start_step][0],
                                      groups[life.end_step][1] if life.end_step != -1 else None,
                                      life.size_alloc)
             for life in lifetimes}
    return KernelTimeline(live, spans)


def _running_sums(values):
    total, sums = 0, []
    for value in values:
        total += value
        sums.append(total)
    return sums


# Note [An input's bytes are its own, not a read's]
# Inductor's timeline sizes a graph input that the graph may free by the last read of it,
# and a read can cover a part: a kernel that takes one element of a channel's four reads
# a quarter. The input is whole until it is freed (mobilenet_v3_small's backward held a
# saved 147,456-byte activation that the timeline counted as 36,864). Its bytes come
# from its layout here.
def input_bytes(value):
    """Bytes of a graph input's tensor (0 where its size is symbolic or unknown)."""
    try:
        return int(value.get_numel()) * value.get_dtype().itemsize
    except Exception:  # a symbolic or size-less input: what the read said stands
        return 0


def _never_allocated(nodes):
    """For each node, the names of its outputs the generated code never allocates: those
    its fused kernel keeps in registers, those written into a dying input, and those
    that are views of another buffer."""
    local = [_kernel_local(node) for node in nodes]
    in_place = _written_in_place(nodes, local)
    return [sorted(set(a) | set(b) | set(_views_of_others(node)))
            for node, a, b in zip(nodes, local, in_place)]


def _views_of_others(node):
    """Names of the outputs of `node` that are views into another buffer (a cat's inputs
    written straight into their slices of its output): they take no bytes of their own."""
    from torch._inductor import ir
    return [buf.get_name() for buf in node.get_outputs()
            if isinstance(getattr(buf.node, "layout", None), ir.NonOwningLayout)]


def _kernel_local(node):
    """Names of the buffers a fused kernel makes and alone reads: its code keeps them in
    registers, never allocated. Inductor removes them when it writes the kernel, after
    the post-fusion pass; its own timeline still counts them."""
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


class _InPlaceDecisions:
    """Stands for the kernel Inductor asks to record a result written into its input."""

    def __init__(self):
        self.inplace_update_buffers = {}  # output -> the input it is written into
        self.args = self

    def make_inplace(self, input_name, output_name):
        pass


def _written_in_place(nodes, local):
    """For each node, the outputs Inductor will write into an input that dies there,
    asked as it asks when it writes the kernels (the nodes before complete), the
    kernel-local buffers of `local` neither written nor written into."""
    from torch._inductor.scheduler import SchedulerNode
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    scheduler = V.graph.scheduler
    done, written = scheduler.completed_operations, []
    try:
        scheduler.completed_operations = OrderedSet(done)
        for node, kept_local in zip(nodes, local):
            decisions = _InPlaceDecisions()
            with V.set_kernel_handler(decisions):
                for inner in node.get_nodes():
                    if isinstance(inner, SchedulerNode):
                        inner.decide_inplace_update()
            written.append([out for out, into in decisions.inplace_update_buffers.items()
                            if out not in kept_local and into not in kept_local])
            scheduler.completed_operations.update(node.get_operation_names())
    finally:
        scheduler.completed_operations = done
    return written


def _kernel_groups(nodes):
    """(first, last) index of the generated function each node runs in: its own, but on
    the CPU's C++ backend, where consecutive nodes between extern calls share one."""
    starts = []
    for i, node in enumerate(nodes):
        joins = i > 0 and _cpp_kernel(nodes[i - 1]) and _cpp_kernel(node)
        starts.append(starts[-1] if joins else i)
    lasts = [0] * len(nodes)
    for i in reversed(range(len(nodes))):
        following = i + 1 < len(nodes) and starts[i + 1] == starts[i]
        lasts[i] = lasts[i + 1] if following else i
    return list(zip(starts, lasts))


def _cpp_kernel(node):
    """Whether the C++ backend writes `node` into the function it is filling (an extern
    call or a template ends the function; a node that does nothing joins it)."""
    from torch._inductor import config
    from torch._inductor.scheduler import NopKernelSchedulerNode
    if isinstance(node, NopKernelSchedulerNode):
        return True
    device = node.get_device()
    return (device is not None and device.type == "cpu" and config.cpu_backend == "cpp"
            and not node.is_extern() and not node.is_template())
