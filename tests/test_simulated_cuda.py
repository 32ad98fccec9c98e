"""Every device path on CUDA, simulated on the CPU (tests/simulated_cuda.py): the model sources,
the controls, extraction, the Jacobian engine's methods, each zoo objective (the JER regulariser
and CLIP's captions included), the CIFAR and identifiability training loops. A tensor left on the
CPU fails with the module and line that made it; the two breaks once found are put back to show
that the harness sees them."""

from __future__ import annotations

import contextlib
import types
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from repdiag.binding import controls
from repdiag.encoders import build_encoder, jer_estimator
from repdiag.encoders.embeddings import extract_embeddings
from repdiag.encoders.jacobian.engine import jacobian_spectra
from tests import simulated_cuda as simulation
from tests.encoders.sources.helpers import TINY_CLIP, VIT, random_images
from tests.encoders.sources.test_hub import HUBCONF, TINYNET
from tests.encoders.sources.test_zoo import write_zoo_run
from tests.encoders.zoo.conftest import tiny_config
from tests.simulated_cuda import (
    CudaTensor,
    DeviceMismatch,
    GiB,
    SimulatedMemory,
    simulated_cuda,
    simulated_memory,
)

torch.set_num_threads(1)

SCENE_SIZE = 64  # the controls' default dataset size


def _torch_with(**overrides: Any) -> types.SimpleNamespace:
    """``torch`` as a module sees it, with some functions replaced (to put a break back)."""
    proxy = types.SimpleNamespace(**{name: getattr(torch, name) for name in dir(torch)})
    for name, fn in overrides.items():
        setattr(proxy, name, fn)
    return proxy


def _scenes(n: int = 4, size: int = SCENE_SIZE) -> torch.Tensor:
    """Rendered benchmark-like scenes in [0, 1] (N, 3, size, size): shapes on a 2x2 grid."""
    from repdiag.encoders.zoo.scenes import SceneSettings, scene_batch

    stream = SceneSettings.from_config(
        {"grid": [2, 2], "min_objects": 1, "max_objects": 4}, size, arrangement_groups=1
    )
    images = scene_batch(stream, 0, 0, n).images
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0


def _spectra(model: Any, x: torch.Tensor, method: str, **options: Any) -> Any:
    settings = {"k": 4, "power_iters": 1, "seed": 0, "precision": "fp32", **options}
    return jacobian_spectra(model, x, method=method, **settings)


# --- the harness itself --------------------------------------------------------------------------


def test_the_harness_keeps_cudas_same_device_rule_and_runs_clean_code():
    with simulated_cuda() as cuda:
        x = torch.randn(4, 3, device=cuda)
        assert isinstance(x, CudaTensor) and x.device == cuda and x.is_cuda
        with pytest.raises(DeviceMismatch, match=r"same device.*test_simulated_cuda\.py:"):
            x * torch.arange(3.0)
        with pytest.raises(DeviceMismatch, match="'cuda' device type for generator"):
            torch.randn(3, generator=torch.Generator().manual_seed(0), device=cuda)
        with pytest.raises(DeviceMismatch, match="numpy"):
            x.numpy()
        # what CUDA allows: CPU scalars, copies, indexing with CPU indices, .item()
        y = x * torch.tensor(2.0) + torch.arange(3.0, device=x.device)
        y[torch.tensor([0, 2])] = x[torch.tensor([1, 3])]
        assert float(y.sum()) == pytest.approx(float(y.cpu().sum()))
        # autograd and an optimiser step, and a result equal to the same on the CPU
        torch.manual_seed(0)
        layer = nn.Linear(3, 2)
        reference = layer(x.cpu()).square().sum()
        layer.to(cuda)
        loss = layer(x).square().sum()
        loss.backward()
        assert layer.weight.grad.device == cuda
        assert float(loss.detach()) == pytest.approx(float(reference.detach()))
        back = layer.cpu()
        assert back.weight.device.type == "cpu" and not isinstance(back.weight, CudaTensor)


def test_the_harness_counts_each_wait_of_the_host_for_the_device():
    with simulated_cuda() as cuda:
        x = torch.randn(4, device=cuda)
        y = x * 2 + torch.ones(4).to(cuda)  # work and a copy to the device: no wait
        assert sum(simulated_memory().host_reads.values()) == 0
        y.sum().item(), bool(y.any()), y.tolist(), y.cpu(), torch.nonzero(y)
        reads = simulated_memory().host_reads
        assert sum(reads.values()) == 5
        assert all("test_simulated_cuda.py:" in site for site in reads)
        torch.ones(3).sum().item()  # a CPU tensor: nothing to wait for
        assert sum(reads.values()) == 5


def _scalar_summary(x: torch.Tensor) -> torch.Tensor:
    """A known break: a 0-dim CPU tensor stacked with CUDA ones (CUDA refuses it; the CPU and
    the old harness, which let every CPU scalar through, did not)."""
    return torch.stack([x.norm(), x.abs().max(), torch.tensor(0.0)])


def test_a_cpu_scalar_stacked_or_catted_with_cuda_tensors_fails_as_on_cuda(monkeypatch):
    x = torch.randn(4)
    assert _scalar_summary(x).shape == (3,)  # the CPU cannot tell
    with simulated_cuda() as cuda:
        y = x.to(cuda)
        with pytest.raises(DeviceMismatch, match=r"aten.stack.*test_simulated_cuda.py:\d+ in _sc"):
            _scalar_summary(y)
        with pytest.raises(DeviceMismatch, match=r"aten\.cat"):
            torch.cat([y, torch.zeros(1)])
        assert float(y * torch.tensor(2.0) @ y) > 0  # elementwise ops take CPU scalars, as CUDA
        assert torch.stack([y.norm(), torch.zeros((), device=cuda)]).device == cuda
    # the break put back in the harness (0-dim CPU tensors allowed in stack): unseen
    monkeypatch.setattr(simulation, "NO_CPU_SCALARS", set())
    with simulated_cuda() as cuda:
        assert _scalar_summary(x.to(cuda)).device == cuda


def test_bf16_autocast_on_cuda_computes_in_bf16_as_cpu_autocast_does(monkeypatch):
    """A layer under ``torch.autocast("cuda", bfloat16)`` gives CPU autocast's bfloat16 output,
    bit for bit, and the same float32 gradients from a backward pass outside the block."""
    torch.manual_seed(0)
    layer, x = nn.Linear(8, 5), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
    expected.float().square().sum().backward()
    expected_grad = layer.weight.grad.clone()
    layer.weight.grad = None

    def on_cuda() -> tuple[torch.Tensor, torch.Tensor]:
        with simulated_cuda() as cuda:
            layer.to(cuda)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = layer(x.to(cuda))
            out.float().square().sum().backward()
            grad = layer.weight.grad.cpu()
            layer.cpu()
            layer.weight.grad = None
            return out.cpu(), grad

    out, grad = on_cuda()
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    assert grad.dtype == torch.float32 and torch.equal(grad, expected_grad)
    # the break put back (autocast ignored, as before): float32, and the check fails
    monkeypatch.setattr(simulation, "_cpu_autocast", contextlib.nullcontext)
    assert on_cuda()[0].dtype == torch.float32


def test_memory_and_synchronize_are_simulated_and_free_is_not_total():
    """mem_get_info gives the configured (free, total); the pass size comes from the free
    memory, never the total (the break: sizing against the whole card)."""
    from repdiag.encoders.jacobian.pass_size import memory_batch_size
    from tests.encoders.jacobian.models import engine, images, tiny_vit

    model = tiny_vit().eval().requires_grad_(False)
    settings = engine(method="randomized", k=8, power_iters=1)
    memory = SimulatedMemory(free=GiB // 64, total=80 * GiB)
    with simulated_cuda(memory) as cuda:
        assert torch.cuda.mem_get_info(cuda) == (GiB // 64, 80 * GiB)
        assert simulated_memory() is memory
        torch.cuda.synchronize()
        sized = memory_batch_size(model, images(2, (3, 32, 32)), settings, cuda)
    assert memory.synchronized == 1
    expected = memory_batch_size(
        model, images(2, (3, 32, 32)), settings, torch.device("cpu"), free_bytes=GiB // 64
    )
    whole_card = memory_batch_size(
        model, images(2, (3, 32, 32)), settings, torch.device("cpu"), free_bytes=80 * GiB
    )
    assert sized == expected < whole_card


def test_cuda_is_available_inside_so_the_cuda_branches_run():
    """is_available, the TF32 capability check, select_device("auto"), pinned memory and a
    timed matmul that synchronizes: each takes its CUDA branch, as on a GPU."""
    from repdiag.core.gpu import effective_precision
    from repdiag.core.runtime import select_device
    from repdiag.encoders.jacobian.plan_project import measure_rate

    assert not torch.cuda.is_available()  # this machine
    with simulated_cuda(SimulatedMemory(capability=(7, 0))) as cuda:
        assert torch.cuda.is_available() and select_device("auto") == cuda
        assert effective_precision("tf32", cuda) == "fp32"  # a V100: no TF32
        simulated_memory().capability = (8, 0)
        assert effective_precision("tf32", cuda) == "tf32"
        pinned = torch.arange(3.0).pin_memory()
        assert torch.equal(pinned.to(cuda, non_blocking=True).cpu(), torch.arange(3.0))
        with pytest.raises(DeviceMismatch, match="cannot pin"):
            pinned.to(cuda).pin_memory()
        assert measure_rate(size=16, repeats=1, device="cuda") > 0
        assert simulated_memory().synchronized == 4  # before and after each of 2 products
    assert not torch.cuda.is_available()


# --- the controls and the two breaks -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(controls.CONTROLS.names()))
def test_each_control_runs_on_cuda_with_its_cpu_values_and_jacobian(name):
    x = _scenes()
    control = controls.build_control(name)
    expected = control(x)
    with simulated_cuda() as cuda:
        control.to(cuda)
        got = control(x.to(cuda))
        assert got.device == cuda
        spectra = _spectra(control, x, "exact", device=cuda)
    torch.testing.assert_close(got.cpu(), expected)
    assert spectra["output"].shape[0] == len(x)


def test_the_harness_fails_on_the_controls_arange_without_a_device(monkeypatch):
    """The shape classifier's pixel-centre coordinates made without the input's device."""

    def arange(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.arange(*args, **kwargs)  # the device dropped, as the break had it

    monkeypatch.setattr(controls, "torch", _torch_with(arange=arange))
    control = controls.build_control("shape_oracle")
    assert control(_scenes()).shape[0] == 4  # the CPU cannot tell
    with simulated_cuda() as cuda:
        control.to(cuda)
        with pytest.raises(DeviceMismatch, match=r"repdiag/binding/controls.py:\d+ in slot_scores"):
            control(_scenes().to(cuda))


def test_the_harness_fails_on_a_cpu_generator_drawing_on_the_inputs_device(monkeypatch):
    """The JER probes drawn with the CPU generator straight onto the input's (CUDA) device."""
    with simulated_cuda() as cuda:

        def randn(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
            return torch.randn(*args, device=cuda, **kwargs)  # the input's device, as it was

        monkeypatch.setattr(jer_estimator, "torch", _torch_with(randn=randn))
        net = nn.Linear(6, 3).to(cuda)
        x = torch.randn(2, 6, device=cuda)
        with pytest.raises(DeviceMismatch, match=r"generator.*repdiag/encoders/jer_estimator.py"):
            jer_estimator.estimate_pr2(net, x, 2, torch.Generator().manual_seed(0))


def test_the_jer_estimate_on_cuda_equals_the_cpu_one_bit_for_bit():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    x = torch.randn(2, 6)
    cpu = jer_estimator.estimate_pr2(net, x, 3, torch.Generator().manual_seed(4))
    with simulated_cuda() as cuda:
        net.to(cuda)
        got = jer_estimator.estimate_pr2(net, x.to(cuda), 3, torch.Generator().manual_seed(4))
        assert got.device == cuda
    assert torch.equal(got.cpu(), cpu)


# --- model sources, extraction and the Jacobian engine -------------------------------------------


def _entries(tmp_path) -> dict[str, dict[str, Any]]:
    repo = tmp_path / "hub"
    repo.mkdir()
    (repo / "hubconf.py").write_text(HUBCONF)
    (repo / "tinynet.py").write_text(TINYNET)
    small = {"preprocess": {"input_size": 32}}
    return {
        "timm": VIT,
        "open_clip": {
            "source": "open_clip",
            "id": "ViT-S-32",
            "family": "vision_language",
            "kwargs": TINY_CLIP,
        },
        "torchvision": {"source": "torchvision", "id": "resnet18", "family": "supervised", **small},
        "hub": {
            "source": "hub",
            "id": "tiny_resnet",
            "repo": str(repo),
            "family": "variance_decorrelation",
            "kwargs": {"width": 4},
            **small,
        },
        "python": {
            "source": "python",
            "id": "repdiag.binding.controls:layout_mask",
            "family": "control",
            "kwargs": {"image_size": 32},
        },
        "checkpoint": {
            "source": "checkpoint",
            "id": "vit_tiny_patch16_224",
            "family": "supervised",
            "weights": str(_checkpoint(tmp_path)),
            "kwargs": {"img_size": 32, "depth": 2, "num_classes": 0},
        },
        "zoo": {"source": "zoo", "id": "simclr", "family": "contrastive"},
    }


def _checkpoint(tmp_path) -> Any:
    import timm
    from safetensors.torch import save_file

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=0)
    save_file(model.state_dict(), str(tmp_path / "vit.safetensors"))
    return tmp_path / "vit.safetensors"


def test_every_model_source_extracts_and_differentiates_on_cuda(tmp_path):
    images = random_images()
    sets = {"probe": (np.array(["a", "b", "c"], dtype=object), images)}
    write_zoo_run(tmp_path / "zoo" / "simclr")
    for source, entry in _entries(tmp_path).items():
        encoder = build_encoder(source, entry, zoo_dir=tmp_path / "zoo")
        expected = extract_embeddings(encoder, sets, batch_size=64, device="cpu")
        with simulated_cuda() as cuda:
            got = extract_embeddings(encoder, sets, batch_size=64, device=cuda)
            x = encoder.preprocess(images).to(cuda)
            layer = encoder.layers[0]
            for method in ("exact", "randomized"):
                spectra = _spectra(encoder, x[:2], method, layers=[layer], device=cuda)
                assert spectra[layer].shape[0] == 2, (source, method)
        assert got.attrs["device"].startswith("cuda"), source
        for name in expected.data_vars:
            np.testing.assert_allclose(got[name].values, expected[name].values, atol=1e-5)


def test_the_engines_methods_and_precisions_on_cuda_match_the_cpu():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.GELU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 12))
    x = torch.rand(3, 3, 8, 8)
    for method in ("exact", "randomized", "auto"):
        expected = _spectra(net, x, method, device="cpu")["output"]
        with simulated_cuda() as cuda:
            got = _spectra(net, x, method, device=cuda)["output"]
            net.cpu()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    fp32 = _spectra(net, x, "exact", device="cpu")["output"]
    cpu_bf16 = _spectra(net, x, "exact", device="cpu", precision="bf16")["output"]
    with simulated_cuda() as cuda:
        for precision in ("tf32", "bf16"):
            got = _spectra(net, x, "exact", device=cuda, precision=precision)["output"]
            assert got.shape == (3, 12) and torch.isfinite(got).all()
        net.cpu()
    # bf16 on CUDA computes in bfloat16 (CPU autocast's casts): off fp32 by bfloat16's rounding
    # as the CPU's bf16 is, not by float32's (autocast ignored, the break, gives 1e-7)
    rel = float(((got - fp32).abs() / fp32.abs()).max())
    cpu_rel = float(((cpu_bf16 - fp32).abs() / fp32.abs()).max())
    assert 1e-4 < rel < 0.05 and 1e-4 < cpu_rel < 0.05


# --- training loops ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run", ["barlow_twins", "vicreg", "dino", "simclr", "clip", "mae", "simmim"]
)
def test_each_zoo_objective_trains_on_cuda(run):
    from repdiag.encoders.zoo.spec import run_spec
    from repdiag.encoders.zoo.train import train

    spec = {**run_spec(tiny_config(), run), "steps": 2, "batch_size": 4}
    if run == "simclr":  # the JER regulariser rides on one objective: it is the backbone's
        spec["jer_regulariser"] = {"weight": 0.1, "images": 2, "probes": 2}
    with simulated_cuda() as cuda:
        result = train(spec, cuda)
    assert result.meta["device"] == "cuda:0" and len(result.losses) == 2
    assert all(np.isfinite(result.losses))
    assert all(p.device.type == "cpu" for p in result.backbone.parameters())
    if run == "simclr":
        assert np.isfinite(result.meta["jer_regulariser"]["estimate_first"])


@pytest.mark.parametrize("run", ["barlow_twins", "dino", "clip", "mae", "supervised"])
def test_a_zoo_training_step_never_waits_for_the_device(run):
    """Losses stay on the device (read in blocks by LossLog); augmentation decisions are drawn
    on the host. A known break, a loss read every step, is seen."""
    from repdiag.encoders.zoo import train as training
    from repdiag.encoders.zoo.spec import run_spec

    spec = {**run_spec(tiny_config(), run), "batch_size": 4}
    with simulated_cuda() as cuda:
        objective = training.build_objective(spec, cuda)[0]
        optimizer = training.make_optimizer(objective, spec)
        gen = torch.Generator().manual_seed(0)
        training.train_step(objective, optimizer, spec, 0, gen)
        reads = simulated_memory().host_reads
        reads.clear()
        loss = training.train_step(objective, optimizer, spec, 1, gen)
        assert dict(reads) == {}
        float(loss)
        assert sum(reads.values()) == 1


def test_a_zoo_run_reads_its_losses_once_per_block_of_steps():
    """At most one synchronisation per step: over 25 more steps the run waits once more."""
    from repdiag.encoders.zoo.spec import run_spec
    from repdiag.encoders.zoo.train import READ_EVERY, train

    waits = {}
    for steps in (2, 2 + READ_EVERY):
        spec = {**run_spec(tiny_config(), "simclr"), "steps": steps, "batch_size": 4}
        with simulated_cuda() as cuda:
            train(spec, cuda)
            waits[steps] = sum(simulated_memory().host_reads.values())
    assert waits[2 + READ_EVERY] - waits[2] == 1


def test_the_supervised_zoo_run_on_cuda_trains_as_on_the_cpu():
    from repdiag.encoders.zoo.spec import run_spec
    from repdiag.encoders.zoo.train import train

    spec = {**run_spec(tiny_config(), "supervised"), "steps": 2, "batch_size": 4}
    spec["jer_regulariser"] = {"weight": 0.1, "images": 2, "probes": 2}
    cpu = train(spec, "cpu")
    with simulated_cuda() as cuda:
        got = train(spec, cuda)
    assert got.losses == pytest.approx(cpu.losses, rel=1e-4)


def test_the_cifar_loop_and_its_features_on_cuda():
    from repdiag.cifar.data import synthetic_images
    from repdiag.cifar.encoders import build_simclr_model
    from repdiag.cifar.train import SimCLRSettings, extract_features, train_simclr
    from repdiag.cifar.views import to_chw_tensor, view_transform
    from repdiag.core.config import fill_defaults

    images = to_chw_tensor(synthetic_images(4, 4, 32, seed=0).images)
    augment = fill_defaults({"cifar": {}})["cifar"]["augment"]
    view = view_transform("no_crop", augment, 32, (0.5,) * 3, (0.25,) * 3)
    settings = SimCLRSettings.from_config(
        dict(epochs=2, batch_size=8, lr=1e-2, warmup_epochs=0, log_every=1)
    )
    torch.manual_seed(0)
    model = build_simclr_model("mlp", {"hidden": [32]}, 16, 16, 8, 32)
    with simulated_cuda() as cuda:
        result = train_simclr(model, images, view, settings, seed=0, device=cuda)
        features = extract_features(model.encoder, images, view, device=cuda, batch_size=1024)
    assert len(result.curve) == 4 and all(np.isfinite(loss) for _, loss, _ in result.curve)
    assert features.shape[0] == len(images) and np.isfinite(features).all()


def test_the_identifiability_loop_on_cuda_matches_the_cpu():
    from repdiag.identifiability.encoders import build_latent_encoder
    from repdiag.identifiability.sphere import build_generator
    from repdiag.identifiability.train import encode_latents, train_contrastive
    from tests.identifiability.conftest import contrastive, latent_encoder

    settings = contrastive(steps=4, batch_size=16, n_negatives=16, log_every=2)
    z = np.random.default_rng(1).normal(size=(8, 3))
    z /= np.linalg.norm(z, axis=1, keepdims=True)

    def run(device: Any) -> tuple[list, np.ndarray]:
        g = build_generator("identity", 3, 0)
        f = build_latent_encoder(latent_encoder(hidden=(16,)), g, seed=0)
        curve = train_contrastive(f, g, settings, seed=0, device=device).curve
        return curve, encode_latents(f, g, z, device)

    cpu_curve, cpu_h = run("cpu")
    with simulated_cuda() as cuda:
        curve, h = run(cuda)
    np.testing.assert_allclose(np.array(curve), np.array(cpu_curve), rtol=1e-4)
    np.testing.assert_allclose(h, cpu_h, rtol=1e-4, atol=1e-6)
