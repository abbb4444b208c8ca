"""torch.library contract of every registered op: opcheck (schema, fake kernel, functionalization,
AOT dispatch) and a torch.compile(fullgraph=True) run with no graph break."""

import pytest
import torch

import fedkernels as fk


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def samples():
    d = 37
    yield "prox_", (t(d), "scad", 0.5, 1.0, 3.7)
    yield "prox_", (t(4, d, dtype=torch.float64), "mcp", 5.0, 1.0, 3.0)
    yield "prox", (t(d), "l1", 0.5, 0.3, 0.0)
    yield "prox", (t(d, 4).t(), "elastic_net", 0.5, 0.3, 0.2)  # non-contiguous input
    yield "box_tensor_", (t(d), -t(d).abs(), t(d).abs())
    yield "box_tensor", (t(3, d), -t(d).abs(), t(d).abs())
    yield "l2_ball_", (t(3, d), 1.0, None)
    yield "l2_ball_", (t(d), 1.0, t(d))
    yield "group_lasso_", (t(5, 7), 0.5, 1.0, "rows", None, 0)
    yield "group_lasso_", (t(3, d, dtype=torch.float64), 0.5, 1.0, "cols", [4, 8], 2)
    yield "cv_step_", (t(3, d), t(3, d), t(d), 0.1)
    yield "normalized_delta", (t(d), t(3, d), 0.1, 5)
    yield "normalized_delta_", (t(3, d), t(d), 0.1, 5)
    yield "control_update_", (t(3, d), t(d), t(3, d))
    yield "prox_grad_step_", (t(d), t(d), 0.1, "scad", 0.1, 1.0, 3.7)
    yield "normal_map_step_", (t(3, d), t(3, d), t(3, d), t(d), 0.1, 0.5, "l1", 0.5, 0.2, 0.0)
    yield "za1_step_", (t(3, d), t(3, d), t(3, d), t(3, d), 0.1, "mcp", 0.3, 1.0, 3.0)
    yield "depositum_step_", (t(3, d), t(3, d), t(3, d), 0.1, 0.9, "l1", 0.1, 0.2, 0.0, "snag", True)
    # the out-of-place ops on inputs that require grad: their derivatives are registered (issue 35)
    for kind, step, p1, p2 in (("l1", 0.5, 0.3, 0.0), ("mcp", 5.0, 1.0, 3.0), ("scad", 0.5, 1.0, 3.7),
                               ("scad", 4.0, 1.0, 3.7), ("box", 0.0, -0.5, 0.5)):
        yield "prox", (t(3, d, dtype=torch.float64).requires_grad_(), kind, step, p1, p2)
    yield "box_tensor", (t(3, d).requires_grad_(), (-t(d).abs()).requires_grad_(), t(3, d).abs().requires_grad_())
    yield "normalized_delta", (t(d).requires_grad_(), t(3, d).requires_grad_(), 0.1, 5)


OPS = sorted({name for name, _ in samples()})


def test_every_registered_op_has_samples():
    registered = {name for name in fk.ops.__all__}
    assert registered == set(OPS)


@pytest.mark.parametrize("i,name,args", [(i, n, a) for i, (n, a) in enumerate(samples())],
                         ids=lambda v: str(v) if isinstance(v, (int, str)) else "")
def test_opcheck(i, name, args):
    op = getattr(torch.ops.fedkernels, name).default
    torch.library.opcheck(op, args)


@pytest.mark.slow
def test_torch_compile_fullgraph(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    reg = fk.SCAD(0.5, 3.7)

    def server_round(z, X, C, beta, alpha):
        # FedCanon-style round on a [N, d] stack: normalized deltas, mean, server prox step, controls
        D = fk.ops.normalized_delta(z, X, beta, 4)
        dbar = D.mean(0)
        fk.ops.control_update_(C, dbar, D)
        fk.ops.prox_grad_step_(z, dbar, alpha, "scad", alpha * 1.0, reg.lam, reg.a)
        return z * 2.0, reg.prox(z, 0.1)

    compiled = torch.compile(server_round, fullgraph=True, backend="inductor")
    z, X, C = t(50), t(4, 50), t(4, 50)
    z2, C2 = z.clone(), C.clone()
    out_c = compiled(z, X, C, 0.1, 0.2)
    out_e = server_round(z2, X, C2, 0.1, 0.2)
    torch.testing.assert_close(out_c[0], out_e[0])
    torch.testing.assert_close(out_c[1], out_e[1])
    torch.testing.assert_close(z, z2)
    torch.testing.assert_close(C, C2)
