"""The ServerApp: the algorithm's server program; writes result.pt to the run config's result-dir.

With ``checkpoint`` set, the server writes its checkpoint there after every round; a run stopped by
a failed node continues from it with ``--run-config "resume=true"`` (every SuperNode started with
``state-dir`` in its node config, where it keeps its own state).
"""

from flwr.serverapp import ServerApp

from python_algos.deploy.flower import checkpoint_to_resume, run_server, save_result, write_error

from . import task

app = ServerApp()


@app.main()
def main(grid, context) -> None:
    cfg = context.run_config
    path = str(cfg["checkpoint"]) or None
    resume = checkpoint_to_resume(path, bool(cfg["resume"]))  # resume=true with no checkpoint there: refused
    try:
        result = run_server(grid, task.algorithm(cfg), task.model_fn(cfg), round_timeout=float(cfg["round-timeout"]),
                            checkpoint=path, resume=resume, **task.settings(cfg))
    except Exception as e:
        if cfg["result-dir"]:
            write_error(str(cfg["result-dir"]), e)
        raise
    if cfg["result-dir"]:
        save_result(result, str(cfg["result-dir"]))
    print(f"final model: {result.params.tolist()}")
