"""fk.optim.ProxSGD / Proximal against torch.optim.SGD (or Adam) followed by a plain-torch prox."""

import copy
import io

import pytest
import torch
from torch import nn

import fedkernels as fk


def soft(x, t):  # plain-torch prox of t * ||.||_1
    return torch.sign(x) * torch.clamp(x.abs() - t, min=0)


def scad_prox(x, step, lam, a):  # plain-torch SCAD prox, valid for step < a - 1 (the four-piece form)
    t = x.abs()
    s = torch.sign(x)
    p1 = s * torch.clamp(t - step * lam, min=0)
    p2 = ((a - 1) * x - s * step * a * lam) / (a - 1 - step)
    return torch.where(t <= (1 + step) * lam, p1, torch.where(t <= a * lam, p2, x))


def make_model(dtype, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)).to(dtype)


def data(dtype):
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 5, generator=g, dtype=dtype), torch.randn(16, 2, generator=g, dtype=dtype)


def loss_of(model, X, y):
    return ((model(X) - y) ** 2).mean()


def train(model, opt, X, y, steps=6, flat=None):
    for _ in range(steps):
        if flat is not None:
            flat.zero_grad()
        else:
            opt.zero_grad()
        loss_of(model, X, y).backward()
        opt.step()


def reference(model, X, y, lr, prox_fn, steps=6, per_group=None, **sgd):
    """torch.optim.SGD step, then prox_fn(param, lr) on every parameter with a gradient."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, **sgd)
    for _ in range(steps):
        opt.zero_grad()
        loss_of(model, X, y).backward()
        opt.step()
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                fn = prox_fn if per_group is None else per_group(i)
                if fn is not None:
                    p.copy_(fn(p, lr))


SGD_SETTINGS = [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-2},
                {"momentum": 0.5, "dampening": 0.3}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sgd", SGD_SETTINGS)
@pytest.mark.parametrize("flat", [False, True])
def test_proxsgd_matches_sgd_then_l1_prox(dtype, sgd, flat):
    X, y = data(dtype)
    ref = make_model(dtype)
    reference(ref, X, y, 0.1, lambda p, lr: soft(p, lr * 0.5), **sgd)
    model = make_model(dtype)
    fp = fk.FlatParams(model) if flat else None
    opt = fk.optim.ProxSGD(model.parameters(), lr=0.1, regularizer=fk.L1(0.5), **sgd)
    train(model, opt, X, y, flat=fp)
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)
    assert sum(int((p == 0).sum()) for p in model.parameters()) > 0  # the prox produced exact zeros


def test_flat_params_get_one_call_per_group():
    model = make_model(torch.float32)
    fp = fk.FlatParams(model)
    opt = fk.optim.ProxSGD(model.parameters(), lr=0.1, regularizer=fk.SCAD(0.05))
    X, y = data(torch.float32)
    fp.zero_grad()
    loss_of(model, X, y).backward()
    with fk.prox_stats() as stats:
        opt.step()
    assert stats.calls == 1
    plain = make_model(torch.float32)
    opt2 = fk.optim.ProxSGD(plain.parameters(), lr=0.1, regularizer=fk.SCAD(0.05))
    loss_of(plain, X, y).backward()
    with fk.prox_stats() as stats2:
        opt2.step()
    # one pass over the flat buffer vs one per tensor
    assert stats2.calls == len(list(plain.parameters()))


def test_per_group_regularizer_and_none():
    X, y = data(torch.float64)
    ref = make_model(torch.float64)
    reference(ref, X, y, 0.2, None,
              per_group=lambda i: (lambda p, lr: scad_prox(p, lr, 0.1, 3.7)) if i % 2 == 0 else None,
              momentum=0.9)
    model = make_model(torch.float64)
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = fk.optim.ProxSGD([{"params": weights}, {"params": biases, "regularizer": None}], lr=0.2,
                           regularizer=fk.SCAD(0.1), momentum=0.9)
    train(model, opt, X, y)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


def test_no_regularizer_is_plain_sgd():
    X, y = data(torch.float64)
    ref = make_model(torch.float64)
    reference(ref, X, y, 0.1, None, momentum=0.9, per_group=lambda i: None)
    model = make_model(torch.float64)
    train(model, fk.optim.ProxSGD(model.parameters(), lr=0.1, momentum=0.9), X, y)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_state_dict_round_trip_continues_identically():
    X, y = data(torch.float64)
    a = make_model(torch.float64)
    opt_a = fk.optim.ProxSGD(a.parameters(), lr=0.1, regularizer=fk.L1(0.02), momentum=0.9)
    train(a, opt_a, X, y, steps=3)
    buf = io.BytesIO()
    torch.save({"model": a.state_dict(), "opt": opt_a.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)  # no custom classes inside
    b = make_model(torch.float64, seed=5)
    b.load_state_dict(saved["model"])
    opt_b = fk.optim.ProxSGD(b.parameters(), lr=0.1, regularizer=fk.L1(0.02), momentum=0.9)
    opt_b.load_state_dict(saved["opt"])
    assert opt_b.param_groups[0]["regularizer"].kappa == 0.02
    train(a, opt_a, X, y, steps=3)
    train(b, opt_b, X, y, steps=3)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="regularizer"):
        fk.optim.ProxSGD(b.parameters(), lr=0.1, regularizer=fk.SCAD(0.02)).load_state_dict(saved["opt"])


def test_bad_regularizer_named():
    model = make_model(torch.float32)
    with pytest.raises(TypeError, match="regularizer"):
        fk.optim.ProxSGD(model.parameters(), lr=0.1, regularizer="l1")
    with pytest.raises(TypeError, match="base_optimizer"):
        fk.optim.Proximal("adam", fk.L1(0.1))


def test_proximal_wraps_adam_at_group_lr_and_follows_scheduler():
    X, y = data(torch.float64)
    ref = make_model(torch.float64)
    ropt = torch.optim.Adam(ref.parameters(), lr=0.05)
    rsched = torch.optim.lr_scheduler.StepLR(ropt, step_size=2, gamma=0.5)
    model = make_model(torch.float64)
    opt = fk.optim.Proximal(torch.optim.Adam(model.parameters(), lr=0.05), fk.L1(0.1))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(5):
        ropt.zero_grad()
        loss_of(ref, X, y).backward()
        ropt.step()
        with torch.no_grad():
            lr = ropt.param_groups[0]["lr"]
            for p in ref.parameters():
                p.copy_(soft(p, lr * 0.1))
        rsched.step()
        opt.zero_grad()
        loss_of(model, X, y).backward()
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == opt.base.param_groups[0]["lr"] == 0.05 * 0.25
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    sd = copy.deepcopy(opt.state_dict())
    opt2 = fk.optim.Proximal(torch.optim.Adam(make_model(torch.float64).parameters(), lr=0.05), fk.L1(0.1))
    opt2.load_state_dict(sd)
    assert opt2.base.state_dict()["state"][0]["step"] == sd["state"][0]["step"]


def test_compiled_training_step_matches_eager():
    X, y = data(torch.float32)
    eager = make_model(torch.float32)
    opt_e = fk.optim.ProxSGD(eager.parameters(), lr=0.1, regularizer=fk.L1(0.05), momentum=0.9)
    train(eager, opt_e, X, y, steps=3)

    model = make_model(torch.float32)
    opt = fk.optim.ProxSGD(model.parameters(), lr=0.1, regularizer=fk.L1(0.05), momentum=0.9)

    @torch.compile(backend="eager")
    def step():
        opt.step()

    for _ in range(3):
        opt.zero_grad()
        loss_of(model, X, y).backward()
        step()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reg", [fk.L1(0.05), 2.0 * fk.SCAD(0.02, 3.7), fk.L2Ball(3.0)], ids=repr)
def test_tensor_lr_matches_a_float_lr_bitwise(reg):
    # issue 35: a tensor lr (PyTorch's advice for compiled optimizers with schedulers) went through float(lr)
    X, y = data(torch.float32)
    lr = torch.tensor(0.1)
    out = []
    for rate in (lr, lr.item()):
        model = make_model(torch.float32)
        train(model, fk.optim.ProxSGD(model.parameters(), lr=rate, regularizer=reg, momentum=0.9), X, y, steps=3)
        out.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_tensor_lr_adds_no_graph_break():
    X, y = data(torch.float32)
    breaks = {}
    for rate in (torch.tensor(0.1), 0.1):
        model = make_model(torch.float32)
        opt = fk.optim.ProxSGD(model.parameters(), lr=rate, regularizer=fk.L1(0.05), momentum=0.9)
        loss_of(model, X, y).backward()
        torch._dynamo.reset()
        breaks[type(rate).__name__] = torch._dynamo.explain(opt.step)().graph_break_count
    assert breaks["Tensor"] == breaks["float"], breaks  # was 13 against 1: float(lr) in the prox pass


# --- add_param_group with a regularizer (or a mapping), and parameters in other memory formats ---------


def _two_stage_reference(dtype, lr, prox_of, make_opt=None, steps=5):
    """Plain torch: model[0] trained from the start, model[2] added as a group after 2 steps;
    ``prox_of(name)`` is the plain-torch prox for a parameter (None: no prox)."""
    X, y = data(dtype)
    model = make_model(dtype)
    opt = torch.optim.SGD(model[0].parameters(), lr=lr, momentum=0.9)
    for k in range(steps):
        if k == 2:
            opt.add_param_group({"params": list(model[2].parameters())})
        opt.zero_grad()
        loss_of(model, X, y).backward()
        opt.step()
        with torch.no_grad():
            stepped = {id(p) for g in opt.param_groups for p in g["params"]}
            for n, p in model.named_parameters():
                fn = prox_of(n)
                if fn is not None and id(p) in stepped:
                    p.copy_(fn(p, lr))
    return model


def _two_stage(model, opt, group, steps=5):
    X, y = data(next(model.parameters()).dtype)
    for k in range(steps):
        if k == 2:
            opt.add_param_group(group)
        opt.zero_grad()
        loss_of(model, X, y).backward()
        opt.step()


@pytest.mark.parametrize("which", ["proxsgd", "proximal"])
def test_add_param_group_with_a_mapping_works_like_the_constructor(which):
    dtype = torch.float64
    ref = _two_stage_reference(dtype, 0.1, lambda n: (lambda p, lr: soft(p, lr * 0.3)) if n == "2.weight" else
                               (lambda p, lr: soft(p, lr * 0.05)) if n.startswith("0.") else None)
    model = make_model(dtype)
    first = list(model[0].named_parameters())
    if which == "proxsgd":
        opt = fk.optim.ProxSGD(first, lr=0.1, momentum=0.9, regularizer=fk.L1(0.05))
    else:
        opt = fk.optim.Proximal(torch.optim.SGD(first, lr=0.1, momentum=0.9), fk.L1(0.05))
    group = {"params": [(f"2.{n}", p) for n, p in model[2].named_parameters()],
             "regularizer": {"2.weight": fk.L1(0.3), "*.bias": None}}
    _two_stage(model, opt, group)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("which", ["proxsgd", "proximal"])
def test_added_group_takes_the_default_mapping(which):
    dtype = torch.float64
    ref = _two_stage_reference(dtype, 0.1,
                               lambda n: (lambda p, lr: soft(p, lr * 0.2)) if n.endswith("weight") else None)
    model = make_model(dtype)
    first = [(f"0.{n}", p) for n, p in model[0].named_parameters()]
    mapping = {"*.weight": fk.L1(0.2), "*.bias": None}
    if which == "proxsgd":
        opt = fk.optim.ProxSGD(first, lr=0.1, momentum=0.9, regularizer=mapping)
    else:
        opt = fk.optim.Proximal(torch.optim.SGD(first, lr=0.1, momentum=0.9), mapping)
    _two_stage(model, opt, {"params": [(f"2.{n}", p) for n, p in model[2].named_parameters()]})
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("which", ["proxsgd", "proximal"])
def test_add_param_group_with_a_bad_mapping_raises_and_leaves_the_optimizer(which):
    model = make_model(torch.float64)
    first = list(model[0].named_parameters())
    if which == "proxsgd":
        opt = fk.optim.ProxSGD(first, lr=0.1, regularizer=fk.L1(0.05))
    else:
        opt = fk.optim.Proximal(torch.optim.SGD(first, lr=0.1), fk.L1(0.05))
    with pytest.raises(ValueError, match="'2.wieght'"):
        opt.add_param_group({"params": [(f"2.{n}", p) for n, p in model[2].named_parameters()],
                             "regularizer": {"2.wieght": fk.L1(0.3)}})
    assert len(opt.param_groups) == 1
    if which == "proximal":
        assert len(opt.base.param_groups) == 1
    unnamed = fk.optim.ProxSGD(model[0].parameters(), lr=0.1, regularizer=fk.L1(0.05))
    with pytest.raises(TypeError, match="named_parameters"):
        unnamed.add_param_group({"params": list(model[2].parameters()), "regularizer": {"*": fk.L1(0.3)}})
    assert len(unnamed.param_groups) == 1


def _conv_reference(dtype, lr, prox, steps=4):
    """Plain torch SGD + ``prox`` on a contiguous conv (the ground truth for channels_last)."""
    torch.manual_seed(3)
    conv = nn.Conv2d(3, 4, 3).to(dtype)
    x = torch.randn(2, 3, 6, 6, dtype=dtype, generator=torch.Generator().manual_seed(4))
    ref = copy.deepcopy(conv)
    opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        ref(x).square().mean().backward()
        opt.step()
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(prox(p, lr))
    return conv, x, ref


def l2ball(p, lr, radius=0.5):  # plain-torch projection of the whole parameter onto the ball
    n = p.norm()
    return p * (radius / n) if n > radius else p


@pytest.mark.parametrize("which", ["proxsgd", "proximal"])
@pytest.mark.parametrize("reg,prox", [(fk.L1(0.2), lambda p, lr: soft(p, lr * 0.2)), (fk.L2Ball(0.5), l2ball)],
                         ids=["l1", "l2ball"])
@pytest.mark.parametrize("mapping", [False, True])
def test_channels_last_parameters_match_a_contiguous_model(which, reg, prox, mapping):
    dtype = torch.float64
    conv, x, ref = _conv_reference(dtype, 0.1, prox)
    conv = conv.to(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()
    params = conv.named_parameters() if mapping else conv.parameters()
    r = {"*": reg} if mapping else reg
    if which == "proxsgd":
        opt = fk.optim.ProxSGD(params, lr=0.1, momentum=0.9, regularizer=r)
    else:
        opt = fk.optim.Proximal(torch.optim.SGD(params, lr=0.1, momentum=0.9), r)
    for _ in range(4):
        opt.zero_grad()
        conv(x).square().mean().backward()
        opt.step()
    assert not conv.weight.is_contiguous()  # still channels_last: written back in place
    for p, q in zip(conv.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


def test_transposed_parameter_gets_the_group_lasso_of_its_logical_shape():
    # rows of the logical [4, 3] matrix, not of its storage: the contiguous-copy path keeps that
    w0 = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    w = nn.Parameter(w0.clone().t())
    assert not w.is_contiguous()
    w.grad = torch.zeros_like(w)
    fk.optim.ProxSGD([w], lr=0.5, regularizer=fk.GroupLasso(0.4, groups="rows")).step()
    logical = w0.t()
    norms = logical.norm(dim=1, keepdim=True)
    expect = logical * torch.clamp(1 - 0.5 * 0.4 / norms, min=0)
    torch.testing.assert_close(w.detach(), expect, rtol=1e-12, atol=1e-12)


# --- a group's bare GroupLasso: refused on 1-D parameters at construction, matrices of higher rank
# grouped as [shape[0], rest] (as the per-parameter form does) -------------------------------------

@pytest.mark.parametrize("make", ["proxsgd", "proximal"])
def test_bare_group_lasso_on_a_bias_is_refused_at_construction(make):
    m = torch.nn.Linear(4, 3)
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(ValueError, match=r"param group 0's regularizer .* has shape \(3,\).*regularizer=None"):
        if make == "proxsgd":
            fk.optim.ProxSGD(m.parameters(), lr=0.1, regularizer=fk.GroupLasso(0.1))
        else:
            fk.optim.Proximal(torch.optim.Adam(m.parameters()), 2.0 * fk.GroupLasso(0.1))
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))


def test_add_param_group_with_a_bare_group_lasso_on_a_bias_is_refused_and_undone():
    m = torch.nn.Linear(4, 3)
    opt = fk.optim.ProxSGD([{"params": [m.weight], "regularizer": fk.GroupLasso(0.1)}], lr=0.1)
    with pytest.raises(ValueError, match="has shape"):
        opt.add_param_group({"params": [m.bias], "regularizer": fk.GroupLasso(0.1)})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [m.bias], "regularizer": None})  # the optimizer still works
    assert len(opt.param_groups) == 2


@pytest.mark.parametrize("groups", ["rows", "cols"])
def test_bare_group_lasso_groups_a_3d_parameter_as_its_matrix_view(groups):
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(4, 3, 2, dtype=torch.float64))
    lr, lam = 0.5, 0.8
    g = torch.randn_like(w)
    x = (w.detach() - lr * g).reshape(4, 6)  # SGD step, then the prox of lr * lam * sum of group norms
    n = x.norm(dim=1 if groups == "rows" else 0, keepdim=True)
    expect = (x * torch.clamp(1 - lr * lam / n, min=0)).reshape(4, 3, 2)
    opt = fk.optim.ProxSGD([w], lr=lr, regularizer=fk.GroupLasso(lam, groups=groups))
    w.grad = g
    opt.step()
    torch.testing.assert_close(w.detach(), expect, rtol=0, atol=1e-12)
