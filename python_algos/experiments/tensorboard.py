"""TensorBoard events of run folders (``--tensorboard``; needs ``pip install tensorboard``).

    write_events("results/my-run")       # -> results/my-run/tensorboard/events.out.tfevents.*
    tensorboard --logdir results/my-sweep   # every run (seed, grid point) is one TensorBoard run

The events are written from the run's ``metrics.jsonl`` when a run ends (completed, diverged or
interrupted), with :class:`torch.utils.tensorboard.SummaryWriter`: every numeric metric of every
round (step = round) under its own tag, e.g. ``objective/f+h``, ``objective/h`` (the regularizer's
value), ``model/sparsity`` (the fraction of exact zeros in the model), ``stationarity/grad_map_sq``,
``accuracy/test_acc``, ``time/elapsed``. The folder's events are replaced each time, so a run
resumed from a checkpoint shows each round once (the rows past the checkpoint that the resume
dropped are gone from TensorBoard too).
"""

from __future__ import annotations

import math
import os
import shutil

from ..runfolder.files import read_metrics

__all__ = ["write_events", "check_available", "EVENTS_DIR", "tag_of"]

EVENTS_DIR = "tensorboard"
_GROUPS = {"f": "objective", "h": "objective", "f+h": "objective", "sparsity": "model", "hoyer": "model",
           "nnz": "model", "grad_map_sq": "stationarity", "normal_map_sq": "stationarity", "test_acc": "accuracy",
           "train_acc": "accuracy", "test_loss": "loss", "train_loss": "loss", "elapsed": "time"}


def check_available() -> None:
    """Raise a RuntimeError naming the install command when tensorboard is missing (before any run)."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise RuntimeError("--tensorboard needs the tensorboard package: pip install tensorboard "
                           "(or fedkernels[tensorboard])") from None


def tag_of(key: str) -> str:
    """The TensorBoard tag of metric ``key`` (grouped into sections: objective, model, accuracy, ...)."""
    return f"{_GROUPS.get(key, 'metrics')}/{key}"


def write_events(run_dir: str) -> str:
    """(Re)write ``run_dir/tensorboard/`` from ``run_dir/metrics.jsonl``; returns the events folder."""
    check_available()
    from torch.utils.tensorboard import SummaryWriter

    rows = read_metrics(run_dir)
    out = os.path.join(run_dir, EVENTS_DIR)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    w = SummaryWriter(log_dir=tmp)
    try:
        for r in rows:
            t = r.get("round")
            if not isinstance(t, int):
                continue
            for k, v in r.items():
                if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    w.add_scalar(tag_of(k), float(v), global_step=t)
    finally:
        w.close()
    shutil.rmtree(out, ignore_errors=True)  # replace the previous events with the complete new ones
    os.replace(tmp, out)
    return out
