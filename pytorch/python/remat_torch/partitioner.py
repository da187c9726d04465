"""remat's planners as torch.compile's partitioner: a byte budget for a compiled step.

    import remat_torch
    step = remat_torch.compile(model, budget=48 << 20)        # Inductor, remat's partition
    loss = loss_fn(step(x), y); loss.backward()
    print(remat_torch.partition_reports()[-1])                # the plan behind each graph

    # or with torch.compile's own options (the backward then compiles lazily: a plan whose
    # kernels exceed the budget raises Replan at the first backward instead of replanning):
    part = remat_torch.RematPartitioner(budget=48 << 20, planner="best")
    torch.compile(model, options={"custom_partitioner_fn": part, "layout_optimization": False,
                                  "_post_fusion_custom_pass": part.kernel_check})

Note [A byte budget inside torch.compile]
AOTAutograd traces the forward and backward as one joint graph and a partitioner splits it:
the values the forward saves for the backward, the rest recomputed there. PyTorch's knob
(`activation_memory_budget`) is a fraction of saved bytes, which bounds neither the forward's
own peak nor what the backward's recomputations keep alive. Here the budget is bytes of the
step's peak: the graph's inputs (parameters, the batch: held by the program regardless), the
values the forward keeps, and everything the backward makes, its gradients kept to the end.
The joint graph becomes a remat graph (`joint_graph_to_remat`: bytes from the fake tensors,
views free, costs from a FLOP and byte model, random and mutating operators never
recomputed). The candidates are the plan without recomputation, chen's and twremat's, the
planner's at budgets evenly between, and PyTorch's own min-cut plans at a grid of its knob,
none depending on the budget asked; in remat's, the forward values the backward reads
without recomputing them are the saved set, PyTorch's extraction builds the two graphs from
it, and the backward is rebuilt in the plan's order (Note [The backward in the plan's
order]). Each candidate's peak is that of the kernels Inductor makes of it (Note [The
kernels' peak checked]), exact where it was compared with the allocator; the fx model
(`peak_model.py`), which counts buffers that fusion removes, stands in only where Inductor
cannot lower a candidate, scaled by the most the kernels of the graph's other plans took
over it. The largest within the budget is kept, so that more budget never means a smaller
plan. A budget none fits raises at compile time with the least peak found. The kept plan's
kernels are checked again when they compile, and `compile` compiles again where they
exceed the budget.
"""
import functools
import hashlib
import json
import math
import operator
import pathlib
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .torch_hooks import require_compile_hooks

require_compile_hooks()  # a torch without them fails here, naming what it lacks

from torch._functorch import partitioners as torch_partitioners  # noqa: E402
from torch._inductor.custom_graph_pass import CustomPartitionerFn  # noqa: E402

from . import _C  # noqa: E402
from .kernel_peak import KernelPeakCheck, _cause, probe_step_peak  # noqa: E402
from .peak_model import (_is_view, _nbytes, _step_parts, _value_of,  # noqa: E402
                         held_through_backward, modelled_peak)
from .plan_order import backward_boundary, backward_in_plan_order  # noqa: E402
from .step_shares import GraphShare, ShareTooSmall, StepShares, current_frame  # noqa: E402

VERSION = "remat-partitioner-1"

# Seconds are not the unit: only ratios between costs matter to the planners. A CPU core
# of this project's machines does about 50 FLOP and moves about 10 bytes a nanosecond.
DEFAULT_COST_MODEL = {"flops_per_ns": 50.0, "bytes_per_ns": 10.0, "op_ns": 200.0}


class Replan(RuntimeError):
    """A plan whose kernels take more than the budget (Note [The kernels' peak checked]):
    compiling again plans with their peak known. `remat_torch.compile` does so itself; a
    partitioner handed to torch.compile by hand raises it where the backward compiles."""

    def __init__(self, graph, peak, budget):
        super().__init__(
            f"remat_torch: the kernels Inductor made for graph {graph}'s plan take {peak} "
            f"bytes at their peak, above the budget of {budget}; compile again to plan with "
            "that known")


class BudgetTooSmall(RuntimeError):
    """A budget below the least peak any plan of the graph was found to need (`least`), or
    (`least` None) too small for a step Dynamo broke into graphs to be split over them."""

    def __init__(self, budget, least, graph):
        self.budget, self.least = budget, least
        if least is None:
            super().__init__(
                f"remat_torch.compile: a budget of {budget} bytes is too small for the step "
                f"Dynamo broke into graphs: no plan of graph {graph} fits beside what the "
                "other graphs hold (Note [A step's budget over its graphs]); the least "
                f"feasible budget is above {budget}")
            return
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
    kernel_peak: int = 0           # the kept plan's kernels' peak (0: Inductor did not lower it)
    graph_key: str = ""            # the joint graph's identity across compilations


_REPORTS = []

# What every partitioner of this process knows, whatever its budget: a plan made for a
# graph at a planner budget, a plan's measured kernel peak, the most a graph's kernels took
# over the model. Reused, they keep the candidates of a graph the same at every budget.
_PLANS = {}     # (graph key, planner, planner budget, time limit) -> the planner's plan
_MEASURED = {}  # plan key -> the step's peak its kernels take, the graph's inputs included
_RATIO = {}     # graph key -> the most a plan's kernels took over its model


def partition_reports():
    """The report of every graph a RematPartitioner split, oldest first."""
    return list(_REPORTS)


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


# Note [One plan per size]
# A plan's peak is a sum of tensor sizes; with symbolic sizes (`dynamic=True`) it would be
# judged at the size of the example that compiled it and could exceed the budget at a
# larger one. `compile` passes dynamic=False unless told otherwise, so that each size
# Dynamo meets compiles a plan of its own, each judged at that size (Dynamo's recompile
# limit, 8 by default, bounds how many: past it the call runs eagerly, outside any
# budget); a partitioner given a graph with symbolic sizes refuses it.
def _refuse_symbolic_sizes(gm):
    for p in gm.graph.find_nodes(op="placeholder"):
        value = p.meta.get("val")
        if isinstance(value, torch.Tensor) and any(
                not isinstance(d, int) for d in (*value.shape, value.storage_offset())):
            raise ValueError(
                f"remat_torch.RematPartitioner: graph input {p.name} has symbolic sizes "
                f"{tuple(value.shape)}: a plan judged at one size could exceed the budget "
                "at another; compile with dynamic=False (remat_torch.compile's default), "
                "which gives each size its own plan")


@dataclass
class _Candidate:
    """A plan's two graphs and what the search knows of their peak."""
    peak: int                  # the kernels' peak if measured, else the model's, scaled
    modelled: int
    fw: fx.GraphModule
    bw: fx.GraphModule
    saved: set
    planner_budget: int
    planner_peak: int
    key: str
    measured: bool
    kept: int                  # its inputs and what it saves: held while later graphs run


class RematPartitioner(CustomPartitionerFn):
    """Inductor's `custom_partitioner_fn`: splits each joint graph with one of remat's
    planners under `budget` bytes of the step's peak (Note [A byte budget inside
    torch.compile]). `held_bytes`: what the program holds beside the graph's own inputs
    (an optimizer's state), taken off the budget. Its `kernel_check` is the scheduler pass
    that checks the kernels of each plan (Note [The kernels' peak checked]). `caps`: what
    the graphs of a step broken by Dynamo keep to (Note [A step's budget over its
    graphs]), as ShareTooSmall carries them."""

    def __init__(self, budget, planner="best", held_bytes=0, time_limit=2.0,
                 cost_model=None, tries=10, caps=None):
        self.budget, self.planner, self.held_bytes = int(budget), planner, int(held_bytes)
        self.time_limit, self.cost_model, self.tries = time_limit, cost_model, tries
        self.caps = dict(caps or {})
        self.shares = StepShares(self.budget - self.held_bytes, self.caps)
        self.kernel_check = KernelPeakCheck(self)
        self._handed = {}    # plan key -> what judging its kernels needs

    def __reduce__(self):  # Inductor pickles its options into cache keys: the settings
        return (RematPartitioner, (self.budget, self.planner, self.held_bytes,
                                   self.time_limit, self.cost_model, self.tries, self.caps))

    def uuid(self):
        key = repr((VERSION, self.budget, self.planner, self.held_bytes, self.time_limit,
                    sorted((self.cost_model or {}).items()), self.tries,
                    sorted((k, sorted(v.items())) for k, v in self.caps.items())))
        digest = hashlib.sha256(key.encode())
        for source in sorted(pathlib.Path(__file__).parent.glob("*.py")):
            digest.update(source.read_bytes())
        return digest.hexdigest()

    def __call__(self, gm, joint_inputs, **kwargs):
        _refuse_layout_optimization(gm)
        _refuse_symbolic_sizes(gm)  # Note [One plan per size]
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
        theirs = lambda: _pytorch_partitions(gm, joint_inputs, num_fwd_outputs, static)
        frame = current_frame()
        kept, too_small = self._search(graph, held, extract, theirs, report, frame)
        self._hand_over(kept, report, held, too_small, self.shares.limits(frame)[0])
        _, saved, _, grads = _step_parts(kept.fw, kept.bw)
        report.saved = [p.name for p in saved]
        report.saved_bytes = kept.kept - held
        self.shares.record(frame, GraphShare(
            kept=kept.kept, inputs=held, peak=kept.peak,
            grads=sum(_nbytes(g) for g in grads)), name)
        fw_names = {n.name for n in kept.fw.graph.nodes if n.op == "call_function"}
        report.recomputed = sum(1 for n in kept.bw.graph.nodes
                                if n.op == "call_function" and n.name in fw_names)
        _REPORTS.append(report)
        return kept.fw, kept.bw

    def _extract(self, gm, info, num_fwd_outputs, saved_nodes, reorder):
        """The forward and backward graphs of a saved set, the backward rebuilt in the
        plan's order (Note [The backward in the plan's order]). A saved value the rebuilt
        backward makes again before anything reads it is not saved: passed in, nothing
        would free it until the backward returns."""
        for _ in range(2):
            sym = [n for n in saved_nodes if torch_partitioners.is_sym_node(n)]
            tensors = [n for n in saved_nodes if not torch_partitioners.is_sym_node(n)]
            fw, bw = torch_partitioners._extract_fwd_bwd_modules(
                gm, tensors, saved_sym_nodes=sym, num_fwd_outputs=num_fwd_outputs,
                static_lifetime_input_nodes=info.static_lifetime_input_nodes)
            bw = reorder(bw)
            unread = {p.name for p in bw.graph.find_nodes(op="placeholder") if not p.users}
            if not unread.intersection(n.name for n in tensors):
                break
            saved_nodes = [n for n in saved_nodes if n.name not in unread]
        return fw, bw

    def _hand_over(self, kept, report, held, too_small, limit):
        """Marks the plan's graphs so that the kernel check finds what to judge them by.
        The report has the probe's kernel peak until the check's own arrives (a graph
        Inductor serves from its cache is not checked again)."""
        report.modelled_peak, report.planner_budget = kept.modelled, kept.planner_budget
        report.kernel_peak = kept.peak + self.held_bytes if kept.measured else 0
        kept.fw.meta["remat_plan"] = kept.bw.meta["remat_plan"] = kept.key
        self._handed[kept.key] = dict(
            graph=report.graph_key, report=report, held=held, modelled=kept.modelled,
            outside=held_through_backward(kept.fw, kept.bw), too_small=too_small,
            forward=None, limit=limit)

    def kernels_measured(self, plan_key, is_backward, peak):
        """The kernel check's report of one of a plan's graphs (Note [The kernels' peak
        checked]): the forward's peak is kept until the backward's arrives; then the step's
        peak is known, remembered for the search, and judged against the budget."""
        plan = self._handed.get(plan_key)
        if plan is None:
            return
        if not is_backward:
            plan["forward"] = peak
            return
        del self._handed[plan_key]  # judged once: its graphs need not be kept
        if plan["forward"] is None:  # the forward came from a cache: its kernels unseen
            step = _MEASURED.get(plan_key, plan["modelled"])  # the probe's, if it ran
        else:
            step = plan["held"] + max(plan["forward"], plan["outside"] + peak)
        _MEASURED[plan_key] = step
        graph = plan["graph"]
        _RATIO[graph] = max(_RATIO.get(graph, 1.0), step / max(plan["modelled"], 1))
        report = plan["report"]
        report.kernel_peak = step + self.held_bytes
        if step <= plan["limit"]:  # the budget, less what earlier graphs of the step hold
            return
        if plan["too_small"]:
            raise BudgetTooSmall(self.budget, step + self.held_bytes, report.graph)
        raise Replan(report.graph, step + self.held_bytes, plan["limit"] + self.held_bytes)

    def _search(self, graph, held, extract, theirs, report, frame):
        """(The plan with the largest peak within the budget, False), from candidates that
        do not depend on the budget, so that a larger budget never gets a plan of smaller
        peak (Note [A byte budget inside torch.compile]): the plan without recomputation,
        the least-memory plans of chen and twremat, the planner's at `tries` budgets
        evenly between theirs, and PyTorch's at PYTORCH_BUDGETS. A plan's peak is its
        kernels' where Inductor lowered them, else its model's scaled by the most the
        kernels of the graph's plans took over their model.
        Where none fits: BudgetTooSmall if the least of them was measured, else (that plan,
        True), for its kernels to be measured."""
        target, most_kept = self.shares.limits(frame)
        text = json.dumps(graph)  # every plan reads the same graph
        nameless = json.dumps(dict(graph, name=""))  # the name counts the graphs split
        report.graph_key = hashlib.sha256(nameless.encode()).hexdigest()
        ratio = _RATIO.get(report.graph_key, 1.0)

        def evaluate(planner, planner_budget=None):
            memo = (report.graph_key, planner, planner_budget, self.time_limit)
            if memo not in _PLANS:  # planners with a time limit differ from run to run
                _PLANS[memo] = _C.plan_graph(text, planner, planner_budget, self.time_limit)
            plan = _PLANS[memo]
            if not plan["feasible"]:
                return None
            saved = saved_from_schedule(graph, plan["order"])
            return judge(*extract(saved, plan["order"]), saved, planner_budget,
                         plan["peak_bytes"])

        def judge(fw, bw, saved, planner_budget, planner_peak):
            modelled = modelled_peak(fw, bw, held)
            key = hashlib.sha256((report.graph_key + fw.code + bw.code).encode()).hexdigest()
            if key not in _MEASURED:
                kernels = probe_step_peak(fw, bw, held)
                if kernels is not None:
                    _MEASURED[key] = kernels
            measured = key in _MEASURED
            peak = _MEASURED[key] if measured else math.ceil(modelled * ratio)
            report.tries += 1
            kept = held + sum(_nbytes(p) for p in _step_parts(fw, bw)[1])
            return _Candidate(peak, modelled, fw, bw, saved, planner_budget or 0,
                              planner_peak, key, measured, kept)

        top = evaluate("noremat")  # no recomputation, no budget: always a plan
        if top is None:
            raise RuntimeError(f"remat_torch.compile: no plan of {report.graph} without a budget")
        if top.peak <= target and top.kept <= most_kept:
            return top, False
        found = [c for c in (evaluate("chen"), evaluate("twremat")) if c is not None]
        lo = min((c.planner_peak for c in found), default=0)
        hi = top.planner_peak
        for k in range(1, self.tries):
            found.append(evaluate(self.planner, lo + (hi - lo) * k // self.tries))
        for pytorch_plan in theirs():  # the compiler's own choices, at its knob's settings
            found.append(judge(*pytorch_plan, set(), 0, 0))
        found = [c for c in found if c is not None]
        fitting = [c for c in found if c.peak <= target and c.kept <= most_kept]
        if fitting:
            return max(fitting, key=lambda c: (c.peak, c.planner_budget)), False
        least = min(found + [top], key=lambda c: c.peak)
        if not least.measured:
            return least, True
        self._none_fits(least, frame, report.graph)

    def _none_fits(self, least, frame, graph):
        """Raises ShareTooSmall where the graphs before this one can make room for its
        least plan, else BudgetTooSmall (its least, or None in a step split over graphs)."""
        self.shares.too_small(frame, least.peak, graph)
        alone = self.shares.position(frame) == 0 and not self.caps
        raise BudgetTooSmall(self.budget, least.peak + self.held_bytes if alone else None,
                             graph)


# PyTorch's min-cut plans at these `activation_memory_budget` settings are candidates: at
# the peak one of them reaches, remat has that plan to choose.
PYTORCH_BUDGETS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)


def _pytorch_partitions(gm, joint_inputs, num_fwd_outputs, static):
    """[(fw, bw)] as PyTorch's own partitioner splits the graph at each of PYTORCH_BUDGETS,
    the same plan once, none where it declines the graph."""
    import copy
    plans, seen = [], set()
    for fraction in PYTORCH_BUDGETS:
        copied = fx.GraphModule(gm, copy.deepcopy(gm.graph))
        try:
            with torch._functorch.config.patch(activation_memory_budget=fraction):
                fw, bw = torch_partitioners.min_cut_rematerialization_partition(
                    copied, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                    static_lifetime_input_indices=static)
        except Exception:  # noqa: BLE001 (PyTorch's partitioner declining a graph)
            return plans
        if (fw.code, bw.code) not in seen and not _draws_again(bw):
            seen.add((fw.code, bw.code))
            plans.append((fw, bw))
    return plans


def _draws_again(bw):
    """Whether a backward graph calls a random operator: PyTorch's partitioner recomputes
    one below some settings of its knob unless its state is functionalized, and the
    recomputation draws other numbers than the forward did."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and torch.Tag.nondeterministic_seeded in n.target.tags
               for n in bw.graph.nodes)


def _replanning(call, attempts, rebuild=None):
    """`call` compiling its backward with its forward, so that a plan is judged before
    anything runs, every graph through the partitioner (AOTAutograd's cache would hand
    back a graph's two halves unseen, and the graphs after it would not know what it
    holds: Note [A step's budget over its graphs]), and compiling again while a plan's
    kernels take more than the budget (Replan), or, with `rebuild(caps)` making the
    compiled call anew, while a graph of the step does not fit beside the ones before it
    (ShareTooSmall)."""
    current = [call]

    @functools.wraps(call)
    def run(*args, **kwargs):
        for attempt in range(1, attempts + 1):
            try:
                with torch._functorch.config.patch(force_non_lazy_backward_lowering=True,
                                                   enable_autograd_cache=False):
                    return current[0](*args, **kwargs)
            except Exception as error:  # noqa: PERF203 (a retry loop)
                share = _cause(error, ShareTooSmall)
                if attempt == attempts or (_cause(error, Replan) is None
                                           and (share is None or rebuild is None)):
                    raise
                if share is not None:  # the graphs compiled already must be made again
                    current[0] = rebuild(share.caps)
    return run


def compile(model, budget, planner="best", held_bytes=0, time_limit=2.0, cost_model=None,
            attempts=8, **torch_compile_kwargs):
    """torch.compile(model) with Inductor, each graph partitioned by RematPartitioner under
    `budget` bytes of the step's peak, its kernels checked, and compiled again (up to
    `attempts` times) where they take more (Note [The kernels' peak checked]) or where the
    graphs of a step broken by Dynamo must split it otherwise (Note [A step's budget over
    its graphs])."""
    options = dict(torch_compile_kwargs.pop("options", None) or {})
    torch_compile_kwargs.setdefault("dynamic", False)  # Note [One plan per size]
    options.setdefault("layout_optimization", False)  # Note [Layout optimization copies the weights]
    if options.get("_post_fusion_custom_pass") is not None:
        raise ValueError("remat_torch.compile: its kernel check is the post-fusion pass")

    def build(caps):
        partitioner = RematPartitioner(budget, planner, held_bytes, time_limit, cost_model,
                                       caps=caps)
        return torch.compile(model, **torch_compile_kwargs, options=dict(
            options, custom_partitioner_fn=partitioner,
            _post_fusion_custom_pass=partitioner.kernel_check))

    def entry(compiled):  # what calling the compiled model runs
        return compiled.forward if isinstance(compiled, torch.nn.Module) else compiled

    compiled = build(None)
    run = _replanning(entry(compiled), attempts, lambda caps: entry(build(caps)))
    if isinstance(compiled, torch.nn.Module):
        compiled.forward = run
        return compiled
    return run
