"""A step's budget over the graphs Dynamo splits it into (Note [A step's budget over its graphs]).

Note [A step's budget over its graphs]
Where Dynamo breaks a program into graphs, a training step runs their forwards in order
and their backwards in the opposite order, and each graph is partitioned on its own, the
first before the later ones are seen. While a graph runs, every graph before it holds
its inputs (parameters, the batch, what flowed in) and the values it saved; while a
graph's backward runs, the gradients of every graph after it are alive too. So the
budget is split in the order the graphs come:
  - a graph's plan must fit the budget less what the graphs before it hold (its share);
  - once a graph's plan is chosen, every earlier graph's step peak plus the gradients of
    the graphs after that one must still fit.
Where either fails, `ShareTooSmall` carries caps for the earlier graphs: on what one may
hold for the later ones (the latest first, down to its inputs), or on its own peak, and
`remat_torch.compile` compiles the step again with them. A graph that cannot fit even
with every earlier one down to its inputs fails with BudgetTooSmall. Graphs are told
apart by Dynamo's frame: a graph compiled again for that frame (new shapes) takes its
place, not a new one. Bytes held by two graphs (a weight both read) count twice: the
split errs above the step's peak.
"""
import math
from dataclasses import dataclass


class ShareTooSmall(RuntimeError):
    """A graph of the step does not fit beside the ones before it; `caps` (position of a
    graph in the step -> {"kept": bytes, "peak": bytes}) are what they must keep to."""

    def __init__(self, caps, message):
        super().__init__(message)
        self.caps = caps


@dataclass
class GraphShare:
    kept: int    # held while later graphs run: its inputs and what it saved
    inputs: int  # the part of `kept` no plan changes
    peak: int    # its own step peak, its inputs included
    grads: int   # its gradients, alive from its backward to the end of the step


def current_frame():
    """Dynamo's id of the frame being compiled (0 outside Dynamo)."""
    from torch._guards import CompileContext
    compile_id = CompileContext.current_compile_id()
    return 0 if compile_id is None else compile_id.frame_id


class StepShares:
    """The graphs one partitioner has split, in the order of the step, and the caps
    learned from an earlier compilation of it."""

    def __init__(self, available, caps=None):
        self.available = available  # the budget less what the program holds beside
        self.caps = {int(k): dict(v) for k, v in (caps or {}).items()}
        self.frames = {}  # Dynamo frame -> GraphShare

    def position(self, frame):
        return sorted(set(self.frames) | {frame}).index(frame)

    def _before(self, frame):
        return [self.frames[f] for f in sorted(self.frames) if f < frame]

    def limits(self, frame):
        """(the most the graph at `frame` may peak at, the most it may keep)."""
        cap = self.caps.get(self.position(frame), {})
        share = self.available - sum(g.kept for g in self._before(frame))
        return min(share, cap.get("peak", math.inf)), cap.get("kept", math.inf)

    def too_small(self, frame, least, name):
        """Raises ShareTooSmall with the caps under which a graph whose plans peak at
        `least` or more would fit, or returns the bytes still missing where no caps on the
        graphs before it make room (0 where they do not stand in its way)."""
        earlier = self._before(frame)
        short = least - (self.available - sum(g.kept for g in earlier))
        if short <= 0 or not earlier:  # not for want of what earlier graphs hold
            return max(short, 0)
        caps = {k: dict(v) for k, v in self.caps.items()}
        for position in reversed(range(len(earlier))):
            graph = earlier[position]
            take = min(short, graph.kept - graph.inputs)
            if take > 0:
                cap = caps.setdefault(position, {})
                cap["kept"] = min(cap.get("kept", math.inf), graph.kept - take)
                short -= take
        if short > 0:
            return short
        raise ShareTooSmall(caps, f"remat_torch: {name}'s plans need {least} bytes at "
                            "least; the graphs before it in the step must hold less")

    def record(self, frame, share, name):
        """Keeps `share` for the graph at `frame`; raises ShareTooSmall where an earlier
        graph's backward no longer fits beside the gradients of the graphs after it."""
        self.frames[frame] = share
        frames = sorted(self.frames)
        for position, earlier in enumerate(f for f in frames if f < frame):
            graph = self.frames[earlier]
            grads = sum(self.frames[f].grads for f in frames if earlier < f <= frame)
            before = sum(self.frames[f].kept for f in frames if f < earlier)
            over = before + graph.peak + grads - self.available
            if over > 0:
                caps = {k: dict(v) for k, v in self.caps.items()}
                cap = caps.setdefault(position, {})
                cap["peak"] = min(cap.get("peak", math.inf), graph.peak - over)
                raise ShareTooSmall(caps, f"remat_torch: the backward of a graph before "
                                    f"{name}, beside the gradients of the graphs after "
                                    f"it, takes {over} bytes over the budget")
