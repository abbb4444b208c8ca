"""The options each data set takes (``--data-opt KEY=VALUE``, a config file's ``data_opts``), with
their types and bounds: declared once here, checked by :func:`check_data_options` before any data
are generated or read (``Config.check``), and used by :func:`~.datasets.load_dataset` to refuse an
unknown option. A value of the wrong type used to reach the generator and fail there
(``n=abc``: "'<' not supported between instances of 'str' and 'int'"), and a huge size to fail
allocating terabytes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Dict, Optional, Tuple

__all__ = ["Option", "DATA_OPTIONS", "MAX_VALUES", "data_options", "check_data_options"]

# The most values (samples × features) a built-in generator makes: 2**31 float64 values are 16 GiB
# while they are drawn, beyond any experiment these generators are for; a larger data set is a file.
MAX_VALUES = 2**31


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: ``kind`` int, float, bool, str or "shape" (a list of positive ints), ``lo`` /
    ``hi`` its bounds, ``none_ok`` whether null is allowed, ``what`` what it is (said in errors)."""

    kind: object
    lo: Optional[float] = None
    hi: Optional[float] = None
    none_ok: bool = False
    what: str = ""

    def rule_broken(self, name: str, v) -> Optional[str]:
        if v is None and self.none_ok:
            return None
        what = f" ({self.what})" if self.what else ""
        if self.kind is bool:
            return None if isinstance(v, bool) else f"{name} must be true or false{what}"
        if self.kind is str:
            return None if isinstance(v, str) and v else f"{name} must be a non-empty text{what}"
        if self.kind == "shape":
            ok = isinstance(v, (list, tuple)) and len(v) == 3 and all(_is_int(d) and 1 <= d <= 4096 for d in v)
            return None if ok else f"{name} must be a list of 3 integers in [1, 4096] (channels, height, width){what}"
        number = _is_int(v) if self.kind is int else (_is_real(v) and math.isfinite(v))
        kind = "an integer" if self.kind is int else "a finite number"
        if not number or (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            null = " or null" if self.none_ok else ""
            return f"{name} must be {kind} {_range(self.lo, self.hi, self.kind)}{null}{what}, got {v!r}"
        return None


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _range(lo, hi, kind) -> str:
    show = str if kind is int else "{:g}".format
    if hi is None:
        return f">= {show(lo)}"
    return f"in [{show(lo)}, {show(hi)}]"


_COUNT = 2**31 - 1  # sizes and counts: torch's and numpy's 32-bit loops
_SPARSE = {"n": Option(int, 1, _COUNT, what="samples"), "dim": Option(int, 1, _COUNT, what="features"),
           "nnz": Option(int, 0, _COUNT, what="non-zeros of x_true"),
           "noise": Option(float, 0, what="standard deviation of the label noise"),
           "num_groups": Option(int, 1, _COUNT, what="feature-shift groups"),
           "shift": Option(float, 0, what="standard deviation of a group's feature shift")}

DATA_OPTIONS: Dict[str, Dict[str, Option]] = {
    "sparse_logistic": _SPARSE,
    "sparse_linear": _SPARSE,
    "synthetic": {"alpha": Option(float, 0), "beta": Option(float, 0),
                  "num_clients": Option(int, 1, _COUNT, what="generating clients"),
                  "dim": Option(int, 1, _COUNT, what="features"), "num_classes": Option(int, 2, _COUNT),
                  "samples": Option(int, 1, _COUNT, none_ok=True, what="samples per client"),
                  "iid": Option(bool), "max_samples": Option(int, 1, _COUNT, what="samples per client at most")},
    "image_like": {"n": Option(int, 1, _COUNT, what="samples"), "num_classes": Option(int, 1, _COUNT),
                   "shape": Option("shape"), "modes": Option(int, 1, _COUNT, what="prototypes per class"),
                   "noise": Option(float, 0, what="standard deviation of the pixel noise")},
    "libsvm": {"file": Option(str), "test_file": Option(str),
               "n_features": Option(int, 1, _COUNT, none_ok=True)},
    "sklearn": {"standardize": Option(bool)},  # every sklearn:NAME
}


def data_options(dataset: str) -> Dict[str, Option]:
    """The options data set ``dataset`` takes (none for the file data sets but libsvm)."""
    key = dataset.lower().replace("-", "_")
    return DATA_OPTIONS.get("sklearn" if key.startswith("sklearn:") else key, {})


def _values(dataset: str, opts: dict) -> Optional[Tuple[str, int]]:
    """(the option that sets the size, samples × features) of a generated data set, when known."""
    key = dataset.lower()
    if key in ("sparse_logistic", "sparse_linear"):
        return "dim", opts.get("n", 1000) * opts.get("dim", 100)
    if key == "image_like":
        c, h, w = opts.get("shape", (1, 12, 12))
        return "n", opts.get("n", 2000) * c * h * w
    if key == "synthetic":
        per = opts.get("samples") or opts.get("max_samples", 2000)
        return "num_clients", opts.get("num_clients", 30) * per * opts.get("dim", 60)
    return None


def check_data_options(dataset: str, opts: dict) -> Optional[Tuple[str, str]]:
    """None, or (the option at fault, the rule it breaks) for the options ``opts`` of ``dataset``:
    each option's type and bounds, then the size of the data they would generate. An unknown
    option is :func:`~.datasets.load_dataset`'s to refuse (it names the options there are)."""
    if not isinstance(dataset, str) or not isinstance(opts, dict):
        return None  # Config.check names a bad dataset or table first
    declared = data_options(dataset)
    for k, v in opts.items():
        if k in declared:
            rule = declared[k].rule_broken(k, v)
            if rule:
                return k, rule
    size = _values(dataset, opts)
    if size is not None and size[1] > MAX_VALUES:
        key = size[0] if size[0] in opts else next(iter(opts), size[0])
        return key, (f"{dataset} would generate {size[1]:,} values ({size[1] * 8 / 2**30:,.0f} GiB while drawn), "
                     f"more than the {MAX_VALUES:,} a built-in generator makes; use fewer samples or features")
    return None
