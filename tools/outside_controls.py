"""Control encoders written outside repdiag, from the benchmark's description only (docs/binding.md,
"Controls"): run them through the `python:` source with this folder on PYTHONPATH."""

import torch
import torch.nn.functional as F
from torch import nn

CFG = {"input_size": 64, "mean": [0.0] * 3, "std": [1.0] * 3, "interpolation": "bilinear"}


class _Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.preprocess_cfg = dict(CFG)

    @staticmethod
    def mask(x):  # foreground: any channel far from the corner pixel
        return ((x - x[:, :, :1, :1]).abs().amax(1, keepdim=True) > 0.25).float()

    @staticmethod
    def slots(m):  # (N, 4, 1, 32, 32): the 2 x 2 cells
        n, _, h, w = m.shape
        cells = m.unfold(2, h // 2, h // 2).unfold(3, w // 2, w // 2)  # N,1,2,2,h/2,w/2
        return cells.reshape(n, 4, 1, h // 2, w // 2)


class Layout(_Base):
    def forward(self, x):
        return F.adaptive_avg_pool2d(self.mask(x), 8).flatten(1)


class Presence(_Base):  # each object's appearance, as a set: which shapes, not where
    def forward(self, x):
        s = self.slots(self.mask(x))
        n = s.shape[0]
        f = F.adaptive_avg_pool2d(s.reshape(n * 4, 1, *s.shape[-2:]), 6).reshape(n, 4, 36)
        order = torch.argsort(f.sum(-1) + 1e-3 * f[..., :18].sum(-1), dim=1)
        f = torch.gather(f, 1, order[..., None].expand_as(f))
        return f.flatten(1)


class Occupancy(_Base):
    def forward(self, x):
        return (self.slots(self.mask(x)).mean((2, 3, 4)) > 0.02).float()


class CellArea(_Base):
    def forward(self, x):
        return self.slots(self.mask(x)).mean((2, 3, 4))


def layout():
    return Layout()


def presence():
    return Presence()


def occupancy():
    return Occupancy()


def cell_area():
    return CellArea()
