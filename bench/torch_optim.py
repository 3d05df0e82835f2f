"""The PyTorch side's optimiser in every bench: `torch.optim.AdamW` with jbert's decay mask (weight decay on every
parameter but biases and LayerNorm, `jbert.train.optim`), as transformers' examples group parameters."""
from __future__ import annotations


def decays(name: str) -> bool:
  """Whether a transformers parameter name gets weight decay."""
  return not (name.endswith("bias") or "LayerNorm" in name)


def adamw(model, *, learning_rate: float, weight_decay: float, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-6, skip=lambda name: False):
  """AdamW over `model`'s parameters in a decayed and an undecayed group; `skip(name)`: parameters left out (those
  the loss never reaches)."""
  import torch  # pylint: disable=g-import-not-at-top
  named = [(n, p) for n, p in model.named_parameters() if not skip(n)]
  groups = [{"params": [p for n, p in named if decays(n)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}]
  return torch.optim.AdamW(groups, lr=learning_rate, betas=(b1, b2), eps=eps)


def adamw_from_config(model, optim_cfg, learning_rate: float | None = None, skip=lambda name: False):
  """`adamw` with the settings of a jbert config's `optim` section."""
  return adamw(model, learning_rate=learning_rate or optim_cfg.learning_rate, weight_decay=optim_cfg.weight_decay,
               b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps, skip=skip)
