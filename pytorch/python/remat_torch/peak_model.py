"""The peak of a forward and backward graph as Inductor runs them, from their fx nodes.

Each value lives from its node to its last reader; views live in their base's buffer; a
pointwise node whose readers are all pointwise is fused away; a pointwise kernel may write
into a dying input of its size; a multi-output operator's outputs are buffers of their own
(Note [Multi-output operators in the peak model]); an extern kernel's workspace is measured
(Note [Kernel workspace in the peak model]). `kernel_peak.py` checks the result against the
kernels Inductor makes.
"""
import operator

import torch
import torch.fx as fx
from torch._functorch import partitioners as torch_partitioners


def _nbytes(node):
    try:
        return int(torch_partitioners._size_of(node))
    except Exception:  # values without a size (None, opaque objects)
        return 0


def _is_view(node):
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return (len(schema.returns) == 1 and schema.returns[0].alias_info is not None
            and not schema.returns[0].alias_info.is_write)


def _value_of(arg):
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def _pointwise(node):
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in node.target.tags)


def _fused_away(gm, keep):
    """The nodes Inductor leaves unmaterialized: a pointwise node whose every user is
    pointwise is computed inside its users' kernel (Note [Fusion in the peak model])."""
    output = gm.graph.find_nodes(op="output")[0]
    fused = set()
    for n in reversed(gm.graph.nodes):
        if (_pointwise(n) and n not in keep and n.users and output not in n.users
                and all(_pointwise(u) for u in n.users)):
            fused.add(n)
    return fused


# Note [Kernel workspace in the peak model]
# An extern kernel (a matmul, attention, a convolution) takes memory beyond its outputs
# while it runs, which no fake tensor shows: the CPU's fused attention keeps per-thread
# buffers, its backward pass more. The model measures it: each such operator runs once per
# signature on made-up CPU tensors of the graph's shapes, under a meter, and the peak above
# its outputs is its workspace, counted at its step. The random-number generator is put
# back after, so that compiling draws nothing the program would see.
_WORKSPACE = {}


def _made_up(value, generator):
    if not isinstance(value, torch.Tensor):
        return value
    t = torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype)
    if t.is_floating_point():
        t.uniform_(-1.0, 1.0, generator=generator)
    else:
        t.zero_()
    return t.to(value.device)  # the kernel of the value's device, and its workspace


def _measurable(value):
    if isinstance(value, (list, tuple)):
        return all(_measurable(v) for v in value)
    if not isinstance(value, torch.Tensor):
        return not isinstance(value, torch.SymInt)
    return (value.device.type == "cpu" and value.layout == torch.strided and all(
        isinstance(d, int) for d in (*value.shape, *value.stride())))


def _signature(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    return repr(value)


def _workspace(node):
    target = node.target
    if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload)
            or _pointwise(node) or _is_view(node) or target._schema.is_mutable):
        return 0
    args = fx.node.map_arg(node.args, _value_of)
    kwargs = fx.node.map_arg(node.kwargs, _value_of)
    if not (_measurable(args) and _measurable(list(kwargs.values()))):
        return 0
    key = (str(target), _signature(args), _signature(tuple(sorted(kwargs.items()))))
    if key not in _WORKSPACE:
        _WORKSPACE[key] = _measure_workspace(target, args, kwargs)
    return _WORKSPACE[key]


def _measure_workspace(target, args, kwargs):
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from . import cpu_memory
    with unset_fake_temporarily(), torch.random.fork_rng(devices=[]), torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        real = lambda v: _made_up(v, generator)
        args = torch.utils._pytree.tree_map(real, args)
        kwargs = torch.utils._pytree.tree_map(real, kwargs)
        cuda = any(isinstance(t, torch.Tensor) and t.is_cuda
                   for t in torch.utils._pytree.tree_leaves((args, kwargs)))
        try:
            with (_CudaMeter() if cuda else cpu_memory()) as meter:
                out = target(*args, **kwargs)
                made = sum(t.untyped_storage().nbytes()
                           for t in torch.utils._pytree.tree_leaves(out)
                           if isinstance(t, torch.Tensor))
                del out
        except Exception:  # an operator that will not run on made-up values
            return 0
    return max(0, meter.peak_bytes - made)


class _CudaMeter:
    """The CUDA caching allocator's peak bytes above what was allocated on entry."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._live = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.peak_bytes = torch.cuda.max_memory_allocated() - self._live
        return False


def _buffers(gm):
    """Which buffer each node's value lives in: a view in its base's, a getitem of a view
    operator (split) in the operator's input's, a getitem of any other multi-output
    operator in a buffer of its own, made when the operator runs (Note [Multi-output
    operators in the peak model])."""
    base, made_by = {}, {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or not n.all_input_nodes:
            continue
        first = n.all_input_nodes[0]
        if _is_view(n):
            base[n] = base.get(first, first)
        elif n.target is operator.getitem:
            if first in base or _is_view(first):
                base[n] = base.get(first, first)
            else:
                made_by[n] = first
    return base, made_by


# Note [Multi-output operators in the peak model]
# A convolution's backward returns the input's gradient and the weight's in one call, but in
# two buffers: the input's gradient dies when the layer below has read it, the weight's is an
# output of the step. Counted as one value, which lives as long as its longest-lived part,
# every layer's input gradient lived to the end of the backward (60 MB too many on resnet18
# at batch 32). Each getitem of such an operator is a buffer of its own, made when the
# operator runs and freed after its own last reader; the outputs no getitem reads are made
# too, and freed as the call returns.
def _live_peak(gm, preloaded, keep):
    """Peak bytes of running `gm`'s nodes in order: each buffer from its node to its last
    use (a view keeps its base; a fused node's inputs are read where its users run),
    `preloaded` placeholders counted from the start, values in `keep` to the end."""
    order = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(order)}
    fused = _fused_away(gm, keep)
    base, made_by = _buffers(gm)
    outputs_of = {}
    for g, op in made_by.items():
        outputs_of.setdefault(op, []).append(g)
    read_at = {}
    for n in reversed(order):  # where a node's value is really read: its kernel's position
        read_at[n] = (max((read_at[u] for u in n.users), default=index[n]) if n in fused
                      else index[n])
    last = {g: index[op] for g, op in made_by.items()}  # an unread output dies at once
    for n in order:
        for a in n.all_input_nodes:
            if a in outputs_of:
                continue  # the getitems read the operator; its outputs are theirs
            root = base.get(a, a)
            last[root] = max(last.get(root, 0), read_at[n])
    live = sum(_nbytes(p) for p in preloaded)
    peak, frees, reused = live, {}, set()
    for n, i in last.items():
        frees.setdefault(i, []).append(n)
    for i, n in enumerate(order):
        if n in outputs_of:  # every output is made; those nothing reads die at once
            peak = max(peak, live + _nbytes(n) + _workspace(n))
            live += sum(_nbytes(g) for g in outputs_of[n])
        elif (n.op == "call_function" and n not in base and n not in fused
              and n not in made_by):
            donor = _donor(n, i, last, base, fused, keep) if _pointwise(n) else None
            if donor is None:
                live += _nbytes(n)
            else:  # written into the buffer of an input that dies here
                reused.add(donor)
            peak = max(peak, live + _workspace(n))
        peak = max(peak, live)
        for dead in frees.get(i, []):
            if dead in fused or dead in base or dead in reused or dead in outputs_of:
                continue
            if dead not in keep and (dead.op != "placeholder" or dead in preloaded):
                live -= _nbytes(dead)
    return peak


def _donor(node, i, last, base, fused, keep):
    """An input of pointwise `node` whose buffer Inductor writes the result into: one of
    the same size whose last read is this kernel, made by the graph, not kept."""
    for a in node.all_input_nodes:
        if (a.op == "call_function" and a not in base and a not in fused and a not in keep
                and last.get(a) == i and _nbytes(a) == _nbytes(node)):
            return a
    return None


def _step_parts(fw, bw):
    """(the forward's outputs, what the backward's saved inputs are, its tangents, its
    gradients): the values that outlive one of the two graphs."""
    inputs = {p.name for p in fw.graph.find_nodes(op="placeholder")}
    kept = {a for a in fw.graph.find_nodes(op="output")[0].args[0] if isinstance(a, fx.Node)}
    placeholders = bw.graph.find_nodes(op="placeholder")
    tangents = [p for p in placeholders if str(p.target).startswith("tangents")]
    saved = [p for p in placeholders if p not in tangents and p.name not in inputs]
    grads = {a for a in bw.graph.find_nodes(op="output")[0].args[0] if isinstance(a, fx.Node)}
    return kept, saved, tangents, grads


def held_through_backward(fw, bw):
    """Bytes the program holds while the backward runs beside what the backward graph
    counts itself: the forward's outputs it does not read (the loss) and the outputs'
    gradients, which autograd makes and passes in."""
    kept, saved, tangents, _ = _step_parts(fw, bw)
    saved_names = {p.name for p in saved}
    return (sum(_nbytes(a) for a in kept if a.op != "placeholder" and a.name not in saved_names)
            + sum(_nbytes(t) for t in tangents))


def modelled_peak(fw, bw, held):
    """The step's peak as the two graphs run: the forward, then the backward with what the
    forward saved. Inputs count as held (saved or not); the forward's other outputs stay
    until the backward ends."""
    kept, saved, tangents, grads = _step_parts(fw, bw)
    fw_peak = _live_peak(fw, [], kept)
    bw_peak = _live_peak(bw, saved, grads)
    return held + max(fw_peak, held_through_backward(fw, bw) + bw_peak)
