"""Adam without ``torch.optim``: the same update, minus a 3 s import per process.

``torch.optim.Optimizer.step`` imports ``torch._dynamo`` on first use (about 3 s of CPU with torch
2.14), which would dominate the short, many-process jobs of the alignment grid. This is the
update of Kingma & Ba (2015), Algorithm 1, as ``torch.optim.Adam`` computes it (no weight
decay, no AMSGrad); ``tests/sae/test_optim.py`` checks that both give the same parameters.

    m_t = b1 m_{t-1} + (1 - b1) g_t,   v_t = b2 v_{t-1} + (1 - b2) g_t^2
    p_t = p_{t-1} - lr * (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class Adam:
    """Minimal Adam over a list of parameters, with a settable learning rate ``lr``."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        beta1, beta2 = self.betas
        bias1 = 1 - beta1**self.step_count
        bias2 = 1 - beta2**self.step_count
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
            if p.grad is None:
                continue
            m.lerp_(p.grad, 1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            denom = (v.sqrt() / bias2**0.5).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / bias1)
