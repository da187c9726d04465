"""remat's planners as torch.compile's partitioner (Note [A byte budget inside
torch.compile], remat_torch/partitioner.py): Inductor on the CPU, the measured peak of a
step within the budget asked and monotone in it, results as eager's.

    PYTHONPATH=build/python python3 -m unittest -v compile_test   (from pytorch/)
"""
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import remat_torch


class MlpWithLoss(nn.Module):
    """The loss inside the compiled graph, so that the step is one graph: its inputs (the
    parameters, the batch) are what the program holds regardless."""

    def __init__(self, layers=6, width=256):
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks += [nn.Linear(width, width), nn.GELU()]
        self.body = nn.Sequential(*blocks, nn.Linear(width, 10))

    def forward(self, x, y):
        return F.cross_entropy(self.body(x), y)


def held_bytes(model, *inputs):
    return (sum(p.numel() * p.element_size() for p in model.parameters())
            + sum(t.numel() * t.element_size() for t in inputs))


def compiled_step(model, budget, planner="best"):
    torch._dynamo.reset()  # a partitioner per budget: nothing reused across them
    return remat_torch.compile(model, budget=budget, planner=planner, time_limit=0.5)


def measured_step(model, step, x, y):
    """Runs one step; returns (loss, gradients, the step's peak bytes with its inputs). A
    compiled step runs once first: compiling allocates too."""
    step(x, y).backward()
    model.zero_grad(set_to_none=True)
    with remat_torch.cpu_memory() as meter:
        loss = step(x, y)
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads, held_bytes(model, x, y) + meter.peak_bytes


class CompiledMlp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.model = MlpWithLoss()
        cls.x, cls.y = torch.randn(512, 256), torch.randint(0, 10, (512,))

    def test_budgets_hold_and_results_match_eager(self):
        model, x, y = self.model, self.x, self.y
        eager_loss, eager_grads, eager_peak = measured_step(model, model, x, y)
        # Above the step's eager peak: no recomputation is needed.
        loss, grads, top = measured_step(model, compiled_step(model, eager_peak), x, y)
        torch.testing.assert_close(loss, eager_loss)
        for a, b in zip(grads, eager_grads, strict=True):
            torch.testing.assert_close(a, b)
        self.assertLessEqual(top, eager_peak)
        # Below the least any plan needs: an error at compile time, naming that least.
        with self.assertRaises(Exception) as caught:
            compiled_step(model, held_bytes(model, x, y) + 1)(x, y)
        least = caught.exception  # Dynamo's BackendCompilerFailed, the partitioner's inside
        while least is not None and not isinstance(least, remat_torch.BudgetTooSmall):
            least = getattr(least, "inner_exception", None) or least.__cause__
        self.assertIsNotNone(least, str(caught.exception))
        self.assertIn(f"least feasible budget is {least.least}", str(least))
        self.assertLess(least.least, top)
        # Five budgets across the feasible range: each step's measured peak within its
        # budget, the peaks monotone in the budget, the results eager's.
        budgets = [int(least.least + k * (top - least.least) / 4) for k in range(5)]
        peaks = []
        for budget in budgets:
            with self.subTest(budget=budget):
                loss, grads, peak = measured_step(model, compiled_step(model, budget), x, y)
                self.assertLessEqual(peak, budget)
                torch.testing.assert_close(loss, eager_loss)
                for a, b in zip(grads, eager_grads, strict=True):
                    torch.testing.assert_close(a, b)
                peaks.append(peak)
        self.assertEqual(peaks, sorted(peaks), f"budgets {budgets}")
        self.assertLess(peaks[0], peaks[-1])
        # (A graph served from torch's compile caches was not partitioned again: no report.)
        for report in remat_torch.partition_reports():
            self.assertLessEqual(report.modelled_peak, report.budget)


class Partitioner(unittest.TestCase):
    def test_uuid_names_the_budget_and_the_planner(self):
        a = remat_torch.RematPartitioner(1 << 20, "best")
        self.assertEqual(a.uuid(), remat_torch.RematPartitioner(1 << 20, "best").uuid())
        self.assertNotEqual(a.uuid(), remat_torch.RematPartitioner(2 << 20, "best").uuid())
        self.assertNotEqual(a.uuid(), remat_torch.RematPartitioner(1 << 20, "chen").uuid())

    def test_the_meter_counts_what_is_allocated_inside(self):
        with remat_torch.cpu_memory() as meter:
            a = torch.empty(1 << 20, dtype=torch.uint8)
            b = torch.empty(1 << 19, dtype=torch.uint8)
            del a
            c = torch.empty(1 << 18, dtype=torch.uint8)
        self.assertEqual(meter.peak_bytes, (1 << 20) + (1 << 19))
        self.assertEqual(meter.live_bytes, (1 << 19) + (1 << 18))
        del b, c

    def test_meters_nest(self):
        with remat_torch.cpu_memory() as outer:
            a = torch.empty(1 << 20, dtype=torch.uint8)
            with remat_torch.cpu_memory() as inner:
                b = torch.empty(1 << 18, dtype=torch.uint8)
                del b
            del a
        self.assertEqual(inner.peak_bytes, 1 << 18)
        self.assertEqual(outer.peak_bytes, (1 << 20) + (1 << 18))
        self.assertEqual(outer.live_bytes, 0)


if __name__ == "__main__":
    unittest.main()
