"""CIFAR-10 SimCLR cost on this machine: views, training steps per architecture, the probe.

Three measurements, each with a baseline taken in the same process, in CPU seconds of one thread
(on an idle core that is the wall time; a shared machine inflates the wall clock, so the load
average is printed):

- views: one random view of one 32 px image per regime (torchvision.transforms.v2, as the
  DataLoader workers make them) against the bare ToDtype + Normalize of the same image;
- training: one SimCLR step (2 x batch views through encoder and head, NT-Xent, AdamW) per
  architecture of the config against one forward + backward of the encoder alone on the batch;
- probe: the scikit-learn logistic regression on ``--probe-n`` feature vectors of the
  configured width against one pass of StandardScaler over them.

The projection multiplies the view cost by 2 x 50000 views per epoch: the CPU core-seconds of
augmentation one epoch needs, i.e. how many DataLoader workers (``cifar.threads`` - 1) a GPU run
needs to keep up. No data is needed (synthetic CIFAR-format images).

    .venv/bin/python benchmarks/cifar.py [--config config/config.yaml] [--batch 16] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from repdiag.cifar.data import synthetic_images
from repdiag.cifar.encoders import build_simclr_model, parameter_count
from repdiag.cifar.probe import LinearProbeSettings, linear_probe
from repdiag.cifar.regimes import REGIMES, regime_settings
from repdiag.cifar.study import run_params
from repdiag.cifar.train import SimCLRSettings, param_groups
from repdiag.cifar.views import eval_transform, to_chw_tensor, view_transform
from repdiag.core.config import fill_defaults
from repdiag.encoders.zoo.objectives.simclr import nt_xent_loss

REPO = Path(__file__).resolve().parent.parent
CIFAR_TRAIN_IMAGES = 50_000


def cpu_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - start) / repeats


def bench_views(cifar: dict, n_images: int) -> None:
    images = to_chw_tensor(synthetic_images(max(1, n_images // 10), 10, 32).images)
    mean, std = cifar["normalize"]["mean"], cifar["normalize"]["std"]
    bare = eval_transform(mean, std)
    base = cpu_seconds(lambda: [bare(im) for im in images], 3) / len(images)
    print(f"views: baseline ToDtype + Normalize {1e3 * base:.3f} ms/image")
    for name in REGIMES:
        view = view_transform(name, regime_settings(name, cifar["augment"]), 32, mean, std)
        per_view = cpu_seconds(lambda view=view: [view(im) for im in images], 3) / len(images)
        epoch = 2 * CIFAR_TRAIN_IMAGES * per_view
        print(
            f"  {name:10s} {1e3 * per_view:7.3f} ms/view  ratio {per_view / base:6.1f}x  "
            f"one epoch of views: {epoch:6.0f} core-s"
        )


def bench_training(cifar: dict, batch: int, steps: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(2 * batch, 3, 32, 32)
    print(f"training (batch {batch}, i.e. {2 * batch} views per step):")
    for arch in cifar["architectures"]:
        params = run_params(cifar, f"{arch}__all__s0")
        model = build_simclr_model(
            arch,
            params["encoder"],
            params["feature_dim"],
            params["head"]["hidden_dim"],
            params["head"]["out_dim"],
            32,
        ).train()
        settings = SimCLRSettings.from_config(dict(**params["train"]))
        optimizer = torch.optim.AdamW(param_groups(model, settings.weight_decay), lr=1e-4)

        def encoder_only(model=model) -> None:
            model.encoder(x[:batch]).square().mean().backward()
            model.zero_grad(set_to_none=True)

        def simclr_step(model=model, optimizer=optimizer, tau=settings.temperature) -> None:
            _, z = model(x)
            loss = nt_xent_loss(*z.chunk(2), tau)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        base = cpu_seconds(encoder_only, steps)
        step = cpu_seconds(simclr_step, steps)
        print(
            f"  {arch:9s} {parameter_count(model.encoder) / 1e6:6.2f} M params  "
            f"step {step:6.2f} s  ({2 * batch / step:7.1f} views/s)  "
            f"baseline fwd+bwd {base:6.2f} s  ratio {step / base:4.2f}x"
        )


def bench_probe(cifar: dict, n: int) -> None:
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    d = cifar["feature_dim"]
    centres = 0.05 * rng.standard_normal((10, d))  # overlapping classes, like real features
    labels = rng.integers(0, 10, 2 * n)
    features = (centres[labels] + rng.standard_normal((2 * n, d))).astype(np.float32)
    base = cpu_seconds(lambda: StandardScaler().fit_transform(features[:n]), 1)
    start = time.process_time()
    result = linear_probe(
        features[:n],
        labels[:n],
        features[n:],
        labels[n:],
        LinearProbeSettings.from_config(cifar["probe"]),
    )
    probe = time.process_time() - start
    print(
        f"probe: {n} x {d} features, {probe:.2f} s ({result.n_iter} L-BFGS iterations, "
        f"accuracy {result.accuracy:.3f}); baseline StandardScaler {base:.4f} s, "
        f"ratio {probe / base:.0f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config/config.yaml"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--views", type=int, default=200, help="images per view timing")
    parser.add_argument("--probe-n", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = fill_defaults(yaml.safe_load(Path(args.config).read_text()))
    cifar = config["cifar"]
    print(f"load average {os.getloadavg()[0]:.1f}, torch threads {torch.get_num_threads()}")
    bench_views(cifar, args.views)
    bench_training(cifar, args.batch, args.steps)
    bench_probe(cifar, args.probe_n)


if __name__ == "__main__":
    main()
