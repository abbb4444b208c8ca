"""Model definitions used by the fedkernels experiments.

Every model is plain ``torch.nn`` code written in this file (no torchvision).
Image models take ``(N, C, H, W)`` tensors; the fully connected models
(``LinearModel``, ``MLP``, ``SigmoidNet``) flatten whatever they receive, so
they accept both ``(N, 1, 28, 28)`` and ``(N, 784)``.

Parameter counts with the default 10 classes (checked in ``tests/test_models.py``):

=====================  ===============  ============
model                  input            parameters
=====================  ===============  ============
LinearModel            1x28x28 (784)         7,850
MLP (128, 64)          1x28x28 (784)       109,386
CNN                    1x28x28             268,362
ResNet-18              1x28x28          11,175,370
ResNet-18              3x32x32          11,181,642
ResNet-34              3x32x32          21,289,802
ResNet-50              3x32x32          23,528,522
ResNet-101             3x32x32          42,520,650
=====================  ===============  ============

A ResNet's count does not depend on H and W (adaptive average pooling).
A 1-channel stem has 64 * 2 * 49 = 6,272 fewer parameters than a 3-channel one.

Use ``build_model(name, in_shape, num_classes)`` to build a model by name
for a given input shape; ``MODELS`` lists the names.
"""

from __future__ import annotations

import json
import math
from typing import Callable, Dict, Sequence, Tuple, Type, Union

import torch
from torch import nn

__all__ = [
    "LinearModel",
    "MLP",
    "SigmoidNet",
    "CNN",
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "MODELS",
    "MODEL_OPTIONS",
    "build_model",
    "check_model_options",
    "ModelOptionError",
    "count_parameters",
]

SizeLike = Union[int, Tuple[int, int]]


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters in ``model`` (buffers such as BN running stats excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _pair(size: SizeLike) -> Tuple[int, int]:
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def _one_output_as_vector(out: torch.Tensor) -> torch.Tensor:
    """A model with a single output returns shape ``(N,)``: the shape of binary-logistic and scalar
    regression targets. ``(N, 1)`` would broadcast against ``(N,)`` targets in a loss or an accuracy
    into an ``(N, N)`` table, silently."""
    return out.squeeze(-1) if out.shape[-1] == 1 else out


# --------------------------------------------------------------------------- #
# Fully connected models
# --------------------------------------------------------------------------- #


class LinearModel(nn.Module):
    """Linear / logistic regression: one ``nn.Linear`` on the flattened input.

    Used for the convex baselines (multinomial logistic regression on MNIST:
    784 * 10 + 10 = 7,850 parameters).  With ``num_classes=1`` the model is a
    binary logistic (or scalar linear) regressor and returns shape ``(N,)``,
    ready for ``BCEWithLogitsLoss`` / ``MSELoss`` against ``(N,)`` targets.
    """

    def __init__(self, in_features: int = 784, num_classes: int = 10):
        super().__init__()
        self.in_features = in_features
        self.num_classes = num_classes
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _one_output_as_vector(self.linear(torch.flatten(x, 1)))


class MLP(nn.Module):
    """Multi-layer perceptron with ReLU: ``in -> 128 -> 64 -> classes`` by default.

    The usual "MLP on MNIST" of the federated-learning literature:
    (784*128+128) + (128*64+64) + (64*10+10) = 109,386 parameters.
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden: Sequence[int] = (128, 64),
        num_classes: int = 10,
    ):
        super().__init__()
        layers = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _one_output_as_vector(self.net(torch.flatten(x, 1)))


class SigmoidNet(nn.Module):
    """One-hidden-layer network with sigmoid activation: ``in -> hidden -> classes``.

    The smooth non-convex model of the FedNMap experiments (normal-map
    composite federated learning).  The hidden width is configurable; the
    default of 64 is this project's choice, not a value taken from the paper.
    With ``hidden=64`` on MNIST: 784*64+64 + 64*10+10 = 50,890 parameters.
    """

    def __init__(self, in_features: int = 784, hidden: int = 64, num_classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.Sigmoid()
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _one_output_as_vector(self.fc2(self.act(self.fc1(torch.flatten(x, 1)))))


# --------------------------------------------------------------------------- #
# Small CNN
# --------------------------------------------------------------------------- #


class CNN(nn.Module):
    """Two conv blocks (conv + ReLU + max-pool) followed by two linear layers.

    The "CNN on MNIST" of the FedCanon experiments.  The paper only gives the
    layer types, so the sizes below were chosen to give its 268,362
    parameters with common settings::

        conv 3x3, 1 -> 16, padding 1   28x28 -> 28x28        160 params
        ReLU, max-pool 2x2 s2 pad 1    28x28 -> 15x15
        conv 3x3, 16 -> 32, padding 1  15x15 -> 15x15      4,640 params
        ReLU, max-pool 2x2 s2 pad 1    15x15 -> 8x8
        flatten                        32*8*8 = 2048
        linear 2048 -> 128, ReLU                         262,272 params
        linear 128 -> 10                                   1,290 params
                                                 total   268,362

    The padded pooling is ``MaxPool2d(2, 2, padding=1)``, the same as in the
    FedProx MNIST CNN.  Set ``input_size`` (and ``in_channels``) for other
    shapes; the flatten size comes from it, e.g. CIFAR-10
    (``in_channels=3, input_size=32``): 32 -> 17 -> 9, flatten 32*9*9 = 2592.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        input_size: SizeLike = 28,
        channels: Tuple[int, int] = (16, 32),
        kernel_size: int = 3,
        padding: int = 1,
        pool_padding: int = 1,
        hidden: int = 128,
    ):
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, 2, padding=pool_padding),
            nn.Conv2d(c1, c2, kernel_size, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, 2, padding=pool_padding),
        )
        h, w = _pair(input_size)
        for _ in range(2):
            h, w = h + 2 * padding - kernel_size + 1, w + 2 * padding - kernel_size + 1  # conv
            h, w = (h + 2 * pool_padding - 2) // 2 + 1, (w + 2 * pool_padding - 2) // 2 + 1  # pool
        if h < 1 or w < 1:
            raise ValueError(f"input_size {input_size} is too small for CNN")
        self.flat_features = c2 * h * w
        self.classifier = nn.Sequential(
            nn.Linear(self.flat_features, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _one_output_as_vector(self.classifier(torch.flatten(self.features(x), 1)))


# --------------------------------------------------------------------------- #
# ResNets (He et al., 2016), torchvision layout
# --------------------------------------------------------------------------- #


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with BN; the residual block of ResNet-18/34."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 -> 3x3 -> 1x1 convs with BN (stride on the 3x3, the "v1.5" form); ResNet-50/101."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet with the ImageNet layout, written to match torchvision's parameter layout.

    Stem: 7x7 stride-2 conv (no bias) + BN + ReLU + 3x3 stride-2 max-pool;
    then four stages (64, 128, 256, 512 planes, stride 1/2/2/2), adaptive
    average pooling to 1x1 and a linear classifier.  ``in_channels`` sets
    the stem's input channels (1 for MNIST, 3 for CIFAR).  The stem is kept
    unchanged for small images: a 28x28 input reaches the last stage
    as 1x1.
    """

    def __init__(
        self,
        block: Type[Union[BasicBlock, Bottleneck]],
        layers: Sequence[int],
        in_channels: int = 1,
        num_classes: int = 10,
        zero_init_residual: bool = False,
    ):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)
                elif isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return _one_output_as_vector(self.fc(torch.flatten(self.avgpool(x), 1)))


def resnet18(in_channels: int = 1, num_classes: int = 10, **kw) -> ResNet:
    """ResNet-18: BasicBlock x [2, 2, 2, 2] (11,175,370 params for 1 channel / 10 classes)."""
    return ResNet(BasicBlock, [2, 2, 2, 2], in_channels, num_classes, **kw)


def resnet34(in_channels: int = 1, num_classes: int = 10, **kw) -> ResNet:
    """ResNet-34: BasicBlock x [3, 4, 6, 3] (21,289,802 params for 3 channels / 10 classes)."""
    return ResNet(BasicBlock, [3, 4, 6, 3], in_channels, num_classes, **kw)


def resnet50(in_channels: int = 1, num_classes: int = 10, **kw) -> ResNet:
    """ResNet-50: Bottleneck x [3, 4, 6, 3] (23,528,522 params for 3 channels / 10 classes)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], in_channels, num_classes, **kw)


def resnet101(in_channels: int = 1, num_classes: int = 10, **kw) -> ResNet:
    """ResNet-101: Bottleneck x [3, 4, 23, 3] (42,520,650 params for 3 channels / 10 classes)."""
    return ResNet(Bottleneck, [3, 4, 23, 3], in_channels, num_classes, **kw)


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #

Shape = Tuple[int, ...]


def _features(in_shape: Shape) -> int:
    return int(math.prod(in_shape))


def _image_shape(name: str, in_shape: Shape) -> Tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ValueError(f"model {name!r} needs an image shape (C, H, W), got {tuple(in_shape)}")
    c, h, w = (int(v) for v in in_shape)
    return c, h, w


def _build_linear(in_shape: Shape, num_classes: int, **kw) -> nn.Module:
    return LinearModel(_features(in_shape), num_classes, **kw)


def _build_mlp(in_shape: Shape, num_classes: int, **kw) -> nn.Module:
    if isinstance(kw.get("hidden"), int):  # hidden=64: one hidden layer (the option's check allows it)
        kw["hidden"] = (kw["hidden"],)
    return MLP(_features(in_shape), num_classes=num_classes, **kw)


def _build_sigmoid_net(in_shape: Shape, num_classes: int, **kw) -> nn.Module:
    return SigmoidNet(_features(in_shape), num_classes=num_classes, **kw)


def _build_cnn(in_shape: Shape, num_classes: int, **kw) -> nn.Module:
    c, h, w = _image_shape("cnn", in_shape)
    return CNN(in_channels=c, num_classes=num_classes, input_size=(h, w), **kw)


def _resnet_factory(name: str, fn: Callable[..., ResNet]) -> Callable[..., nn.Module]:
    def build(in_shape: Shape, num_classes: int, **kw) -> nn.Module:
        c, _, _ = _image_shape(name, in_shape)
        return fn(in_channels=c, num_classes=num_classes, **kw)

    build.__name__ = f"_build_{name}"
    build.__doc__ = f"Build {name} for input shape (C, H, W)."
    return build


#: name -> factory(in_shape, num_classes, **kw) returning an ``nn.Module``.
MODELS: Dict[str, Callable[..., nn.Module]] = {
    "linear": _build_linear,
    "mlp": _build_mlp,
    "cnn": _build_cnn,
    "sigmoid_net": _build_sigmoid_net,
    "resnet18": _resnet_factory("resnet18", resnet18),
    "resnet34": _resnet_factory("resnet34", resnet34),
    "resnet50": _resnet_factory("resnet50", resnet50),
    "resnet101": _resnet_factory("resnet101", resnet101),
}


def build_model(
    name: str,
    in_shape: Union[int, Sequence[int]] = (1, 28, 28),
    num_classes: int = 10,
    **kw,
) -> nn.Module:
    """Build the model ``name`` for inputs of shape ``in_shape`` (without the batch dim).

    ``in_shape`` is ``(C, H, W)`` for images or ``(features,)`` (or an int)
    for flat data; the fully connected models accept either and use the
    product of the dimensions.  Extra keyword arguments are the model's
    options, listed in ``MODEL_OPTIONS`` (e.g. ``hidden=`` for
    ``mlp``/``sigmoid_net``/``cnn``); a name the model does not take or a
    value of the wrong type raises ValueError naming the option.
    """
    key = name.lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}")
    check_model_options(key, kw)
    shape = (int(in_shape),) if isinstance(in_shape, int) else tuple(int(v) for v in in_shape)
    if not shape or any(v < 1 for v in shape):
        raise ValueError(f"invalid in_shape {in_shape!r}")
    return MODELS[key](shape, num_classes, **kw)


# --------------------------------------------------------------------------- #
# Model options (``--model-opt`` / ``model_opts`` / build_model's keywords)
# --------------------------------------------------------------------------- #
# Each model's options and the rule of each value, checked before a constructor sees them: a wrong
# name or type would otherwise surface as torch's own error ("empty(): argument 'size' must be
# tuple of ints") or a constructor's TypeError, neither of which names the option.
# The shape options (in_features, in_channels, input_size, num_classes) are not options: they
# come from the data (build_model's ``in_shape`` and ``num_classes``).


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(v) -> bool:
    return _is_int(v) and v >= 1


def _int_list(v) -> bool:
    return isinstance(v, (list, tuple)) and all(_positive_int(h) for h in v)


_RULES = {
    "int>=1": (_positive_int, "must be an int >= 1"),
    "int>=0": (lambda v: _is_int(v) and v >= 0, "must be an int >= 0"),
    "layers": (lambda v: _positive_int(v) or _int_list(v),
               "must be an int or a list of ints, each >= 1 (the hidden layers' widths)"),
    "pair": (lambda v: _int_list(v) and len(v) == 2, "must be a list of two ints >= 1"),
    "pool_padding": (lambda v: _is_int(v) and v in (0, 1), "must be 0 or 1 (the 2x2 max-pool's padding)"),
    "bool": (lambda v: isinstance(v, bool), "must be true or false"),
}

_RESNET_OPTIONS = {"zero_init_residual": "bool"}

#: model name -> {option: rule}; the options each model takes.
MODEL_OPTIONS: Dict[str, Dict[str, str]] = {
    "linear": {},
    "mlp": {"hidden": "layers"},
    "cnn": {"channels": "pair", "kernel_size": "int>=1", "padding": "int>=0", "pool_padding": "pool_padding",
            "hidden": "int>=1"},
    "sigmoid_net": {"hidden": "int>=1"},
    "resnet18": _RESNET_OPTIONS,
    "resnet34": _RESNET_OPTIONS,
    "resnet50": _RESNET_OPTIONS,
    "resnet101": _RESNET_OPTIONS,
}


class ModelOptionError(ValueError):
    """A model option that the model does not take, or a value that breaks its rule; ``options``
    are the names at fault (the command line shows them as ``--model-opt NAME=VALUE``)."""

    def __init__(self, message: str, options: Sequence[str] = ()):  # default: unpickling passes the message alone
        super().__init__(message)
        self.options = tuple(options)


def check_model_options(name: str, opts: dict) -> None:
    """Raise :class:`ModelOptionError` (a ValueError) naming the option if ``opts`` has one that model
    ``name`` does not take, or a value of the wrong type or range."""
    key = name.lower()
    options = MODEL_OPTIONS[key]
    unknown = [k for k in opts if k not in options]
    if unknown:
        if not options:
            raise ModelOptionError(f"model {key!r} takes no options (got {', '.join(map(str, unknown))})", unknown)
        raise ModelOptionError(f"model {key!r} has no option(s) {', '.join(map(str, unknown))}; its options: "
                               f"{', '.join(options)}", unknown)
    for k, v in opts.items():
        ok, rule = _RULES[options[k]]
        if not ok(v):
            shown = repr(v) if isinstance(v, str) else json.dumps(v) if _jsonable(v) else repr(v)
            raise ModelOptionError(f"model {key!r}: {k} {rule}, got {shown}", [k])


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
