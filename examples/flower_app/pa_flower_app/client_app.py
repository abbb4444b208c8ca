"""The ClientApp: one client node (its partition-id is the client index)."""

from flwr.clientapp import ClientApp

from python_algos.deploy.flower import handle_hello, handle_round

from . import task

app = ClientApp()


def _common(context):
    cfg = context.run_config
    s = task.settings(cfg)
    return task.algorithm(cfg), task.model_fn(cfg), s["regularizer"], s["seed"], s["batch_size"]


@app.query("hello")
def hello(msg, context):
    alg, model_fn, reg, seed, batch = _common(context)
    return handle_hello(msg, context, alg, model_fn, reg, seed, batch, task.load_data(context.run_config))


@app.train("round")
def train(msg, context):
    alg, model_fn, reg, seed, batch = _common(context)
    return handle_round(msg, context, alg, model_fn, task.loss, task.load_data(context.run_config), reg, seed, batch)
