"""remat's planners as torch.compile's partitioner: a byte budget for a compiled step.

    import remat_torch
    step = remat_torch.compile(model, budget=48 << 20)        # Inductor, remat's partition
    loss = loss_fn(step(x), y); loss.backward()
    print(remat_torch.partition_reports()[-1])                # the plan behind each graph

    # or with torch.compile's own options:
    part = remat_torch.RematPartitioner(budget=48 << 20, planner="best")
    torch.compile(model, options={"custom_partitioner_fn": part})

Note [A byte budget inside torch.compile]
AOTAutograd traces the forward and backward as one joint graph and a partitioner splits it:
the values the forward saves for the backward, the rest recomputed there. PyTorch's knob
(`activation_memory_budget`) is a fraction of saved bytes, which bounds neither the forward's
own peak nor what the backward's recomputations keep alive. Here the budget is bytes of the
step's peak: the graph's inputs (parameters, the batch: held by the program regardless), the
values the forward keeps, and everything the backward makes, its gradients kept to the end.
The joint graph becomes a remat graph (`joint_graph_to_remat`: bytes from the fake tensors,
views free, costs from a FLOP and byte model, random and mutating operators never
recomputed); one of remat's planners schedules it under the budget less the inputs; the
schedule's forward values that the backward reads without recomputing them are the saved
set; PyTorch's own extraction builds the two graphs from it. Then the truth is checked: the
peak of the two graphs as they will run (`modelled_peak`: each value alive from its node to
its last use, saved values until the backward's last use, gradients to the end) must be
within the budget; where the planner's schedule and the extracted graphs differ (the
extraction recomputes each value once, in its own order; Inductor fuses), the planner's
budget is bisected for the largest plan that fits. A budget no plan fits raises at compile
time with the least peak found.
"""
import hashlib
import json
import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._functorch import partitioners as torch_partitioners
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from . import _C
from .plan_order import backward_boundary, backward_in_plan_order

VERSION = "remat-partitioner-1"

# Seconds are not the unit: only ratios between costs matter to the planners. A CPU core
# of this project's machines does about 50 FLOP and moves about 10 bytes a nanosecond.
DEFAULT_COST_MODEL = {"flops_per_ns": 50.0, "bytes_per_ns": 10.0, "op_ns": 200.0}


class BudgetTooSmall(RuntimeError):
    """A budget below the least peak any plan of the graph was found to need."""

    def __init__(self, budget, least, graph):
        self.budget, self.least = budget, least
        super().__init__(
            f"remat_torch.compile: a budget of {budget} bytes is below the least peak of "
            f"{least} bytes that any plan found for graph {graph} needs (its inputs, the "
            f"values it must keep and its gradients); the least feasible budget is {least}")


@dataclass
class PartitionReport:
    graph: str
    budget: int
    planner: str
    held_bytes: int = 0            # the graph's inputs: parameters and the batch
    modelled_peak: int = 0         # the extracted graphs' peak, held bytes included
    saved_bytes: int = 0
    saved: list = field(default_factory=list)
    recomputed: int = 0            # forward nodes the backward graph computes again
    planner_budget: int = 0        # what the planner was given for the last plan kept
    tries: int = 0                 # plans made and measured


_REPORTS = []


def partition_reports():
    """The report of every graph a RematPartitioner split, oldest first."""
    return list(_REPORTS)


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


def _flops(node):
    packet = getattr(node.target, "_overloadpacket", None)
    formula = torch.utils.flop_counter.flop_registry.get(packet)
    if formula is None:
        return 0.0
    try:
        args = fx.node.map_arg(node.args, _value_of)
        kwargs = fx.node.map_arg(node.kwargs, _value_of)
        return float(formula(*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:
        return 0.0


def _cost(node, model):
    moved = _nbytes(node) + sum(_nbytes(a) for a in node.all_input_nodes)
    return (model["op_ns"] + _flops(node) / model["flops_per_ns"]
            + moved / model["bytes_per_ns"])


def _never_recomputed(node):
    from torch.utils.checkpoint import CheckpointPolicy
    return (torch_partitioners.is_rng_op(node) or torch_partitioners._must_be_in_forward(node)
            or node.meta.get("recompute") in (CheckpointPolicy.MUST_SAVE,)
            or not torch_partitioners.is_not_collective(node))


def joint_graph_to_remat(joint, node_info, num_fwd_outputs, name, cost_model=None):
    """The joint graph as a remat-graph-v1 dict, and the fx node of each remat node id.

    Inputs (primals) weigh nothing: the program holds them regardless (their bytes are the
    report's held_bytes). Views are their base: readers of a view read its base, which stays
    alive as long as they do. A multi-output operator is a group of its getitem nodes. A sink
    reads every gradient, which the step keeps to its end."""
    model = dict(DEFAULT_COST_MODEL, **(cost_model or {}))
    nodes, fx_of, id_of, groups, held = [], [], {}, {}, 0

    def add(fx_node, kind, phase, nbytes, cost, inputs, group=None, recomputable=True):
        entry = {"id": len(nodes), "name": fx_node.name if fx_node else "sink",
                 "op": str(fx_node.target) if fx_node else "sink", "kind": kind,
                 "phase": phase, "bytes": int(nbytes), "cost": float(cost),
                 "inputs": sorted(set(inputs))}
        if group is not None:
            entry["group"] = group
        if not recomputable:
            entry["recomputable"] = False
        nodes.append(entry)
        fx_of.append(fx_node)
        return entry["id"]

    def inputs_of(n):
        return [id_of[a] for a in n.all_input_nodes if a in id_of]

    # Nodes neither side claims (what the backward reads, computed from forward values
    # alone) are forward nodes: saved, the forward computes them; else the backward does.
    for n in joint.graph.nodes:
        phase = "backward" if node_info.is_required_bw(n) else "forward"
        if n.op == "placeholder":
            if "tangents" in str(n.target):
                id_of[n] = add(n, "tangent", "backward", _nbytes(n), 0.0, [])
            else:
                held += _nbytes(n)
                id_of[n] = add(n, "input", "forward", 0, 0.0, [])
        elif n.op == "call_function":
            if _is_view(n) and n.all_input_nodes and n.all_input_nodes[0] in id_of:
                id_of[n] = id_of[n.all_input_nodes[0]]
                continue
            if n.target is operator.getitem and isinstance(n.args[0], fx.Node):
                op = n.args[0]
                group = groups.setdefault(op, len(groups))
                members = max(1, sum(1 for u in op.users if u.target is operator.getitem))
                id_of[n] = add(n, "compute", phase, _nbytes(n), _cost(op, model) / members,
                               inputs_of(op), group=group,
                               recomputable=not _never_recomputed(op))
                continue
            if isinstance(n.meta.get("val"), (tuple, list)):
                continue  # a multi-output operator: its getitems stand for it
            id_of[n] = add(n, "compute", phase, _nbytes(n), _cost(n, model), inputs_of(n),
                           recomputable=not _never_recomputed(n))
        elif n.op == "output":
            _, bwd_outputs, _, _ = torch_partitioners._extract_fwd_bwd_outputs(
                joint, num_fwd_outputs=num_fwd_outputs)
            grads = [id_of[o] for o in bwd_outputs if o is not None and o in id_of]
            add(None, "compute", "backward", 0, 0.0, grads)
    graph = {"format": "remat-graph-v1", "name": name, "source": "torch.compile joint graph",
             "nodes": nodes, "outputs": [len(nodes) - 1]}
    return graph, fx_of, held


def saved_from_schedule(graph, order):
    """The forward nodes whose instance made before the backward region is read in it."""
    nodes = graph["nodes"]
    boundary = backward_boundary(graph, order)
    newest, saved = {}, set()
    for step, v in enumerate(order):
        if step >= boundary:
            for u in nodes[v]["inputs"]:
                made = newest.get(u)
                if made is not None and made < boundary and nodes[u]["phase"] == "forward":
                    saved.add(u)
        newest[v] = step
    return saved


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
    return t


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
        try:
            with cpu_memory() as meter:
                out = target(*args, **kwargs)
                made = sum(t.untyped_storage().nbytes()
                           for t in torch.utils._pytree.tree_leaves(out)
                           if isinstance(t, torch.Tensor))
                del out
        except Exception:  # an operator that will not run on made-up values
            return 0
    return max(0, meter.peak_bytes - made)


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


def modelled_peak(fw, bw, held):
    """The step's peak as the two graphs run: the forward, then the backward with what the
    forward saved. Inputs count as held (saved or not); the forward's other outputs stay
    until the backward ends."""
    inputs = {p.name for p in fw.graph.find_nodes(op="placeholder")}
    kept = {a for a in fw.graph.find_nodes(op="output")[0].args[0] if isinstance(a, fx.Node)}
    fw_peak = _live_peak(fw, [], kept)
    saved = [p for p in bw.graph.find_nodes(op="placeholder")
             if not str(p.target).startswith("tangents") and p.name not in inputs]
    saved_names = {p.name for p in saved}
    # The outputs' gradients, which autograd makes and holds while the backward runs.
    tangents = [p for p in bw.graph.find_nodes(op="placeholder")
                if str(p.target).startswith("tangents")]
    bw_out = bw.graph.find_nodes(op="output")[0]
    grads = {a for a in bw_out.args[0] if isinstance(a, fx.Node)}
    bw_peak = _live_peak(bw, saved + tangents, grads | set(tangents))
    model_outputs = sum(_nbytes(a) for a in kept
                        if a.op != "placeholder" and a.name not in saved_names)
    return held + max(fw_peak, model_outputs + bw_peak)


# Note [Layout optimization copies the weights]
# With `layout_optimization` (on by default), Inductor converts a convolution's operands to
# channels-last inside the compiled forward: each weight becomes a copy, and the copies are
# what the forward saves for the backward. On resnet18 (batch 4 at 32x32) that is 44 MB the
# joint graph does not show, 30% above the peak model, and on this project's CPUs the
# converted step was also slower (0.054 s against 0.028 s; 0.166 s against 0.122 s at batch
# 16, 64x64). `compile` turns it off; a partitioner handed to torch.compile by hand refuses
# graphs with convolutions while it is on, rather than accept a budget it cannot keep.
def _refuse_layout_optimization(gm):
    from torch._inductor import config as inductor_config
    if not inductor_config.layout_optimization:
        return
    convolutions = [n.name for n in gm.graph.nodes if n.op == "call_function"
                    and "convolution" in str(n.target)]
    if convolutions:
        raise ValueError(
            "remat_torch.RematPartitioner: Inductor's layout_optimization is on and the graph "
            f"has convolutions ({convolutions[0]}, ...): it would copy their weights into the "
            "compiled forward, outside the budget; compile with "
            "options={'layout_optimization': False} (remat_torch.compile does)")


class RematPartitioner(CustomPartitionerFn):
    """Inductor's `custom_partitioner_fn`: splits each joint graph with one of remat's
    planners under `budget` bytes of the step's peak (Note [A byte budget inside
    torch.compile]). `held_bytes`: what the program holds beside the graph's own inputs
    (an optimizer's state), taken off the budget."""

    def __init__(self, budget, planner="best", held_bytes=0, time_limit=2.0,
                 cost_model=None, tries=12):
        self.budget, self.planner, self.held_bytes = int(budget), planner, int(held_bytes)
        self.time_limit, self.cost_model, self.tries = time_limit, cost_model, tries

    def uuid(self):
        key = repr((VERSION, self.budget, self.planner, self.held_bytes, self.time_limit,
                    sorted((self.cost_model or {}).items()), self.tries))
        with open(__file__, "rb") as source:
            return hashlib.sha256(key.encode() + source.read()).hexdigest()

    def __call__(self, gm, joint_inputs, **kwargs):
        _refuse_layout_optimization(gm)
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        static = kwargs.get("static_lifetime_input_indices") or []
        gm.graph.eliminate_dead_code()
        gm.recompile()
        if torch_partitioners.has_recomputable_ops(gm):
            gm = torch_partitioners.cleanup_recompute_tags(gm, is_default_partition=False)
        torch_partitioners.force_save_collectives(gm)
        torch_partitioners.force_save_effectful_ops(gm)
        torch_partitioners.force_save_bw_mutation_src(gm)
        info = torch_partitioners.classify_nodes(gm, static, num_fwd_outputs)
        if not info.required_bw_nodes:
            return torch_partitioners.default_partition(
                gm, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                static_lifetime_input_indices=static)
        name = f"graph{len(_REPORTS)}"
        graph, fx_of, held = joint_graph_to_remat(gm, info, num_fwd_outputs, name,
                                                  self.cost_model)
        report = PartitionReport(graph=name, budget=self.budget, planner=self.planner,
                                 held_bytes=held)
        extract = lambda saved, order: self._extract(
            gm, info, num_fwd_outputs, [fx_of[v] for v in sorted(saved)],
            lambda bw: backward_in_plan_order(bw, gm, graph, fx_of, order))
        best = self._search(graph, held, extract, report)
        fw, bw, saved = best
        report.saved = [fx_of[v].name for v in sorted(saved)]
        report.saved_bytes = sum(graph["nodes"][v]["bytes"] for v in saved)
        fw_names = {n.name for n in fw.graph.nodes if n.op == "call_function"}
        report.recomputed = sum(1 for n in bw.graph.nodes
                                if n.op == "call_function" and n.name in fw_names)
        _REPORTS.append(report)
        return fw, bw

    def _extract(self, gm, info, num_fwd_outputs, saved_nodes, reorder):
        sym = [n for n in saved_nodes if torch_partitioners.is_sym_node(n)]
        tensors = [n for n in saved_nodes if not torch_partitioners.is_sym_node(n)]
        fw, bw = torch_partitioners._extract_fwd_bwd_modules(
            gm, tensors, saved_sym_nodes=sym, num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=info.static_lifetime_input_nodes)
        # The extraction recomputes each value once, where the joint graph had it: the
        # backward is rebuilt in the plan's order (Note [The backward in the plan's order]).
        return fw, reorder(bw)

    def _search(self, graph, held, extract, report):
        """The plan with the largest planner budget whose extracted graphs fit the budget
        (Note [A byte budget inside torch.compile]): bisection between the least the
        planner can meet and the graph's peak without recomputation. Else BudgetTooSmall,
        with the least extracted peak of the plans tried and of the least-memory plans."""
        target = self.budget - self.held_bytes
        text = json.dumps(graph)  # every plan reads the same graph
        least = math.inf

        def evaluate(planner_budget, planner=None):
            nonlocal least
            plan = _C.plan_graph(text, planner or self.planner, planner_budget,
                                 self.time_limit)
            if not plan["feasible"]:
                return None
            saved = saved_from_schedule(graph, plan["order"])
            fw, bw = extract(saved, plan["order"])
            peak = modelled_peak(fw, bw, held)
            least = min(least, peak)
            report.tries += 1
            return peak, fw, bw, saved, planner_budget, plan["peak_bytes"]

        def keep(found):
            report.modelled_peak, report.planner_budget = found[0], found[4]
            return found[1:4]

        top = evaluate(None, "noremat")  # no recomputation, no budget: always a plan
        if top is None:
            raise RuntimeError(f"remat_torch.compile: no plan of {report.graph} without a budget")
        if top[0] <= target:
            return keep(top)
        lo, hi, best = 0, top[5], None  # hi: the graph's own peak without recomputation
        while report.tries < self.tries and hi - lo > max(hi // 200, 1):
            middle = (lo + hi) // 2
            found = evaluate(middle)
            if found is None or found[0] <= target:
                lo = middle  # the planner cannot meet it, or it fits: more is worth a try
                if found is not None:
                    best = found
            else:
                hi = middle
        if best is not None:
            return keep(best)
        for planner in ("chen", "twremat"):  # the least memory they know how to reach
            found = evaluate(None, planner)
            if found is not None and found[0] <= target:
                return keep(found)
        least = int(least) + self.held_bytes if least != math.inf else None
        raise BudgetTooSmall(self.budget, least, report.graph)


def compile(model, budget, planner="best", held_bytes=0, time_limit=2.0, cost_model=None,
            **torch_compile_kwargs):
    """torch.compile(model) with Inductor, each graph partitioned by RematPartitioner under
    `budget` bytes of the step's peak."""
    options = dict(torch_compile_kwargs.pop("options", None) or {})
    options.setdefault("layout_optimization", False)  # Note [Layout optimization copies the weights]
    options["custom_partitioner_fn"] = RematPartitioner(budget, planner, held_bytes,
                                                        time_limit, cost_model)
    return torch.compile(model, options=options, **torch_compile_kwargs)
