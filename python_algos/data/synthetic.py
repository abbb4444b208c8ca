"""Built-in data generators: no files, no downloads, seeded and reproducible.

* :func:`fedprox_synthetic` — FedProx's synthetic(alpha, beta) heterogeneous multinomial logistic
  data (Li et al., "Federated Optimization in Heterogeneous Networks", 2020, §5.1; used by ZA1).
* :func:`sparse_regression` — linear or logistic regression with a known sparse ground truth
  ``x_true``, optionally with per-client feature shift (natural heterogeneity).
* :func:`image_like` — a small image-shaped classification task (class prototypes with several
  modes each, plus noise), a stand-in for MNIST-like data in tests, demos and examples.

All return numpy-free torch tensors: float32 features, int64 class labels (float32 targets for
linear regression), and int64 ``groups`` (the client/writer each sample was generated for) where
the generator has a natural client structure.
"""

from __future__ import annotations

from typing import Annotated, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .options import COUNT, Opt

__all__ = ["fedprox_synthetic", "sparse_regression", "image_like"]


def fedprox_synthetic(alpha: Annotated[float, Opt(0)] = 1.0, beta: Annotated[float, Opt(0)] = 1.0,
                      num_clients: Annotated[int, Opt(1, COUNT, "generating clients")] = 30,
                      dim: Annotated[int, Opt(1, COUNT, "features")] = 60,
                      num_classes: Annotated[int, Opt(2, COUNT)] = 10,
                      samples: Annotated[Optional[int], Opt(1, COUNT, "samples per client")] = None, iid: bool = False,
                      max_samples: Annotated[int, Opt(1, COUNT, "samples per client at most")] = 2000, seed: int = 0):
    """FedProx's synthetic(alpha, beta) data, generated as in its ``generate_synthetic.py``.

    Client k has its own model and feature distribution:
    ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` (``dim x classes``), ``b_k ~ N(u_k, 1)``;
    ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)`` (``dim``), ``x ~ N(v_k, Σ)`` with
    ``Σ = diag(j^-1.2)``, and ``y = argmax softmax(W_k^T x + b_k)``. alpha controls how much the
    local models differ, beta how much the local data differ; ``iid=True`` gives every client
    the same model and ``v_k = B_k·1`` (FedProx's synthetic_iid). (The "N(0, alpha)" of the paper
    is a normal with standard deviation alpha, as in the FedProx code.)

    Sample counts follow FedProx (``lognormal(4, 2) + 50`` per client) capped at ``max_samples``,
    unless ``samples`` fixes one count for every client.

    Returns ``(X [n, dim] float32, y [n] int64, groups [n] int64)``, groups = generating client.
    """
    if num_clients < 1 or dim < 1 or num_classes < 2:
        raise ValueError("need num_clients >= 1, dim >= 1, num_classes >= 2")
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got {alpha}, {beta}")
    rng = np.random.default_rng(seed)
    if samples is None:
        counts = np.minimum(rng.lognormal(4, 2, num_clients).astype(int) + 50, max_samples)
    else:
        counts = np.full(num_clients, int(samples))
    mean_W = rng.normal(0, alpha, num_clients)
    B = rng.normal(0, beta, num_clients)
    sd = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5  # Σ = diag(j^-1.2)
    W_glob, b_glob = rng.normal(0, 1, (dim, num_classes)), rng.normal(0, 1, num_classes)
    xs, ys, gs = [], [], []
    for k in range(num_clients):
        mean_x = np.full(dim, B[k]) if iid else rng.normal(B[k], 1, dim)
        if iid:
            W, b = W_glob, b_glob
        else:
            W, b = rng.normal(mean_W[k], 1, (dim, num_classes)), rng.normal(mean_W[k], 1, num_classes)
        x = mean_x + sd * rng.standard_normal((counts[k], dim))
        xs.append(x)
        ys.append(np.argmax(x @ W + b, axis=1))  # argmax of softmax = argmax of the logits
        gs.append(np.full(counts[k], k))
    return (torch.from_numpy(np.concatenate(xs).astype(np.float32)),
            torch.from_numpy(np.concatenate(ys).astype(np.int64)),
            torch.from_numpy(np.concatenate(gs).astype(np.int64)))


def sparse_regression(n: Annotated[int, Opt(1, COUNT, "samples")] = 1000,
                      dim: Annotated[int, Opt(1, COUNT, "features")] = 100,
                      nnz: Annotated[int, Opt(0, COUNT, "non-zeros of x_true")] = 10, task: str = "logistic",
                      noise: Annotated[float, Opt(0, what="standard deviation of the label noise")] = 0.1,
                      num_groups: Annotated[int, Opt(1, COUNT, "feature-shift groups")] = 1,
                      shift: Annotated[float, Opt(0, what="standard deviation of a group's feature shift")] = 0.0,
                      seed: int = 0):
    """Sparse linear or logistic regression with a known ground truth.

    ``x_true`` has ``nnz`` non-zeros at random coordinates, magnitudes uniform in [1, 2] with
    random signs. Features are standard normal; with ``num_groups > 1`` sample j belongs to
    group ``j mod num_groups`` and that group's features are shifted by its own mean
    ``mu_g ~ N(0, shift^2 I)`` (feature-shift heterogeneity: every group has the same
    ``x_true`` but a different f_i). Targets: ``task="linear"``: ``y = X x_true + noise·ε``
    (float32); ``task="logistic"``: ``y = 1[X x_true + noise·ε > 0]`` (int64 in {0, 1}).

    Returns ``(X [n, dim] float32, y [n], x_true [dim] float32, groups [n] int64)``.
    """
    if task not in ("linear", "logistic"):
        raise ValueError(f"task must be 'linear' or 'logistic', got {task!r}")
    if not 0 <= nnz <= dim or n < 1 or num_groups < 1:
        raise ValueError(f"need n >= 1, num_groups >= 1 and 0 <= nnz <= dim, got n={n}, nnz={nnz}, dim={dim}")
    rng = np.random.default_rng(seed)
    x_true = np.zeros(dim)
    support = rng.choice(dim, size=nnz, replace=False)
    x_true[support] = rng.uniform(1, 2, nnz) * rng.choice([-1.0, 1.0], nnz)
    groups = np.arange(n) % num_groups
    mu = rng.normal(0, shift, (num_groups, dim)) if shift > 0 else np.zeros((num_groups, dim))
    X = rng.standard_normal((n, dim)) + mu[groups]
    score = X @ x_true + noise * rng.standard_normal(n)
    if task == "linear":
        y = torch.from_numpy(score.astype(np.float32))
    else:
        y = torch.from_numpy((score > 0).astype(np.int64))
    return (torch.from_numpy(X.astype(np.float32)), y, torch.from_numpy(x_true.astype(np.float32)),
            torch.from_numpy(groups.astype(np.int64)))


def image_like(n: Annotated[int, Opt(1, COUNT, "samples")] = 2000, num_classes: Annotated[int, Opt(1, COUNT)] = 10,
               shape: Annotated[Sequence[int], Opt(1, 4096, "channels, height, width", length=3)] = (1, 12, 12),
               modes: Annotated[int, Opt(1, COUNT, "prototypes per class")] = 2,
               noise: Annotated[float, Opt(0, what="standard deviation of the pixel noise")] = 0.6, seed: int = 0):
    """A small image classification task: each class has ``modes`` smooth random prototype images;
    a sample is one of its class's prototypes (chosen at random) plus Gaussian noise.

    With ``modes > 1`` the classes are not linearly separable, so an MLP/CNN beats a linear model.
    Returns ``(X [n, *shape] float32, y [n] int64)``; labels are uniform over the classes.
    """
    c, h, w = (int(v) for v in shape)
    g = torch.Generator().manual_seed(int(seed))
    proto = torch.randn(num_classes * modes, c, h + 4, w + 4, generator=g, dtype=torch.float64)
    proto = F.avg_pool2d(proto, 5, stride=1)  # smooth: neighbouring pixels correlated
    proto = (proto - proto.mean(dim=(1, 2, 3), keepdim=True)) / proto.std(dim=(1, 2, 3), keepdim=True)
    y = torch.randint(0, num_classes, (n,), generator=g)
    mode = torch.randint(0, modes, (n,), generator=g)
    X = proto[y * modes + mode] + noise * torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    return X.float(), y
