"""Tests for python_algos.experiments.models: parameter counts, shapes, registry, gradients."""

import pytest
import torch
from torch import nn

from python_algos.experiments.models import (
    CNN,
    MLP,
    MODELS,
    LinearModel,
    SigmoidNet,
    build_model,
    count_parameters,
    resnet18,
    resnet34,
    resnet50,
    resnet101,
)

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
SMALL = ["linear", "mlp", "cnn", "sigmoid_net"]
# A 1-channel 7x7 stem has 64 * (3 - 1) * 49 fewer weights than a 3-channel one.
STEM_DIFF = 64 * 2 * 49


@pytest.fixture
def no_init(monkeypatch):
    """Skip weight initialisation so that big ResNets build in milliseconds.

    Only the parameter *count* is checked with this fixture; the tensors hold
    uninitialised memory.  (Building on the meta device would also work, but
    its first use costs ~2 s of one-off set-up.)
    """
    noop = lambda *args, **kwargs: None  # noqa: E731
    monkeypatch.setattr(nn.Conv2d, "reset_parameters", noop)
    monkeypatch.setattr(nn.Linear, "reset_parameters", noop)
    monkeypatch.setattr(nn.init, "kaiming_normal_", noop)


# ----------------------------------------------------------------- counts


def test_small_model_parameter_counts():
    assert count_parameters(LinearModel(784, 10)) == 7_850
    assert count_parameters(MLP()) == 109_386
    assert count_parameters(CNN()) == 268_362
    assert count_parameters(SigmoidNet(784, hidden=64)) == 784 * 64 + 64 + 64 * 10 + 10
    # same models through the registry with MNIST defaults
    assert count_parameters(build_model("linear")) == 7_850
    assert count_parameters(build_model("mlp")) == 109_386
    assert count_parameters(build_model("cnn")) == 268_362


@pytest.mark.parametrize(
    "fn, in_channels, expected",
    [
        (resnet18, 1, 11_175_370),
        (resnet18, 3, 11_175_370 + STEM_DIFF),
        (resnet34, 3, 21_289_802),
        (resnet34, 1, 21_289_802 - STEM_DIFF),
        (resnet50, 3, 23_528_522),
        (resnet50, 1, 23_528_522 - STEM_DIFF),
        (resnet101, 3, 42_520_650),
        (resnet101, 1, 42_520_650 - STEM_DIFF),
    ],
)
def test_resnet_parameter_counts(no_init, fn, in_channels, expected):
    assert count_parameters(fn(in_channels=in_channels, num_classes=10)) == expected


def test_registry_resnet_uses_in_channels(no_init):
    assert count_parameters(build_model("resnet18", MNIST)) == 11_175_370
    assert count_parameters(build_model("resnet34", CIFAR)) == 21_289_802


def test_count_parameters_trainable_only():
    m = MLP()
    m.net[0].weight.requires_grad_(False)
    assert count_parameters(m) == 109_386
    assert count_parameters(m, trainable_only=True) == 109_386 - 784 * 128


# ----------------------------------------------------------------- shapes


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("shape", [MNIST, CIFAR])
def test_small_models_forward_shape(name, shape):
    model = build_model(name, shape, num_classes=10)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 10)


@pytest.mark.parametrize("name", ["linear", "mlp", "sigmoid_net"])
def test_flat_models_accept_flat_input(name):
    model = build_model(name, (784,), num_classes=7)
    assert model(torch.randn(5, 784)).shape == (5, 7)
    assert model(torch.randn(5, *MNIST)).shape == (5, 7)
    assert count_parameters(build_model(name, 784)) == count_parameters(build_model(name, MNIST))


def test_linear_binary_is_scalar():
    model = LinearModel(20, num_classes=1)
    assert count_parameters(model) == 21
    assert model(torch.randn(6, 20)).shape == (6,)


@pytest.mark.parametrize("name", SMALL)
def test_every_model_with_one_output_returns_a_vector(name):
    # (N, 1) against (N,) targets would broadcast to (N, N) in BCE / MSE and in an accuracy count.
    shape = (1, 12, 12) if name == "cnn" else (20,)
    model = build_model(name, shape, num_classes=1)
    x, y = torch.randn(6, *shape), torch.randint(0, 2, (6,)).double()
    out = model(x)
    assert out.shape == (6,)
    loss = nn.functional.binary_cross_entropy_with_logits(out, y.to(out.dtype))
    by_hand = torch.stack([nn.functional.binary_cross_entropy_with_logits(model(x[i:i + 1]).reshape(()),
                                                                          y[i].to(out.dtype)) for i in range(6)]).mean()
    torch.testing.assert_close(loss, by_hand)


def test_binary_data_trains_every_small_model_from_the_cli(tmp_path):
    from python_algos.experiments.cli import main

    for name in ("mlp", "sigmoid_net"):
        out = tmp_path / name
        assert main(["run", "-a", "fedavg", "--dataset", "sparse_logistic", "--model", name, "-N", "3", "-T", "2",
                     "-K", "2", "--out", str(out), "--no-progress", "--no-plot"]) == 0
        assert (out / "summary.json").exists()


def test_cnn_input_size_sets_flatten():
    assert CNN().flat_features == 32 * 8 * 8
    cifar = CNN(in_channels=3, input_size=32)
    assert cifar.flat_features == 32 * 9 * 9
    assert cifar(torch.randn(2, *CIFAR)).shape == (2, 10)
    rect = CNN(input_size=(28, 20), num_classes=4)
    assert rect(torch.randn(2, 1, 28, 20)).shape == (2, 4)


def test_resnet18_tiny_forward():
    torch.manual_seed(0)
    model = build_model("resnet18", MNIST)
    out = model(torch.randn(2, *MNIST))
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()


# ----------------------------------------------------------------- registry


def test_registry_names():
    assert set(MODELS) == {
        "linear", "mlp", "cnn", "sigmoid_net",
        "resnet18", "resnet34", "resnet50", "resnet101",
    }


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as exc:
        build_model("vgg16")
    msg = str(exc.value)
    assert "vgg16" in msg
    for name in MODELS:
        assert name in msg


def test_image_model_rejects_flat_shape():
    with pytest.raises(ValueError):
        build_model("cnn", (784,))
    with pytest.raises(ValueError):
        build_model("resnet18", (784,))


def test_kwargs_forwarded():
    assert count_parameters(build_model("mlp", hidden=(32,))) == 784 * 32 + 32 + 32 * 10 + 10
    assert count_parameters(build_model("sigmoid_net", hidden=16)) == 784 * 16 + 16 + 16 * 10 + 10


# ----------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", SMALL)
def test_backward_gives_grads_for_all_params(name):
    torch.manual_seed(0)
    model = build_model(name, MNIST)
    x = torch.randn(4, *MNIST)
    y = torch.randint(0, 10, (4,))
    nn.functional.cross_entropy(model(x), y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname
