"""The FLOPs of one aten op, from the shapes of its tensors: what a simulated rank's clock charges for it.

Every op that does matrix work is priced by its own formula: torch's FLOP registry (torch.utils.flop_counter) where
it has one, else the formulas below, so that no way of writing a product is cheaper than another (addbmm, a fused
linear, a grouped or quantised matmul, an embedding bag with per-sample weights, cdist's matmul path, a
linear-algebra routine, an FFT); LayerNorm by the operations of its formula.
Composite ops (matmul, einsum, tensordot, F.linear, multi_dot, ...) reach a dispatch mode as the ops they are made of
(autograd decomposes them first; under inference mode the tracker does, `composite`). Any other op costs one FLOP per
element of the largest tensor it touches (elementwise ops, reductions), lib.sim.tracker.

Sources of the formulas: a product of (m, k) and (k, n) matrices is 2mkn, as torch's registry counts mm; the
linear-algebra routines count the leading terms of Golub & Van Loan, Matrix Computations (4th ed.): LU 2n³/3
(mn² - n³/3 for m × n), Cholesky n³/3, Householder QR 2mn² - 2n³/3 and forming its Q (LAPACK's orgqr) 4mnk -
2(m+n)k² + 4k³/3, triangular solves n² per right-hand side, the symmetric eigenproblem 4n³/3 (9n³ with vectors), the
unsymmetric one 10n³ (25n³ with vectors), the SVD 4mn² - 4n³/3 (14mn² + 8n³ with thin U and V, 4m²n + 8mn² + 9n³
with full ones); an FFT of n points 5 n log2 n (FFTW's convention, fftw.org/speed/method.html), half that for real
data; the matrix exponential as torch computes it (a Taylor polynomial of degree 1 to 18 chosen from the 1-norm, 0 to
5 products, then one squaring per halving of the norm; Bader, Blanes and Casas 2019).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch.utils.flop_counter import (conv_flop_count, flop_registry, sdpa_backward_flop_count, sdpa_flop_count,
                                      shape_wrapper)

aten = torch.ops.aten
BY_SHAPES, BY_TENSORS = 0, 1           # how a formula is called: with the tensors' shapes, or with the tensors
Formula = Callable[..., float]


def _batch(a: torch.Tensor) -> int:
    """How many matrices a (..., m, n) tensor holds."""
    return a.numel() // max(a.shape[-1] * a.shape[-2], 1)


def _of_ops_here(formulas: dict[str, Formula]) -> dict:
    """The formulas keyed by their ops (overload packets), for the ops this torch has."""
    return {getattr(aten, name): formula for name, formula in formulas.items() if hasattr(aten, name)}


# ---- products ---------------------------------------------------------------------------------------------------
def _product(a: torch.Tensor, columns: int) -> float:
    """2 per multiply-add of a (..., k) by a k × `columns` matrix: every row of `a` against every column."""
    return 2.0 * a.numel() * columns


def _grouped_mm(a, b, *args, out_val=None, **kwargs) -> float:
    """torch._grouped_mm: each output element is a product of length k; with two 2-D operands the groups split k."""
    groups = out_val.shape[0] if a.dim() == 2 and b.dim() == 2 else 1
    return 2.0 * out_val.numel() * a.shape[-1] / groups


def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, *args, **kwargs) -> float:
    """Σ over `sumdim` of i1·i2·i3, each unsqueezed at its expand dims (F.bilinear): 2 per point of the broadcast
    space, as the product of x1 and the weight then x2 costs."""
    sizes = [1] * (i1.dim() + len(expand1))
    for t, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        kept = iter(t.shape)
        for d in range(len(sizes)):
            if d not in expand:
                sizes[d] = max(sizes[d], next(kept))
    return 2.0 * math.prod(sizes)


def _attention(q, k, v, is_causal: bool) -> float:
    """The registry's count of attention (4·b·h·sq·sk·d), times the share of scores a causal mask leaves: the CPU
    flash kernel skips the masked tiles. is_causal aligns the mask top-left (query i sees keys 0..i)."""
    flops = sdpa_flop_count(q.shape, k.shape, v.shape)
    return flops * _causal_share(q.shape[-2], k.shape[-2]) if is_causal else flops


def _causal_share(sq: int, sk: int) -> float:
    """Query i sees min(i + 1, sk) keys: the first k = min(sq, sk) rows a triangle, the rest every key."""
    k = min(sq, sk)
    return (k * (k + 1) / 2 + (sq - k) * sk) / max(sq * sk, 1)


# Attention's FLOPs by its shapes: the registry's counts go through torch's shape wrapper (a tree_map per matmul,
# seven per backward), and a model's every layer and micro-batch asks again with the same shapes.
_ATTENTION: dict[tuple, float] = {}


def _attention_forward(q, k, v, dropout_p=0.0, is_causal=False, *args, **kwargs) -> float:
    key = (q.shape, k.shape, v.shape, bool(is_causal))
    flops = _ATTENTION.get(key)
    if flops is None:
        flops = _ATTENTION[key] = _attention(q, k, v, is_causal)
    return flops


def _attention_backward(grad, q, k, v, out, lse, dropout_p=0.0, is_causal=False, *args, **kwargs) -> float:
    key = (grad.shape, q.shape, k.shape, v.shape, bool(is_causal))
    flops = _ATTENTION.get(key)
    if flops is None:
        flops = sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape)
        flops = _ATTENTION[key] = flops * _causal_share(q.shape[-2], k.shape[-2]) if is_causal else flops
    return flops


def _multi_head_attention(query, key, value, embed_dim, *args, **kwargs) -> float:
    """nn.MultiheadAttention's fused path: q, k and v projections, scores and their weighted sum, the output
    projection."""
    e, s = embed_dim, key.shape[-2]
    return 4.0 * query.numel() * e + 4.0 * key.numel() * e + 4.0 * query.numel() * s


def _encoder_layer(src, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps, nw1, nb1,
                   nw2, nb2, ffn_w1, *args, **kwargs) -> float:
    """nn.TransformerEncoderLayer's fused path: self-attention as above (key = query) and the feed-forward."""
    return _multi_head_attention(src, src, src, embed_dim) + 4.0 * src.numel() * ffn_w1.shape[0]


# ---- linear algebra (Golub & Van Loan's leading terms, per matrix of the batch) ----------------------------------
def _lu(m: int, n: int) -> float:
    k, longest = min(m, n), max(m, n)
    return k * k * longest - k ** 3 / 3


def _qr(m: int, n: int) -> float:
    k, longest = min(m, n), max(m, n)
    return 2 * k * k * longest - 2 * k ** 3 / 3


def _form_q(m: int, n: int, k: int) -> float:
    """LAPACK's orgqr: an m × n Q from k reflectors."""
    return 4 * m * n * k - 2 * (m + n) * k * k + 4 * k ** 3 / 3


def _square(a: torch.Tensor, per_matrix: Callable[[int], float]) -> float:
    return _batch(a) * per_matrix(a.shape[-1])


def _factor(a, *args, **kwargs) -> float:
    """LU (and the determinant, which is its by-product)."""
    return _batch(a) * _lu(a.shape[-2], a.shape[-1])


def _solve_with_factors(factors, pivots, b, *args, **kwargs) -> float:
    """Forward and back substitution with triangular factors (LU's, LDLᵀ's): 2n² per right-hand side."""
    return 2.0 * factors.shape[-1] * b.numel()


def _solve(a, b, *args, **kwargs) -> float:
    return _factor(a) + 2.0 * a.shape[-1] * b.numel()


def _qr_routine(a, mode="reduced", *args, **kwargs) -> float:
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    formed = 0.0 if mode == "r" else _form_q(m, m if mode == "complete" else k, k)
    return _batch(a) * (_qr(m, n) + formed)


def _householder_product(a, tau, *args, **kwargs) -> float:
    return _batch(a) * _form_q(a.shape[-2], a.shape[-1], tau.shape[-1])


def _apply_q(a, tau, c, left=True, transpose=False, *args, **kwargs) -> float:
    """LAPACK's ormqr: Q (k reflectors) applied to C from the left (4nmk - 2nk²) or from the right (4mnk - 2mk²)."""
    m, n, k = c.shape[-2], c.shape[-1], tau.shape[-1]
    return _batch(c) * (4 * m * n * k - 2 * (n if left else m) * k * k)


def _svd_of(m: int, n: int, vectors: bool, full: bool) -> float:
    m, n = max(m, n), min(m, n)
    if not vectors:
        return 4 * m * n * n - 4 * n ** 3 / 3
    return 4 * m * m * n + 8 * m * n * n + 9 * n ** 3 if full else 14 * m * n * n + 8 * n ** 3


def _svd(a, full_matrices=False, compute_uv=True, *args, **kwargs) -> float:
    return _batch(a) * _svd_of(a.shape[-2], a.shape[-1], compute_uv, full_matrices)


def _eigh(a, uplo="L", compute_v=True, *args, **kwargs) -> float:
    return _square(a, lambda n: (9 if compute_v else 4 / 3) * n ** 3)


def _pseudo_inverse(a, *args, **kwargs) -> float:
    """An SVD (an eigendecomposition if hermitian) and the product that rebuilds A⁺ from it."""
    hermitian = kwargs.get("hermitian", args[1] if len(args) > 1 else False)
    m, n = a.shape[-2], a.shape[-1]
    factor = 9 * n ** 3 if hermitian else _svd_of(m, n, vectors=True, full=False)
    return _batch(a) * (factor + 2 * m * n * min(m, n))


def _least_squares(a, b, *args, **kwargs) -> float:
    """QR of A (m × n), Qᵀ applied to B's k columns, and the triangular solve."""
    m, n = a.shape[-2], a.shape[-1]
    k = b.shape[-1] if b.dim() == a.dim() else 1
    return _batch(a) * (_qr(m, n) + 4 * m * n * k + n * n * k)


# The matrix exponential: torch's Taylor degrees, the products each needs and the 1-norm up to which each is used
# (float32 and float64 thresholds), from aten/src/ATen/native/LinearAlgebra.cpp.
_EXP_PRODUCTS = (0, 1, 2, 3, 4, 5)
_EXP_THETAS = {torch.float32: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                               5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00),
               torch.float64: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                               4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00)}


def _matrix_exp(a, *args, **kwargs) -> float:
    """Per matrix, the products of the Taylor degree its 1-norm calls for and one squaring per halving beyond."""
    thetas = _EXP_THETAS.get(a.dtype, _EXP_THETAS[torch.float64])
    with torch.no_grad():
        norms = torch._C.TensorBase.tolist(a.detach().abs().sum(-2).amax(-1).reshape(-1))   # not the rank's own
    products = 0
    for norm in norms:
        degree = next((i for i, theta in enumerate(thetas) if norm <= theta), None)
        if degree is None:
            products += _EXP_PRODUCTS[-1] + math.ceil(math.log2(norm / thetas[-1]))
        else:
            products += _EXP_PRODUCTS[degree]
    return 2.0 * products * a.shape[-1] ** 3


# ---- FFTs: 5 n log2 n per complex transform of n points, half for real data ----------------------------------------
def _points(shape, dims) -> int:
    return math.prod(shape[d] for d in dims)


def _fft_complex(x, dim, *args, **kwargs) -> float:
    return 5.0 * x.numel() * math.log2(max(_points(x.shape, dim), 1))


def _fft_real_in(x, dim, *args, **kwargs) -> float:
    return 2.5 * x.numel() * math.log2(max(_points(x.shape, dim), 1))


def _fft_real_out(x, dim, *args, out_val=None, **kwargs) -> float:
    return 2.5 * out_val.numel() * math.log2(max(_points(out_val.shape, dim), 1))


# ---- convolutions the registry does not list, by its own formula ------------------------------------------------
def _convolution(x, w, *args, out_val=None, **kwargs) -> float:
    return conv_flop_count(x.shape, w.shape, out_val.shape, transposed=False)


def _transposed_convolution(x, w, *args, out_val=None, **kwargs) -> float:
    return conv_flop_count(x.shape, w.shape, out_val.shape, transposed=True)


def _convolution_backward(grad, x, w, *args, **kwargs) -> float:
    """The input's and the weight's gradients: each costs what the forward did."""
    return 2.0 * conv_flop_count(x.shape, w.shape, grad.shape, transposed=False)


def _time_batch_channel_convolution(x, w, *args, out_val=None, **kwargs) -> float:
    """conv_tbc: x (time, batch, in), w (kernel, in, out)."""
    return 2.0 * out_val.numel() * w.shape[0] * w.shape[1]


# ---- embedding bags: a sparse product, each index's row scaled (by its per-sample weight) and added to its bag ------
# F.embedding_bag(indices, weight, per_sample_weights=a) over every index of k rows is a matrix product of a and
# weight: priced by the elements of its largest tensor, it cost 1/128 of the same product written with mm at 64³.
def _bag_rows(indices, weight_columns: int, weighted) -> float:
    """Each index adds a row of `weight_columns` into its bag: one FLOP per element, two with per-sample weights."""
    return (2.0 if weighted is not None else 1.0) * indices.numel() * weight_columns


def _argument(args: tuple, kwargs: dict, position: int, name: str):
    return args[position] if len(args) > position else kwargs.get(name)


def _embedding_bag(weight, indices, offsets, *args, **kwargs) -> float:
    return _bag_rows(indices, weight.shape[-1], _argument(args, kwargs, 3, "per_sample_weights"))


def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, *args, **kwargs) -> float:
    return _bag_rows(indices, grad.shape[-1], _argument(args, kwargs, 4, "per_sample_weights"))


def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, *args, **kwargs) -> float:
    return _bag_rows(indices, grad.shape[-1], _argument(args, kwargs, 3, "per_sample_weights"))


def _embedding_bag_weights_backward(grad, weight, indices, *args, **kwargs) -> float:
    """Each per-sample weight's gradient: its row of `weight` dotted with its bag's gradient."""
    return 2.0 * indices.numel() * weight.shape[-1]


# ---- normalisation: per element, the operations of its formula -------------------------------------------------
# LayerNorm's forward: the mean, the deviation, its square, the variance and the scaling (5), and the affine weight and
# bias (2) where given; its backward: the input's gradient rstd·(g - mean(g) - x̂·mean(g·x̂)) (7), and the weight's and
# bias's (2). One FLOP per element would make the norm a fifth of its work, and replicating it (a norm run on the whole
# gathered sequence instead of this rank's tokens) close to free.
def _layer_norm(x, shape, weight=None, bias=None, *args, **kwargs) -> float:
    return (5.0 + 2 * (weight is not None)) * x.numel()


def _layer_norm_backward(grad, x, *args, **kwargs) -> float:
    return 9.0 * x.numel()


def _rnn_layer(x, w_ih, w_hh, *args, **kwargs) -> float:
    """One recurrent layer (LSTM, GRU, RNN on CPU): each step's input and hidden state times the gate weights."""
    return 2.0 * (x.numel() / x.shape[-1]) * (w_ih.numel() + w_hh.numel())


# Ops torch's registry leaves out, with their formulas; each is called with the op's tensors (and out_val=). Named,
# not looked up, here: the table holds ops of the pinned torch, and an older one lacks some (torch 2.11, on GPU
# images, has no _foreach_mm).
_FORMULAS: dict = _of_ops_here({
    "mv": lambda a, b, *_, **__: 2.0 * a.numel(),
    "addmv": lambda c, a, b, *_, **__: 2.0 * a.numel(),
    "addr": lambda c, u, v, *_, **__: 2.0 * u.numel() * v.numel(),
    "dot": lambda a, b, *_, **__: 2.0 * a.numel(),
    "vdot": lambda a, b, *_, **__: 2.0 * a.numel(),
    "addbmm": lambda c, a, b, *_, **__: _product(a, b.shape[-1]),
    "_addmm_activation": lambda c, a, b, *_, **__: _product(a, b.shape[-1]),
    "_int_mm": lambda a, b, *_, **__: _product(a, b.shape[-1]),
    "_scaled_mm_v2": lambda a, b, *_, **__: _product(a, b.shape[-1]),
    "_weight_int8pack_mm": lambda a, b, *_, **__: _product(a, b.shape[0]),
    "_weight_int4pack_mm_for_cpu": lambda a, *_, out_val=None, **__: _product(a, out_val.shape[-1]),
    "_dyn_quant_matmul_4bit": lambda a, w, block, n_in, n_out, *_, **__: _product(a, n_out),
    "linear": lambda x, w, *_, **__: _product(x, w.shape[0] if w.dim() == 2 else 1),
    "linear_backward": lambda x, grad, w, *_, **__: 2 * _product(x, w.shape[0] if w.dim() == 2 else 1),
    "matmul_backward": lambda grad, a, b, *_, **__: 2.0 * _product(grad, a.shape[-1]),
    "_grouped_mm": _grouped_mm,
    "_foreach_mm": lambda a, b, *_, **__: sum(_product(x, y.shape[-1]) for x, y in zip(a, b)),
    "_compute_linear_combination": lambda x, c, *_, out_val=None, **__: 2.0 * out_val.numel() * x.shape[0],
    "_trilinear": _trilinear,
    "_euclidean_dist": lambda x1, x2, *_, **__: _product(x1, x2.shape[-2]) + 3.0 * (x1.numel() + x2.numel()),
    "_embedding_bag": _embedding_bag, "_embedding_bag_forward_only": _embedding_bag,
    "_embedding_bag_backward": _embedding_bag_backward,
    "_embedding_bag_dense_backward": _embedding_bag_dense_backward,
    "_embedding_bag_per_sample_weights_backward": _embedding_bag_weights_backward,
    "_cdist_forward": lambda x1, x2, *_, out_val=None, **__: 3.0 * out_val.numel() * x1.shape[-1],
    "_cdist_backward": lambda grad, x1, *_, **__: 4.0 * grad.numel() * x1.shape[-1],
    "_pdist_forward": lambda x, *_, out_val=None, **__: 3.0 * out_val.numel() * x.shape[-1],
    "_pdist_backward": lambda grad, x, *_, **__: 4.0 * grad.numel() * x.shape[-1],
    "mkldnn_rnn_layer": _rnn_layer,
    "mkldnn_rnn_layer_backward": lambda x, w_ih, w_hh, *_, **__: 2 * _rnn_layer(x, w_ih, w_hh),
    "_scaled_dot_product_flash_attention_for_cpu": _attention_forward,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward,
    "_native_multi_head_attention": _multi_head_attention,
    "_transformer_encoder_layer_fwd": _encoder_layer,
    "linalg_lu_factor_ex": _factor, "linalg_lu": _factor, "_linalg_det": _factor,
    "_linalg_slogdet": _factor,
    "linalg_lu_solve": _solve_with_factors, "linalg_ldl_solve": _solve_with_factors,
    "cholesky_solve": lambda b, factor, *_, **__: 2.0 * factor.shape[-1] * b.numel(),
    "_cholesky_solve_helper": lambda b, factor, *_, **__: 2.0 * factor.shape[-1] * b.numel(),
    "_linalg_solve_ex": _solve,
    "linalg_inv_ex": lambda a, *_, **__: _square(a, lambda n: 2 * n ** 3),
    "linalg_cholesky_ex": lambda a, *_, **__: _square(a, lambda n: n ** 3 / 3),
    "cholesky": lambda a, *_, **__: _square(a, lambda n: n ** 3 / 3),
    "linalg_ldl_factor_ex": lambda a, *_, **__: _square(a, lambda n: n ** 3 / 3),
    "cholesky_inverse": lambda a, *_, **__: _square(a, lambda n: 2 * n ** 3 / 3),
    "linalg_solve_triangular": lambda a, b, *_, **__: float(a.shape[-1]) * b.numel(),
    "triangular_solve": lambda b, a, *_, **__: float(a.shape[-1]) * b.numel(),
    "geqrf": lambda a, *_, **__: _batch(a) * _qr(a.shape[-2], a.shape[-1]),
    "linalg_qr": _qr_routine,
    "linalg_householder_product": _householder_product,
    "ormqr": _apply_q,
    "_linalg_svd": _svd,
    "_linalg_eigh": _eigh,
    "linalg_eig": lambda a, *_, **__: _square(a, lambda n: 25 * n ** 3),
    "linalg_eigvals": lambda a, *_, **__: _square(a, lambda n: 10 * n ** 3),
    "_linalg_eigvals": lambda a, *_, **__: _square(a, lambda n: 10 * n ** 3),
    "linalg_pinv": _pseudo_inverse,
    "linalg_lstsq": _least_squares,
    "linalg_matrix_exp": _matrix_exp,
    "_fft_c2c": _fft_complex, "_fft_r2c": _fft_real_in, "_fft_c2r": _fft_real_out,
    "slow_conv3d_forward": _convolution, "slow_conv_dilated2d": _convolution,
    "slow_conv_dilated3d": _convolution, "mkldnn_convolution": _convolution,
    "_nnpack_spatial_convolution": _convolution,
    "slow_conv_transpose2d": _transposed_convolution, "slow_conv_transpose3d": _transposed_convolution,
    "_slow_conv2d_backward": _convolution_backward,
    "conv_tbc": _time_batch_channel_convolution,
    "native_layer_norm": _layer_norm, "native_layer_norm_backward": _layer_norm_backward,
})
# torch's addmm and baddbmm formulas return mm's and bmm's of their two matrices, called through mm's and bmm's
# shape wrapper (a tree_map, ten times the rest of the op's accounting): the same formulas, given the shapes.
_OF_TWO_MATRICES = {aten.addmm: aten.mm, aten.baddbmm: aten.bmm}
_SHAPE_WRAPPER = shape_wrapper(lambda: None).__code__     # the code of torch's wrapper around a shape formula


def composite(func) -> bool:
    """Whether an op (an OpOverload) is made of other ops (CompositeImplicitAutograd): matmul, einsum, F.linear,
    attention's math. Autograd decomposes them before a dispatch mode sees them, except where autograd is off for the
    tensors (torch.inference_mode()): there the tracker decomposes them itself, so that their parts are priced, not
    the whole as one FLOP per element."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def priced() -> frozenset:
    """The ops (overload packets) priced by a formula of their own: the registry's and this module's, and their
    in-place twins."""
    known = frozenset(flop_registry) | frozenset(_FORMULAS)
    return known | {getattr(aten, f"{p.__name__}_") for p in known if hasattr(aten, f"{p.__name__}_")}


def formula_of(packet) -> tuple[Optional[Formula], int]:
    """The FLOP formula of an op (its overload packet) and how to call it (BY_SHAPES or BY_TENSORS); (None, ...)
    for an op without one, which lib.sim.tracker prices by the elements it touches. An in-place op (addmm_) has its
    out-of-place twin's formula: the same arguments, the same work."""
    packet = _out_of_place(packet)
    own = _FORMULAS.get(packet)
    if own is not None:
        return own, BY_TENSORS
    counter = flop_registry.get(packet)
    # Most of the registry's formulas take shapes; torch wraps them to make the shapes from the tensors (a tree_map
    # per call, a third of the simulator's time per op): call them with shapes directly.
    if _shape_wrapped(counter):
        return _of_shapes(packet, counter), BY_SHAPES
    return counter, BY_TENSORS


def _out_of_place(packet):
    name = packet.__name__
    if name.endswith("_") and not name.endswith("__"):
        return getattr(aten, name[:-1], packet)
    return packet


def flops_of(formula: Formula, kind: int, args: tuple, kwargs: dict, out) -> float:
    """FLOPs of one op run on `args`, `kwargs` with result `out`, by its formula_of."""
    if kind == BY_TENSORS:
        return formula(*args, **kwargs, out_val=out)
    if kwargs:
        return formula(*map(_shape, args), out_shape=_shape(out), **{k: _shape(v) for k, v in kwargs.items()})
    return formula(*map(_shape, args), out_shape=_shape(out))


def _shape_wrapped(formula) -> bool:
    """Whether `formula` is torch's shape wrapper around a formula of shapes."""
    return getattr(formula, "__code__", None) is _SHAPE_WRAPPER and hasattr(formula, "__wrapped__")


def _of_shapes(packet, wrapped: Callable) -> Callable:
    """The formula of shapes inside torch's `wrapped` one; for addmm and baddbmm, mm's and bmm's of their matrices."""
    inner = flop_registry.get(_OF_TWO_MATRICES.get(packet))
    if _shape_wrapped(inner):
        of_matrices = inner.__wrapped__
        return lambda _input, a, b, *_, **__: of_matrices(a, b)
    return wrapped.__wrapped__


def _shape(x):
    if isinstance(x, torch.Tensor):
        return x.shape
    if isinstance(x, (list, tuple)):
        return [_shape(i) for i in x] if isinstance(x, list) else tuple(_shape(i) for i in x)
    return x
