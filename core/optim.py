"""Optimisers (SGD, Adam, AdamW) and a cosine learning-rate schedule with warm-up.

Updates happen in place under no_grad, on whatever device the parameters live.
`state_dict()` holds tensors and numbers; `save(path)` writes it as safetensors.
"""
import math

from .autograd import no_grad
from .creation import zeros_like


class Optimizer:
    def __init__(self, params, lr):
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("the optimiser got no parameters")
        self.lr = lr
        self.steps = 0
        self.state = {}

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @no_grad()
    def step(self):
        self.steps += 1
        for i, p in enumerate(self.params):
            if p.grad is not None:
                p[...] = self.update(i, p, p.grad)

    def _buffer(self, name, i, p):
        key = f"{name}.{i}"
        if key not in self.state:
            self.state[key] = zeros_like(p)
        return self.state[key]

    def state_dict(self):
        return {"steps": self.steps, "lr": self.lr, "buffers": dict(self.state)}

    def load_state_dict(self, state):
        self.steps, self.lr = int(state["steps"]), float(state["lr"])
        self.state = dict(state["buffers"])

    def save(self, path):
        from .creation import tensor
        from .io import save_file
        tensors = {f"buffers.{k}": v for k, v in self.state.items()}
        tensors["steps"] = tensor([float(self.steps)])
        tensors["lr"] = tensor([float(self.lr)])
        save_file(tensors, path)

    def load(self, path):
        from .io import load_file
        t = load_file(path)
        self.steps, self.lr = int(t.pop("steps").item()), float(t.pop("lr").item())
        self.state = {k[len("buffers."):]: v.to(self.params[0].device) for k, v in t.items()}


class SGD(Optimizer):
    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov

    def update(self, i, p, g):
        if self.weight_decay:
            g = g + p * self.weight_decay
        if self.momentum:
            key = f"momentum.{i}"
            buf = g if key not in self.state else self.state[key] * self.momentum + g
            self.state[key] = buf
            g = g + buf * self.momentum if self.nesterov else buf
        return p - g * self.lr


class Adam(Optimizer):
    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def update(self, i, p, g):
        b1, b2 = self.betas
        if self.weight_decay and not self.decoupled:
            g = g + p * self.weight_decay
        if self.weight_decay and self.decoupled:
            p = p * (1 - self.lr * self.weight_decay)
        m = self._buffer("m", i, p) * b1 + g * (1 - b1)
        v = self._buffer("v", i, p) * b2 + g * g * (1 - b2)
        self.state[f"m.{i}"], self.state[f"v.{i}"] = m, v
        m_hat = m * (1 / (1 - b1 ** self.steps))
        v_hat = v * (1 / (1 - b2 ** self.steps))
        return p - m_hat / (v_hat.sqrt() + self.eps) * self.lr


class AdamW(Adam):
    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


class CosineWarmup:
    """Linear warm-up to the base rate, then cosine decay to min_lr at total_steps."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0):
        self.opt, self.warmup, self.total, self.min_lr = optimizer, warmup_steps, total_steps, min_lr
        self.base = optimizer.lr
        self.t = 0
        optimizer.lr = self.lr_at(0)

    def lr_at(self, t):
        if t < self.warmup:
            return self.base * (t + 1) / self.warmup
        progress = min(1.0, (t - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.base - self.min_lr) * (1 + math.cos(math.pi * progress))

    def step(self):
        self.t += 1
        self.opt.lr = self.lr_at(self.t)
