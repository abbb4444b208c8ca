"""Progress display for runs: a tqdm bar on a terminal, periodic one-line reports otherwise.

    bar = Progress(total=200, initial=0, desc="fedcanon")
    bar.update(t, metrics)   # after each round: round counter, f+h, accuracy, ETA
    bar.close()

On a terminal (stderr is a TTY) the bar shows rounds, ``f+h``, test accuracy and tqdm's ETA.
When stderr is redirected (batch jobs, CI, subprocess tests) a plain line is printed roughly
every 10 % of the run, so logs stay short and readable. ``enabled=False`` prints nothing.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Optional

__all__ = ["Progress"]


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    return str(v)


class Progress:
    def __init__(self, total: int, initial: int = 0, desc: str = "", enabled: bool = True, stream=None):
        self.total, self.desc, self.enabled = int(total), desc, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.start_round, self.t0 = int(initial), time.perf_counter()
        self.last = {}
        self.bar = None
        self._next_line = initial
        if not enabled:
            return
        if getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm.auto import tqdm
            except ImportError:  # plain lines instead
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=self.total, initial=initial, desc=desc, unit="round", file=self.stream,
                                dynamic_ncols=True, leave=True)
        self._every = max(1, self.total // 10)

    def update(self, t: int, metrics: dict) -> None:
        for k in ("f+h", "test_acc", "train_acc"):
            if metrics.get(k) is not None:
                self.last[k] = metrics[k]
        if not self.enabled:
            return
        post = {"f+h": _fmt(self.last.get("f+h"))}
        acc = self.last.get("test_acc", self.last.get("train_acc"))
        if acc is not None:
            post["acc"] = _fmt(acc)
        if self.bar is not None:
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(t - self.bar.n)
            return
        if t >= self._next_line or t == self.total:
            self._next_line = t + self._every
            done = t - self.start_round
            spent = time.perf_counter() - self.t0
            eta = spent / done * (self.total - t) if done > 0 else float("nan")
            fields = "  ".join(f"{k}={v}" for k, v in post.items())
            print(f"{self.desc} round {t}/{self.total}  {fields}  elapsed {spent:.1f}s  ETA {eta:.1f}s",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def human_time(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds:.2f}s" if seconds < 120 else f"{seconds / 60:.1f}min"
