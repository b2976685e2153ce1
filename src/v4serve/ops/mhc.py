"""Manifold-constrained hyper-connections (mHC): the 4-stream residual of DeepSeek-V4.

Each sub-layer maps its input streams X [T, n, D] to coefficients: `pre` (collapse weights), `post` (where the
sub-layer output goes) and `comb` (an n x n doubly-stochastic stream mixer from Sinkhorn). All in float32.

The models call two entry points per sub-layer: `hc_pre` (mixes, coefficients, collapse and the sub-layer's RMSNorm)
and `hc_post` (the expansion), or `hc_post_pre` where one sub-layer's expansion feeds the next one's pre side (the
attention -> FFN seam of a block). Their reference bodies compose the functions below; the Triton bodies
(ops/kernels/mhc.py) are one launch each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import backend as kernels
from .norm import rms_norm
from .peer_sum import PartialSum, resolve
from .precision import acc_dtype
from .profiling import family, profiled


@dataclass
class HCParams:
    fn: torch.Tensor  # [(2+n)*n, n*D] float32
    base: torch.Tensor  # [(2+n)*n]
    scale: torch.Tensor  # [3]


@profiled("mhc")
def hc_mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """RMS-normalised linear map of the flattened streams: [T, n, D] -> [T, rows(fn)] (float32)."""
    xf = x.flatten(-2).to(acc_dtype(x))
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm_eps)
    return (xf * rs) @ fn.to(xf.dtype).t()


def sinkhorn(comb_logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Row softmax (+eps), then alternate column/row normalisation, starting and ending on columns."""
    c = comb_logits.softmax(-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


@profiled("mhc")
def hc_coefficients(mixes: torch.Tensor, p: HCParams, n: int, iters: int, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [T, (2+n)n] -> pre [T, n], post [T, n], comb [T, n, n] (float32)."""
    scale, base = p.scale.to(mixes.dtype), p.base.to(mixes.dtype)
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + eps
    post = 2 * torch.sigmoid(mixes[:, n:2 * n] * scale[1] + base[n:2 * n])
    logits = mixes[:, 2 * n:].unflatten(-1, (n, n)) * scale[2] + base[2 * n:].view(n, n)
    return pre, post, sinkhorn(logits, iters, eps)


@profiled("mhc")
def hc_collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """y = sum_i pre_i X_i, computed in float32 and returned in x's dtype."""
    return (pre.unsqueeze(-1) * x.to(pre.dtype)).sum(-2).to(x.dtype)


@profiled("mhc")
def hc_expand(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'_k = post_k f + sum_j comb[j, k] X_j  (comb applied transposed)."""
    a = acc_dtype(x, comb)
    mixed = torch.einsum("tjk,tjd->tkd", comb.to(a), x.to(a))
    return (post.to(a).unsqueeze(-1) * f.to(a).unsqueeze(-2) + mixed).to(x.dtype)


@profiled("mhc")
def hc_head_collapse(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                     norm_eps: float, eps: float) -> torch.Tensor:
    """Final collapse of the streams before the norm and LM head (pre only, no Sinkhorn)."""
    mixes = hc_mixes(x, fn, norm_eps)
    pre = torch.sigmoid(mixes * scale.to(mixes.dtype) + base.to(mixes.dtype)) + eps
    return hc_collapse(x, pre)


# ------------------------------------------------------------------------------------------------
# The entry points
# ------------------------------------------------------------------------------------------------

def hc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_eps: float,
            hc_eps: float, norm_weight: torch.Tensor, norm_eps2: float, backend: str = kernels.REFERENCE
            ) -> torch.Tensor:
    """The streams' last collapse before the LM head, RMS-normed: x [T, n, D] -> [T, D] in x's dtype, as
    rms_norm(hc_head_collapse(x, fn, base, scale, norm_eps, hc_eps), norm_weight, norm_eps2). The head's parameters
    (fn [n, n*D], base [n], scale [1]) are a sub-layer's pre rows alone, so the Triton body is hc_pre's one launch over
    them padded to a sub-layer's layout with zero post and comb rows (made once per parameter version), their
    coefficients dropped: in place of ~16 small torch kernels a step."""
    with family("mhc"):
        if backend == kernels.TRITON:
            from .kernels import mhc as mk

            if mk.supports(x):
                n = x.shape[1]
                p = _head_as_sublayer(fn, base, scale, n)
                return mk.hc_pre(x, p.fn, p.base, p.scale, n, 1, norm_eps, hc_eps, None, norm_weight, norm_eps2)[0]
        return rms_norm(hc_head_collapse(x, fn, base, scale, norm_eps, hc_eps), norm_weight, norm_eps2)


def _head_as_sublayer(fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int) -> HCParams:
    """The head's pre rows in a sub-layer's layout ((2+n)n rows; post and comb rows zero, scale [s, 0, 0]), cached on
    fn itself (it lives and dies with the weights) and rebuilt when any of the three was written since (their version
    counters)."""
    key = tuple(_version(t) for t in (fn, base, scale)) + (base.data_ptr(), scale.data_ptr())
    hit = getattr(fn, "_hc_head_sublayer", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    rows = (2 + n) * n
    pfn = torch.zeros(rows, fn.shape[1], dtype=fn.dtype, device=fn.device)
    pfn[:n] = fn
    pbase = torch.zeros(rows, dtype=base.dtype, device=base.device)
    pbase[:n] = base.reshape(-1)
    pscale = torch.zeros(3, dtype=scale.dtype, device=scale.device)
    pscale[0] = scale.reshape(-1)[0]
    params = HCParams(pfn, pbase, pscale)
    fn._hc_head_sublayer = (key, params)
    return params


def _version(t: torch.Tensor) -> int:
    """t's in-place write counter; -1 for inference tensors (made under torch.inference_mode, which keeps none: a
    model built there is taken as never rewritten in place)."""
    return -1 if t.is_inference() else t._version


def hc_pre_reference(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
                     norm_eps: float, hc_eps: float, collapse_pre: torch.Tensor | None = None,
                     norm_weight: torch.Tensor | None = None, norm_eps2: float | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    mixes = hc_mixes(x, fn, norm_eps)
    pre, post, comb = hc_coefficients(mixes, HCParams(fn, base, scale), n, iters, hc_eps)
    y = hc_collapse(x, pre if collapse_pre is None else collapse_pre)
    if norm_weight is not None:
        y = rms_norm(y, norm_weight, norm_eps if norm_eps2 is None else norm_eps2)
    return y, pre, post, comb


def hc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
           norm_eps: float, hc_eps: float, collapse_pre: torch.Tensor | None = None,
           norm_weight: torch.Tensor | None = None, norm_eps2: float | None = None,
           backend: str = kernels.REFERENCE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pre side of a sub-layer: x [T, n, D] -> (y [T, D] in x's dtype, pre [T, n], post [T, n], comb [T, n, n]).

    (pre, post, comb) come from x (`iters` Sinkhorn iterations); y collapses x with `collapse_pre` when given (V4.1's
    lagged mHC: the previous sub-layer's pre), else with pre, then is RMS-normed with `norm_weight` when given
    (eps `norm_eps2`, default `norm_eps`). Coefficients are float32 (float64 for float64 x)."""
    with family("mhc"):
        if backend == kernels.TRITON:
            from .kernels import mhc as mk

            if mk.supports(x, collapse_pre):
                return mk.hc_pre(x, fn, base, scale, n, iters, norm_eps, hc_eps, collapse_pre, norm_weight,
                                 norm_eps2)
        return hc_pre_reference(x, fn, base, scale, n, iters, norm_eps, hc_eps, collapse_pre, norm_weight,
                                norm_eps2)


def _for_kernel(f: torch.Tensor | PartialSum) -> torch.Tensor | PartialSum:
    """f as the kernels take it: a PartialSum they can sum as they load it stays one, any other is summed first."""
    return f if not isinstance(f, PartialSum) or f.fusable() else f.total()


def hc_post(f: torch.Tensor | PartialSum, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
            backend: str = kernels.REFERENCE) -> torch.Tensor:
    """The post side of a sub-layer: hc_expand of its output f [T, D] into the streams x [T, n, D]. f may be a
    tensor-parallel sum left to this op (ops/peer_sum.py): the kernel sums the ranks' partials as it loads them."""
    with family("mhc"):
        if backend == kernels.TRITON:
            from .kernels import mhc as mk

            if mk.supports(x):
                return mk.hc_post(_for_kernel(f), x, post, comb)
        return hc_expand(resolve(f), x, post, comb)


def hc_post_pre_reference(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                          fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
                          norm_eps: float, hc_eps: float, collapse_pre: torch.Tensor | None = None,
                          norm_weight: torch.Tensor | None = None, norm_eps2: float | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x = hc_expand(f, x, post, comb)
    return (x, *hc_pre_reference(x, fn, base, scale, n, iters, norm_eps, hc_eps, collapse_pre, norm_weight,
                                 norm_eps2))


def hc_post_pre(f: torch.Tensor | PartialSum, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int, norm_eps: float,
                hc_eps: float,
                collapse_pre: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                norm_eps2: float | None = None, backend: str = kernels.REFERENCE
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`hc_post(f, x, post, comb)` and then `hc_pre` of the new streams for the next sub-layer (its fn / base / scale,
    collapse_pre, norm) -> (the new streams [T, n, D], y, pre, post, comb): one launch on the fast path (the
    expansion's output feeds the next mixes from registers; a PartialSum f summed as it is loaded, as in hc_post)."""
    with family("mhc"):
        if backend == kernels.TRITON:
            from .kernels import mhc as mk

            if mk.supports(x, collapse_pre):
                return mk.hc_post_pre(_for_kernel(f), x, post, comb, fn, base, scale, n, iters, norm_eps, hc_eps, collapse_pre,
                                      norm_weight, norm_eps2)
        return hc_post_pre_reference(resolve(f), x, post, comb, fn, base, scale, n, iters, norm_eps, hc_eps,
                                     collapse_pre, norm_weight, norm_eps2)
