"""The ServerApp: the algorithm's server program; writes result.pt to the run config's result-dir."""

import os

import torch
from flwr.serverapp import ServerApp

from python_algos.deploy.flower import run_server, save_result

from . import task

app = ServerApp()


@app.main()
def main(grid, context) -> None:
    cfg = context.run_config
    result = run_server(grid, task.algorithm(cfg), task.model_fn(cfg), round_timeout=float(cfg["round-timeout"]),
                        **task.settings(cfg))
    if cfg["result-dir"]:
        save_result(result, str(cfg["result-dir"]))
    print(f"final model: {result.params.tolist()}")
