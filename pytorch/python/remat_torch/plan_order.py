"""The backward graph as the plan runs it (Note [The backward in the plan's order]).

Note [The backward in the plan's order]
A planner's schedule is an order of the joint graph's nodes in which a value may be made
more than once: the forward makes it, frees it, and the backward makes it again just before
the gradients that read it, perhaps twice if two distant gradients do. PyTorch's extraction
(`_extract_fwd_bwd_modules`) keeps the saved set but not the order: it recomputes each value
once, where the joint graph had it, and its reordering for the autograd engine moves the
recomputations next to their first use, so that a recomputed value lives from its first
reader to its last, across the whole backward. On resnet18 the plans that halve the
planner's peak measured above the plan with no recomputation at all once extracted that way.
So the backward is rebuilt in the plan's order: every node the plan lists after the forward,
in that order, a value listed twice made twice (a copy of its node over the newest instances
of its inputs, which the later readers read); views and multi-output operators, which the
planner sees through, made again when what they read has been made again; whatever the plan
does not list, made where it is first needed.
"""
import operator

import torch.fx as fx


def backward_boundary(graph, order):
    """The position in `order` of the first backward computation: before it, the forward."""
    nodes = graph["nodes"]
    return next((i for i, v in enumerate(order)
                 if nodes[v]["phase"] == "backward" and nodes[v]["kind"] != "tangent"),
                len(order))


def _derived(node):
    """A node the planner sees through: a view (its base's id) or a multi-output operator
    (its getitems' group)."""
    from .peak_model import _is_view
    return node.op == "call_function" and (
        _is_view(node) or isinstance(node.meta.get("val"), (tuple, list)))


class _Rebuild:
    def __init__(self, bw, joint):
        self.graph = fx.Graph()
        self.newest = {}      # node of bw -> its newest instance in self.graph
        self.made_from = {}   # derived node -> the input instances its newest was made over
        self.claimed = set()  # plan nodes made on demand before the plan listed them
        self.served = {}      # multi-output instance -> (its getitems, the last one's step)
        self.in_bw = {n.name: n for n in bw.graph.nodes}
        self.in_joint = {n.name: n for n in joint.graph.nodes}
        for p in bw.graph.find_nodes(op="placeholder"):
            self.newest[p] = self.graph.node_copy(p)

    def resolve(self, node):
        """The backward's node for a node of either graph (the extraction keeps names)."""
        return self.in_bw.get(node.name, node)

    def template(self, node):
        """What making `node` copies: a saved value's forward node, else the node."""
        if node.op == "placeholder":
            return self.in_joint.get(node.name, node)
        return node

    def makeable(self, node, seen=None):
        """Whether `node` can be made again in the backward: a saved value whose forward
        node, and every input it needs that the backward lacks, is recomputable."""
        from .partitioner import _never_recomputed
        source = self.template(node)
        if source.op != "call_function" or _never_recomputed(source):
            return False
        seen = set() if seen is None else seen
        for a in source.all_input_nodes:
            a = self.resolve(a)
            if a not in self.newest and a.name not in self.in_bw and a not in seen:
                seen.add(a)
                if not self.makeable(a, seen):
                    return False
        return True

    def _inputs_now(self, node):
        return tuple(self.instance(self.resolve(a))
                     for a in self.template(node).all_input_nodes)

    def make(self, node):
        inputs = self._inputs_now(node)
        made = self.graph.node_copy(self.template(node),
                                    lambda a: self.newest[self.resolve(a)])
        self.newest[node] = made
        if _derived(node):
            self.made_from[node] = inputs
        return made

    def instance(self, node):
        """The newest instance of `node`, made (again) if there is none or if it is a
        view or multi-output operator over inputs made again since."""
        made = self.newest.get(node)
        if made is not None and (not _derived(node)
                                 or self.made_from.get(node) == self._inputs_now(node)):
            return made
        if made is None and not _derived(node):
            self.claimed.add(node)  # the plan lists it later: that entry takes this one
        return self.make(node)

    def planned(self, node, step):
        """The plan's entry at `step`: `node` made now, its first instance if it was made
        on demand; a saved value made again if the backward can; a getitem from a new call
        of its operator unless the plan's previous entry was a getitem of that call (the
        plan lists a call's outputs together, and lists an output again to make it again
        later)."""
        if node.op == "placeholder":
            if self.makeable(node):
                self.make(node)
            return
        if node in self.claimed:
            self.claimed.discard(node)
            return
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            op = self.resolve(node.args[0])
            instance = self.instance(op)
            members, last = self.served.get(instance, (set(), None))
            if node in members or (last is not None and last != step - 1):
                instance = self.make(op)  # the group made again: a new operator call
                members = set()
            members.add(node)
            self.served[instance] = (members, step)
        self.make(node)


def backward_in_plan_order(bw, joint, graph, fx_of, order):
    """`bw` (extracted from `joint`) with its nodes in the order the plan's backward lists
    them, each recomputation a node of its own."""
    rebuild = _Rebuild(bw, joint)
    boundary = backward_boundary(graph, order)
    for step in range(boundary, len(order)):
        source = fx_of[order[step]]
        node = rebuild.in_bw.get(source.name) if source is not None else None
        if node is not None and node.op in ("call_function", "placeholder") and not (
                _derived(node) or str(node.target).startswith("tangents")):
            rebuild.planned(node, step)
    for node in bw.graph.nodes:
        if node.op == "output":
            rebuild.graph.node_copy(node, rebuild.instance)
        elif node.op != "placeholder" and node not in rebuild.newest:
            rebuild.instance(node)
    # A call whose outputs nothing reads goes, a random one too: fx keeps those (they may
    # draw), Inductor then runs them and holds their outputs to the end of the graph.
    rebuild.graph.eliminate_dead_code(
        is_impure_node=lambda n: n.is_impure(impure_random=False))
    module = fx.GraphModule(bw, rebuild.graph)
    module.meta.update(getattr(bw, "meta", {}))
    return module
