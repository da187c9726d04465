"""What a program shares stays shared on the device: idioms as users write them (tied
weights, a parameter used twice, hooks, parametrizations, state_dict round trips, gradient
accumulation), each trained a few steps on the CPU and on the device, unconstrained and at
0.5 of its activation bytes, bitwise (Note [Moves keep identity], pytorch/shallow_copy.cc).

    PYTHONPATH=build/python python3 -m unittest -v shared_tensors_test   (from pytorch/)
"""
import gc
import io
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

import remat_torch
from remat_torch_test import REFERENCE, DeviceTest, deterministic_algorithms, fixed_bytes, same

DEV = remat_torch.device
FRACTIONS = [None, 0.5]


class Block(nn.Module):
    def __init__(self, c, dropout=0.1):
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln(x)))))


def trunk(width=256, depth=12, activation=nn.Tanh):
    """Layers whose activations outweigh any one operator's operands, so that 0.5 of them
    is a budget some schedule meets."""
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), activation()]
    return nn.Sequential(*layers)


def mlp(features=64, width=256, classes=10):
    return nn.Sequential(nn.Linear(features, width), nn.ReLU(), trunk(width),
                         nn.Linear(width, classes))


class TiedGpt(nn.Module):
    """nanoGPT's layout: the output layer's weight is the token embedding's."""

    def __init__(self, vocab=256, c=64, t=64, layers=4):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, c), wpe=nn.Embedding(t, c), drop=nn.Dropout(0.1),
            h=nn.ModuleList(Block(c) for _ in range(layers)), ln_f=nn.LayerNorm(c)))
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def adamw_groups(model):
    """nanoGPT's optimizer: weight decay on matrices only, one group each."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-3)


def token_batches(steps, vocab=256, t=64, batch=8):
    gen = torch.Generator().manual_seed(5)
    return [(torch.randint(0, vocab, (batch, t), generator=gen),
             torch.randint(0, vocab, (batch, t), generator=gen)) for _ in range(steps)]


def feature_batches(steps, features=64, classes=10, batch=1024):
    gen = torch.Generator().manual_seed(6)
    return [(torch.randn(batch, features, generator=gen),
             torch.randint(0, classes, (batch,), generator=gen)) for _ in range(steps)]


def plain_step(model, optimizer, x, y, clip=None, set_to_none=True):
    optimizer.zero_grad(set_to_none=set_to_none)
    loss = model(x, y)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss


class Idiom:
    """One program: `build()` makes the model on the CPU (seeded), `optimizer(model)` its
    optimizer, `step(model, optimizer, x, y)` one training step returning the loss;
    `optimizer_first`: the optimizer is made before the model is moved; `after_move(model)`
    runs on the moved model (hooks, initialisation); `slots`: optimizer state per parameter."""

    def __init__(self, build, batches, optimizer=None, step=plain_step, slots=0,
                 optimizer_first=False, after_move=None):
        self.build, self.batches, self.step = build, batches, step
        self.optimizer = optimizer or (lambda m: torch.optim.SGD(m.parameters(), lr=0.05))
        self.slots, self.optimizer_first, self.after_move = slots, optimizer_first, after_move

    def train(self, device):
        """Returns (losses, final state on the CPU, the moved model)."""
        gc.collect()  # an earlier run's tensors, held in cycles, would count in this one's
        torch.manual_seed(1234)
        model = self.build()
        optimizer = self.optimizer(model) if self.optimizer_first else None
        model = model.to(device)
        if self.after_move is not None:
            self.after_move(model)
        if optimizer is None:
            optimizer = self.optimizer(model)
        losses = []
        for x, y in self.batches:
            losses.append(self.step(model, optimizer, x.to(device), y.to(device)).detach().cpu())
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return losses, state, model


def identity_signature(model):
    """The program's idea of which of its tensors are the same: names of every parameter and
    buffer, duplicates included, grouped by the object they name."""
    groups = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return sorted(sorted(g) for g in groups.values())


class SharedTensorChecks:
    def check(self, idiom, fractions=FRACTIONS):
        """Trains `idiom` on the CPU, then on the device at each fraction of its activation
        bytes (None: unconstrained, which measures them): losses and final state bitwise,
        the same parameters shared, peaks within budget."""
        cpu_losses, cpu_state, cpu_model = idiom.train(REFERENCE)
        budget_of = {}
        for fraction in fractions:
            with self.subTest(fraction=fraction):
                budget = None if fraction is None else budget_of[fraction]
                remat_torch.set_budget(budget)
                remat_torch.reset_peaks()
                before = remat_torch.stats()
                losses, state, model = idiom.train(DEV)
                after = remat_torch.stats()
                self.assertEqual(len(list(model.parameters())),
                                 len(list(cpu_model.parameters())))
                self.assertEqual(identity_signature(model), identity_signature(cpu_model))
                for a, b in zip(losses, cpu_losses, strict=True):
                    self.assertTrue(same(a, b), f"loss {a} != {b}")
                self.assertEqual(state.keys(), cpu_state.keys())
                for k in cpu_state:
                    self.assertTrue(same(state[k], cpu_state[k]), k)
                if budget is None:
                    fixed = fixed_bytes(model, idiom.slots)
                    peak = after["peak_allocated_bytes"]
                    self.assertGreater(peak, fixed)
                    for f in fractions:
                        if f is not None:
                            budget_of[f] = int(fixed + f * (peak - fixed))
                else:
                    self.assertLessEqual(after["peak_reserved_bytes"], budget)
                    self.assertGreater(after["recomputations"], before["recomputations"])
                del model
        remat_torch.set_budget(None)


class TiedWeights(SharedTensorChecks, DeviceTest):
    def setUp(self):
        remat_torch.set_budget(None)

    def test_gpt_with_tied_embedding_adamw_and_clipping(self):
        # The program: before the fix the move made the tied weight two Parameters.
        idiom = Idiom(TiedGpt, token_batches(4), adamw_groups, slots=2,
                      step=lambda m, o, x, y: plain_step(m, o, x, y, clip=1.0))
        moved = TiedGpt().to(DEV)
        self.assertIs(moved.lm_head.weight, moved.transformer.wte.weight)
        with deterministic_algorithms():
            self.check(idiom)

    def test_a_parameter_registered_twice_in_one_module(self):
        class TwoNames(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(64, 256) * 0.1)
                self.register_parameter("w_again", self.w)
                self.trunk = trunk()
                self.head = nn.Linear(64, 10)

            def forward(self, x, y):
                h = self.trunk(torch.tanh(x @ self.w))
                h = torch.tanh(h @ self.w_again.t())
                return F.cross_entropy(self.head(h), y)

        self.check(Idiom(TwoNames, feature_batches(3)))

    def test_a_module_called_twice_and_a_weight_read_by_several_operators(self):
        # Gradient accumulation onto one leaf from several operators: the shared encoder's
        # weights from both calls, and `w` read by a matmul and a multiplication.
        class Siamese(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(64, 256), trunk(depth=3),
                                             nn.Linear(256, 64))
                self.w = nn.Parameter(torch.randn(64, 64) * 0.1)
                self.head = nn.Linear(64, 10)

            def forward(self, x, y):
                a, b = self.encoder(x), self.encoder(x.flip(0))
                h = (a * b) @ self.w + a * self.w.diagonal()
                return F.cross_entropy(self.head(h), y)

        self.check(Idiom(Siamese, feature_batches(3)))


class MovedTogether(SharedTensorChecks, DeviceTest):
    """What the program made before the move: an optimizer, hooks, parametrizations."""

    def setUp(self):
        remat_torch.set_budget(None)

    def test_an_optimizer_made_before_the_move(self):
        # torch's documentation asks for the optimizer after the move; on CUDA the move keeps
        # the Parameters (set_data), so one made before works, and does here too.
        def step(model, optimizer, x, y):
            for p in optimizer.param_groups[0]["params"]:
                assert p.device == x.device  # the optimizer holds the moved Parameters
            return plain_step(lambda a, b: F.cross_entropy(model(a), b), optimizer, x, y)

        adam = lambda m: torch.optim.Adam(m.parameters(), lr=1e-3)
        self.check(Idiom(mlp, feature_batches(3), adam, step=step, slots=2,
                         optimizer_first=True))

    def test_hooks_registered_before_the_move(self):
        # A gradient hook scaling one weight's gradient, and the optimizer in the backward
        # pass (register_post_accumulate_grad_hook): registered on the CPU, as on CUDA they
        # stay with their Parameters through the move.
        def build():
            model = mlp()
            model[2][0].weight.register_hook(lambda g: g * 0.5)
            # A counter, not the model: a hook that held its model would keep it alive in a
            # cycle through autograd's C++ hooks, which Python's collector cannot see.
            model.hook_calls = calls = [0]

            def update(p):
                calls[0] += 1
                with torch.no_grad():
                    p.add_(p.grad, alpha=-0.05)
                p.grad = None

            for p in model.parameters():
                p.register_post_accumulate_grad_hook(update)
            return model

        def step(model, optimizer, x, y):
            calls = model.hook_calls[0]
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            assert model.hook_calls[0] == calls + len(list(model.parameters()))
            return loss

        self.check(Idiom(build, feature_batches(3), step=step))

    def test_hooks_registered_after_the_move(self):
        def after_move(model):
            model[2][0].weight.register_hook(lambda g: g.clamp(-0.01, 0.01))

            def double(p):
                p.grad.mul_(2)

            model[3].bias.register_post_accumulate_grad_hook(double)

        step = lambda m, o, x, y: plain_step(lambda a, b: F.cross_entropy(m(a), b), o, x, y)
        self.check(Idiom(mlp, feature_batches(3), step=step, after_move=after_move))

    def test_weight_parametrizations(self):
        class Symmetric(nn.Module):
            def forward(self, w):
                return w.triu() + w.triu(1).t()

        class Parametrized(nn.Module):
            def __init__(self):
                super().__init__()
                self.square = nn.Linear(256, 256)
                parametrize.register_parametrization(self.square, "weight", Symmetric())
                self.first = nn.utils.parametrizations.weight_norm(nn.Linear(64, 256))
                self.trunk = trunk()
                self.head = nn.Linear(256, 10)

            def forward(self, x, y):
                h = self.trunk(torch.tanh(self.square(torch.tanh(self.first(x)))))
                return F.cross_entropy(self.head(h), y)

        idiom = Idiom(Parametrized, feature_batches(3))
        moved = Parametrized().to(DEV)
        self.assertTrue(parametrize.is_parametrized(moved.square, "weight"))
        self.assertEqual(moved.square.parametrizations.weight.original.device, DEV)
        self.check(idiom)

    def test_initialised_after_the_move(self):
        # model.apply(init) on the device: random initialisers draw what they draw on the CPU.
        def after_move(model):
            def init(m):
                if isinstance(m, nn.Linear):
                    nn.init.kaiming_normal_(m.weight)
                    nn.init.zeros_(m.bias)
            model.apply(init)

        step = lambda m, o, x, y: plain_step(lambda a, b: F.cross_entropy(m(a), b), o, x, y)
        self.check(Idiom(mlp, feature_batches(3), step=step, after_move=after_move))


class SharedBuffers(SharedTensorChecks, DeviceTest):
    def setUp(self):
        remat_torch.set_budget(None)

    def test_a_buffer_two_modules_register_follows_module_apply(self):
        # Module._apply replaces each module's buffer by its converted copy, on every device
        # (CUDA too): after a move two modules that registered one buffer hold one each, as
        # after any conversion by torch. A buffer read by both trains as on the CPU.
        class Scaled(nn.Module):
            def __init__(self, scale):
                super().__init__()
                self.register_buffer("scale", scale)
                self.lin = nn.Linear(256, 256)

            def forward(self, x):
                return torch.tanh(self.lin(x) * self.scale)

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                scale = torch.linspace(0.5, 1.5, 256)
                self.first = nn.Linear(64, 256)
                self.a, self.b = Scaled(scale), Scaled(scale)
                self.trunk = trunk()
                self.head = nn.Linear(256, 10)

            def forward(self, x, y):
                h = self.b(self.trunk(self.a(self.first(x))))
                return F.cross_entropy(self.head(h), y)

        converted = Model().to(torch.float64)  # torch's own conversion path
        moved = Model().to(DEV)
        self.assertEqual(moved.a.scale is moved.b.scale, converted.a.scale is converted.b.scale)
        self.check(Idiom(Model, feature_batches(3)))

    def test_a_batch_norm_module_used_by_two_branches(self):
        # Its running statistics, updated in place by both calls of each step.
        class TwoBranches(nn.Module):
            def __init__(self):
                super().__init__()
                self.left, self.right = nn.Linear(64, 256), nn.Linear(64, 256)
                self.norm = nn.BatchNorm1d(256)
                self.trunk = trunk()
                self.head = nn.Linear(256, 10)

            def forward(self, x, y):
                h = torch.relu(self.norm(self.left(x))) + torch.relu(self.norm(self.right(x)))
                return F.cross_entropy(self.head(self.trunk(h)), y)

        sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        self.check(Idiom(TwoBranches, feature_batches(3), sgd, slots=1))


class Accumulation(SharedTensorChecks, DeviceTest):
    def setUp(self):
        remat_torch.set_budget(None)

    def test_micro_batches_with_zero_grad_to_zero_and_clipping(self):
        # Two micro-batches a step into gradients zeroed in place, clipped, then stepped.
        def step(model, optimizer, x, y):
            optimizer.zero_grad(set_to_none=False)
            total = 0
            for xs, ys in zip(x.chunk(2), y.chunk(2)):
                loss = model(xs, ys) / 2
                loss.backward()
                total = total + loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return total

        idiom = Idiom(TiedGpt, token_batches(3), adamw_groups, step=step, slots=2)
        with deterministic_algorithms():
            self.check(idiom)


class StateDicts(DeviceTest):
    def setUp(self):
        remat_torch.set_budget(None)

    def resume(self, device, save_on):
        """Trains 2 steps, saves model and optimizer with torch.save (from `save_on`'s
        tensors), loads both into a fresh model and optimizer on `device`, trains 2 more."""
        batches = token_batches(4)
        torch.manual_seed(1234)
        model = TiedGpt().to(device)
        optimizer = adamw_groups(model)
        for x, y in batches[:2]:
            plain_step(model, optimizer, x.to(device), y.to(device), clip=1.0)
        buffer = io.BytesIO()
        cpu = lambda sd: {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
        model_state = model.state_dict() if save_on == "device" else cpu(model.state_dict())
        torch.save({"model": model_state, "optimizer": optimizer.state_dict()}, buffer)
        buffer.seek(0)
        saved = torch.load(buffer)
        fresh = TiedGpt().to(device)
        fresh.load_state_dict(saved["model"])
        resumed = adamw_groups(fresh)
        resumed.load_state_dict(saved["optimizer"])
        self.assertIs(fresh.lm_head.weight, fresh.transformer.wte.weight)
        losses = []
        for x, y in batches[2:]:
            losses.append(plain_step(fresh, resumed, x.to(device), y.to(device), clip=1.0)
                          .detach().cpu())
        return losses, {k: v.cpu() for k, v in fresh.state_dict().items()}, fresh

    def test_save_and_load_resume_bitwise(self):
        with deterministic_algorithms():
            cpu_losses, cpu_state, cpu_model = self.resume("cpu", "cpu")
            for save_on in ("device", "cpu"):
                with self.subTest(saved_from=save_on):
                    losses, state, model = self.resume(DEV, save_on)
                    self.assertEqual(list(state), list(cpu_state))
                    self.assertEqual(identity_signature(model), identity_signature(cpu_model))
                    for a, b in zip(losses, cpu_losses, strict=True):
                        self.assertTrue(same(a, b), f"loss {a} != {b}")
                    for k in cpu_state:
                        self.assertTrue(same(state[k], cpu_state[k]), k)

    def test_state_dict_and_named_parameters_list_what_the_cpu_lists(self):
        cpu, dev = TiedGpt(), TiedGpt().to(DEV)
        self.assertEqual(list(dev.state_dict()), list(cpu.state_dict()))
        for remove in (True, False):
            self.assertEqual([n for n, _ in dev.named_parameters(remove_duplicate=remove)],
                             [n for n, _ in cpu.named_parameters(remove_duplicate=remove)])
        # A tied pair's two state_dict entries are views of one storage, as on the CPU.
        sd = dev.state_dict()
        self.assertEqual(sd["lm_head.weight"].untyped_storage().data_ptr(),
                         sd["transformer.wte.weight"].untyped_storage().data_ptr())
        self.assertNotEqual(sd["lm_head.weight"].untyped_storage().data_ptr(),
                            sd["transformer.wpe.weight"].untyped_storage().data_ptr())

    def test_moving_back_to_the_cpu_keeps_the_parameters(self):
        model = TiedGpt()
        weight = model.lm_head.weight
        model.to(DEV)
        self.assertIs(model.lm_head.weight, weight)
        self.assertEqual(weight.device, DEV)
        model.cpu()
        self.assertIs(model.transformer.wte.weight, weight)
        self.assertEqual(weight.device.type, "cpu")


if __name__ == "__main__":
    unittest.main()
