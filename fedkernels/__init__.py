"""fedkernels: fused C++/CUDA proximal and federated-update kernels on flat parameter buffers.

    import fedkernels as fk
    reg = fk.SCAD(lam=1e-3)
    reg.prox_(flat_params, step=0.1)             # one fused kernel over the whole model
    fk.fused.prox_grad_step_(z, dbar, 0.1, reg, 0.1, fast=True)   # FedCanon server step

Layers: ``fk.raw`` (validated, low-overhead kernel calls), ``fk.ops`` (the same as registered
torch ops, for torch.compile), regularizer objects (``fk.L1`` ... ``fk.L2Ball``, ``fk.GroupLasso``;
``fk.PerParameter`` for one penalty per parameter), ``fk.fused``
(regularizer-aware fused updates), ``fk.FlatParams`` (a model as one vector), ``fk.optim``
(``ProxSGD``, ``Proximal``: torch.optim-style proximal optimizers).
"""

import importlib.metadata as _metadata

from . import first_layer, fused, ops, optim, raw
from ._backend import backend_info, emulate_cuda, get_num_threads, max_num_threads, set_num_threads
from ._validate import ParameterError, ParameterTypeError
from .flat import FlatParams
from .per_parameter import PerParameter
from .profiling import ProxStats, prox_stats
from .regularizers import (
    L1,
    MCP,
    SCAD,
    Box,
    ElasticNet,
    GroupLasso,
    L2Ball,
    NonNeg,
    Regularizer,
    RegularizerEntry,
    Scaled,
    Zero,
    make_regularizer,
    register_regularizer,
)

try:  # one source: the installed package's metadata, i.e. pyproject.toml's version
    __version__ = _metadata.version("fedkernels")
except _metadata.PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "unknown"

__all__ = [
    "backend_info",
    "ParameterError",
    "ParameterTypeError",
    "set_num_threads",
    "get_num_threads",
    "max_num_threads",
    "emulate_cuda",
    "raw",
    "ops",
    "first_layer",
    "fused",
    "optim",
    "FlatParams",
    "prox_stats",
    "ProxStats",
    "Regularizer",
    "Zero",
    "L1",
    "ElasticNet",
    "MCP",
    "SCAD",
    "Box",
    "NonNeg",
    "L2Ball",
    "GroupLasso",
    "Scaled",
    "PerParameter",
    "RegularizerEntry",
    "make_regularizer",
    "register_regularizer",
]
