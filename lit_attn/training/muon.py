"""Muon for a network's hidden matrices and AdamW for its other parameters, as one torch optimizer.

Where each Newton–Schulz iteration runs: torch.optim.Muon's own step, whose iteration is in bfloat16, wherever
bfloat16 matrix products are native: on a GPU, and on a CPU with AVX512-BF16 or AMX; on any other CPU,
`Muon.step` below, the same update with the iteration in float32, since such a CPU emulates bfloat16 products
far more slowly than it computes float32 ones (benchmarks/bench_muon.py measures both on a machine).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

# The library's learning-rate scaling by a matrix's shape ("original": sqrt(max(1, rows / cols))), reused so
# that both devices take the same step.
from torch.optim._muon import _adjust_lr


def newton_schulz(grad: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton–Schulz orthogonalization of a 2-D `grad`, computed in float32."""
    a, b, c = coefficients
    tall = grad.size(0) > grad.size(1)
    x = grad.float().T if tall else grad.float()  # the Gram matrix of the shorter side is the smaller one
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


@functools.cache
def native_bfloat16_cpu() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


class Muon(torch.optim.Muon):
    """torch.optim.Muon (momentum, Nesterov, decoupled weight decay, the shape's LR scaling) whose Newton–Schulz
    iteration runs in float32 where bfloat16 is slow: on a CPU without native bfloat16 (`float32` None, the
    default), always (True) or never (False); elsewhere the library's step runs unchanged."""

    def __init__(self, *args: Any, float32: bool | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.float32 = float32

    def _float32_here(self) -> bool:
        if self.float32 is not None:
            return self.float32
        on_cpu = any(p.device.type == "cpu" for group in self.param_groups for p in group["params"])
        return on_cpu and not native_bfloat16_cpu()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if not self._float32_here():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            buffers: list[torch.Tensor] = []
            self._init_group(group, params, grads, buffers)
            lr, momentum = group["lr"], group["momentum"]
            for param, grad, buffer in zip(params, grads, buffers):
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update.to(param.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer over `muon_groups` (stepped by `Muon`) and `adamw_groups` (by torch.optim.AdamW).

    Its param_groups are the two optimizers' own (Muon's first) and its state is theirs, so the LR scheduler,
    gradient clipping and checkpoints (torch's state_dict format) see one optimizer.

    Args:
        muon_groups: parameter groups of 2-D matrices, with their Muon settings.
        adamw_groups: the other parameter groups, with their AdamW settings.
        muon: Muon's defaults, e.g. {"lr": 0.02, "momentum": 0.95}.
        adamw: AdamW's defaults, e.g. {"lr": 1e-3, "betas": (0.9, 0.95), "fused": True}.
    """

    def __init__(self, muon_groups: list[dict[str, Any]], adamw_groups: list[dict[str, Any]],
                 muon: dict[str, Any], adamw: dict[str, Any]):
        self.muon = Muon(muon_groups, **muon)
        self.adamw = torch.optim.AdamW(adamw_groups, **adamw)
        super().__init__([*self.muon.param_groups, *self.adamw.param_groups], {})
        self._share()

    def _share(self) -> None:
        """Point both optimizers at this one's groups and state (load_state_dict replaces them)."""
        n = len(self.muon.param_groups)
        self.muon.param_groups, self.adamw.param_groups = self.param_groups[:n], self.param_groups[n:]
        self.muon.state = self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss
