"""Train an MLP (64-128-64-10) on scikit-learn's bundled digits, save it, reload it, evaluate.

    python -m tallow.examples.digits_mlp [--device cpu|python|wgpu] [--epochs N]

The digits are 8x8 images (64 features), so this is Candle's MNIST MLP at the
size of the data that ships inside scikit-learn (no download).
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import tallow
from tallow import functional as F
from tallow.nn import Linear, Module, VarBuilder, VarMap
from tallow.optim import AdamW, CosineWarmup


class MLP(Module):
    def __init__(self, vb):
        self.l1 = Linear(vb.pp("l1"), 64, 128)
        self.l2 = Linear(vb.pp("l2"), 128, 64)
        self.l3 = Linear(vb.pp("l3"), 64, 10)

    def forward(self, x):
        return self.l3(self.l2(self.l1(x).relu()).relu())


def load_digits_split(seed=0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.data / 16.0).astype("float32")
    return train_test_split(x, d.target.astype("int64"), test_size=0.25, random_state=seed, stratify=d.target)


def accuracy(model, x, y):
    with tallow.no_grad():
        return (model(x).argmax(1) == y).to(tallow.f32).mean().item()


def train(device="cpu", epochs=30, batch=64, lr=3e-3, seed=0, log=print):
    tallow.manual_seed(seed)
    xtr, xte, ytr, yte = load_digits_split(seed)
    dev = tallow.Device(device)
    Xtr, Ytr = tallow.from_numpy(xtr, dev), tallow.from_numpy(ytr, dev)
    Xte, Yte = tallow.from_numpy(xte, dev), tallow.from_numpy(yte, dev)
    varmap = VarMap()
    model = MLP(VarBuilder(varmap, device=dev))
    opt = AdamW(varmap.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = -(-len(xtr) // batch)
    sched = CosineWarmup(opt, warmup_steps=steps_per_epoch, total_steps=epochs * steps_per_epoch)
    rng = tallow.creation.generator()
    losses = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = list(range(len(xtr)))
        rng.shuffle(order)
        total = 0.0
        for i in range(0, len(order), batch):
            idx = tallow.tensor(order[i:i + batch], device=dev)
            loss = F.cross_entropy(model(Xtr.index_select(0, idx)), Ytr.index_select(0, idx))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
        losses.append(total / steps_per_epoch)
        log(f"epoch {epoch + 1:3d}  loss {losses[-1]:.4f}  test accuracy {accuracy(model, Xte, Yte):.4f}")
    return model, varmap, losses, (Xte, Yte), time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args(argv)
    model, varmap, _, (Xte, Yte), seconds = train(args.device, args.epochs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mlp.safetensors"
        varmap.save(path)
        fresh = VarMap()
        reloaded = MLP(VarBuilder(fresh, device=args.device))
        fresh.load(path)
        acc = accuracy(reloaded, Xte, Yte)
    print(f"trained in {seconds:.1f} s on {args.device}; reloaded model test accuracy {acc:.4f}")
    return 0 if acc >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
