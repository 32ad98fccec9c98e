"""The explicit tangent rules of linear and layer norm: the same derivatives as torch's own rules
(forward and reverse, under vmap as the engine runs them), in fewer bytes, and used by the
engine's rewrites only where they hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repdiag.encoders.jacobian import rewrites, tangent_rules
from repdiag.encoders.jacobian.rewrites import jacobian_mode

F = nn.functional
DOUBLE = torch.float64


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DOUBLE)


def _vmapped_jvp(fn, x: torch.Tensor, tangents: torch.Tensor) -> torch.Tensor:
    return torch.func.vmap(lambda t: torch.func.jvp(fn, (x,), (t,))[1])(tangents)


def _vmapped_vjp(fn, x: torch.Tensor, cotangents: torch.Tensor) -> torch.Tensor:
    _, vjp_fn = torch.func.vjp(fn, x)
    return torch.func.vmap(vjp_fn)(cotangents)[0]


CASES = {
    "linear": (
        lambda w, b: (lambda x: F.linear(x, w, b), lambda x: tangent_rules.linear(x, w, b)),
        (7, 5),
    ),
    "linear without bias": (
        lambda w, b: (lambda x: F.linear(x, w), lambda x: tangent_rules.linear(x, w, None)),
        (7, 5),
    ),
    "layer norm": (
        lambda w, b: (
            lambda x: F.layer_norm(x, (5,), w, b, 1e-6),
            lambda x: tangent_rules.layer_norm(x, (5,), w, b, 1e-6),
        ),
        (5,),
    ),
    "layer norm without affine": (
        lambda w, b: (
            lambda x: F.layer_norm(x, (5,), eps=1e-5),
            lambda x: tangent_rules.layer_norm(x, (5,), None, None, 1e-5),
        ),
        (5,),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_has_torchs_derivatives_forward_and_reverse(case):
    build, weight_shape = CASES[case]
    weight, bias = _rand(*weight_shape, seed=1), _rand(weight_shape[0], seed=2)
    plain, rule = build(weight, bias)
    x = _rand(2, 3, 5, seed=3)
    out_width = plain(x).shape[-1]
    tangents, cotangents = _rand(4, 2, 3, 5, seed=4), _rand(4, 2, 3, out_width, seed=5)
    torch.testing.assert_close(rule(x), plain(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        _vmapped_jvp(rule, x, tangents), _vmapped_jvp(plain, x, tangents), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        _vmapped_vjp(rule, x, cotangents), _vmapped_vjp(plain, x, cotangents), rtol=0, atol=1e-12
    )
    # one direction without vmap: the same rule, unbatched
    one = torch.func.jvp(rule, (x,), (tangents[0],))[1]
    torch.testing.assert_close(
        one, torch.func.jvp(plain, (x,), (tangents[0],))[1], atol=1e-12, rtol=0
    )


def test_the_layer_norm_rule_is_the_textbook_formula():
    """dy = w r (dx - mean(dx) - x_hat mean(dx x_hat)), computed here from its definition."""
    x, t, w = _rand(3, 6, seed=6), _rand(3, 6, seed=7), _rand(6, seed=8)
    eps = 1e-5
    r = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    x_hat = (x - x.mean(-1, keepdim=True)) * r
    expected = w * r * (t - t.mean(-1, keepdim=True) - x_hat * (t * x_hat).mean(-1, keepdim=True))
    got = torch.func.jvp(lambda v: tangent_rules.layer_norm(v, (6,), w, None, eps), (x,), (t,))[1]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def _counted_ops(fn) -> list[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Log():
        fn()
    return seen


def test_the_linear_rule_makes_no_tangent_for_the_bias_or_the_weight():
    """torch's own rule adds the bias's zero tangent and multiplies by the weight's: two adds and
    a second matmul per linear under vmap; the rule runs one matmul for the directions."""
    w, b, x = _rand(6, 4, seed=9), _rand(6, seed=10), _rand(2, 5, 4, seed=11)
    tangents = _rand(8, 2, 5, 4, seed=12)
    plain = _counted_ops(lambda: _vmapped_jvp(lambda v: F.linear(v, w, b), x, tangents))
    rule = _counted_ops(lambda: _vmapped_jvp(lambda v: tangent_rules.linear(v, w, b), x, tangents))
    assert plain.count("add") == 2 and "add" not in rule
    assert rule.count("mm") == 1 and plain.count("mm") == 2  # one of torch's is x @ 0


def test_the_rewrites_use_the_rules_only_where_they_hold():
    weight = _rand(3, 4, seed=13)
    x = _rand(2, 4, seed=14)
    with jacobian_mode(None, rewrites=True):
        assert F.linear(x, weight).grad_fn is None  # no input requires grad: no node
        y = F.linear(x.requires_grad_(), weight)
        assert type(y.grad_fn).__name__ == "_LinearBackward"
        # a weight that is being trained is differentiated by torch's own rule
        trained = F.linear(x, weight.clone().requires_grad_())
        assert type(trained.grad_fn).__name__ != "_LinearBackward"
        norm = F.layer_norm(x, (4,))
        assert type(norm.grad_fn).__name__ == "_LayerNormBackward"
    with rewrites.tangent_rules_set(False), jacobian_mode(None, rewrites=True):
        assert type(F.linear(x, weight).grad_fn).__name__ != "_LinearBackward"
    assert rewrites._JacobianRewrites.tangent_rules  # the switch is restored


def test_under_autocast_layer_norm_keeps_its_float32_decomposition():
    x = torch.randn(2, 4, dtype=torch.bfloat16, requires_grad=True)
    with jacobian_mode(None, rewrites=True), torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.layer_norm(x, (4,))
    assert y.dtype == torch.float32 and type(y.grad_fn).__name__ != "_LayerNormBackward"


@pytest.mark.parametrize("method", ["exact", "randomized"])
def test_the_engine_gives_the_same_spectra_and_jer_with_and_without_the_rules(method):
    from repdiag.encoders.jacobian.engine import jacobian_spectra
    from repdiag.encoders.jacobian.jer import jer

    from .models import engine, images, registry_vit

    taps, x = registry_vit(num_classes=5), images(2, (3, 16, 16))
    settings = engine(method=method, k=6, power_iters=2)
    runs = {}
    for on in (False, True):
        with rewrites.tangent_rules_set(on):
            for dtype in (DOUBLE, torch.float32):
                taps.model.to(dtype)
                runs[on, dtype] = jacobian_spectra(taps, x.to(dtype), **settings)
    for name in runs[True, DOUBLE]:
        torch.testing.assert_close(
            runs[True, DOUBLE][name], runs[False, DOUBLE][name], rtol=1e-10, atol=1e-12
        )
        ours, landed = (jer(runs[on, torch.float32][name]) for on in (True, False))
        assert (ours - landed).abs().max() <= 1e-6 * landed.abs().max()


def _math_attention(scale: float):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attend(q, k, v):
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, scale=scale)

    return attend


@pytest.mark.parametrize("queries", [5, 1])  # every token, or the class token alone
def test_the_attention_rule_has_torchs_derivatives_in_every_layout_the_engine_meets(queries):
    scale = 0.7
    plain, rule = _math_attention(scale), lambda q, k, v: tangent_rules.attention(q, k, v, scale)
    shape = {"q": (2, 3, queries, 4), "kv": (2, 3, 5, 4)}
    q, k, v = (
        _rand(*shape["q"], seed=20),
        _rand(*shape["kv"], seed=21),
        _rand(*shape["kv"], seed=22),
    )
    tangents = (_rand(6, *shape["q"], seed=23), _rand(6, *shape["kv"], seed=24),
                _rand(6, *shape["kv"], seed=25))  # fmt: skip
    cotangents = _rand(6, *shape["q"], seed=26)

    def jvps(fn):
        return torch.func.vmap(lambda *t: torch.func.jvp(fn, (q, k, v), t)[1])(*tangents)

    def vjps(fn):
        return torch.func.vmap(torch.func.vjp(fn, q, k, v)[1])(cotangents)

    close = {"rtol": 0, "atol": 1e-12}
    torch.testing.assert_close(rule(q, k, v), plain(q, k, v), **close)
    torch.testing.assert_close(jvps(rule), jvps(plain), **close)
    for ours, torchs in zip(vjps(rule), vjps(plain), strict=True):
        torch.testing.assert_close(ours, torchs, **close)
    one = tuple(t[0] for t in tangents)  # one direction, outside vmap
    torch.testing.assert_close(
        torch.func.jvp(rule, (q, k, v), one)[1], torch.func.jvp(plain, (q, k, v), one)[1], **close
    )
    # nested deeper than the engine's vmap-of-jvp: the generic rule, the same numbers
    twice = tuple(t.reshape(2, 3, *t.shape[1:]) for t in tangents)
    nested = torch.func.vmap(torch.func.vmap(lambda *t: torch.func.jvp(rule, (q, k, v), t)[1]))
    torch.testing.assert_close(nested(*twice).reshape(jvps(plain).shape), jvps(plain), **close)


def test_the_engine_takes_the_explicit_attention_rule_and_never_copies_the_probabilities(
    monkeypatch,
):
    """The engine's vmapped JVPs and VJPs meet attention at one vmap level inside one grad
    level: the explicit layout, never the generic rule (which copies the probabilities once per
    direction through functorch's bmm rule)."""
    from repdiag.encoders.jacobian.engine import jacobian_spectra

    from .models import engine, images, registry_vit

    def refuse(*args):
        raise AssertionError("the generic attention rule ran")

    monkeypatch.setattr(tangent_rules, "_generic_jvp", refuse)
    monkeypatch.setattr(tangent_rules, "_generic_vjp", refuse)
    taps, x = registry_vit(num_classes=5), images(2, (3, 16, 16))
    for method in ("exact", "randomized"):
        spectra = jacobian_spectra(taps, x, **engine(method=method, k=6, power_iters=2))
        assert all(torch.isfinite(s).all() for s in spectra.values())
