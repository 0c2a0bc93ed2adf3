"""Every op a rank can run that does matrix work is priced from its shapes (lib.sim.flops), within 20% of its FLOPs:
no way of writing a product, an attention or a factorisation costs one FLOP per output element, as ops unknown to
torch's FLOP registry used to (addbmm let zigzag attention compute every tile and mask the future for free)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lib.checker.measure import counted_flops
from lib.sim.flops import priced

aten = torch.ops.aten
M, K, N, B = 24, 16, 20, 3          # a product's rows, contraction and columns, and a batch
S = 32                               # a square matrix's size


def _r(*shape, dtype=torch.float64):
    return torch.randn(*shape, generator=_GEN, dtype=dtype)


_GEN = torch.Generator().manual_seed(0)


def _spd(n: int) -> torch.Tensor:
    a = _r(n, n)
    return a @ a.T + n * torch.eye(n, dtype=torch.float64)


def _mm(m, k, n, batch=1) -> float:
    return 2.0 * batch * m * k * n


def _einsum(spec: str, *operands) -> float:
    """2 per point of the space of every index (a two-operand contraction as its multiply-adds)."""
    sizes = {}
    for labels, t in zip(spec.split("->")[0].split(","), operands):
        sizes.update(zip(labels, t.shape))
    return 2.0 * math.prod(sizes.values())


# Golub & Van Loan's leading terms (Matrix Computations, 4th ed.), n × n unless said: written here from the book, not
# from lib.sim.flops.
LU, CHOLESKY, INVERSE = 2 * S**3 / 3, S**3 / 3, 2 * S**3
QR = 2 * M * K**2 - 2 * K**3 / 3                          # an M × K matrix, Householder
EIGH_VALUES, EIGH_VECTORS, EIG_VALUES, EIG_VECTORS = 4 * S**3 / 3, 9 * S**3, 10 * S**3, 25 * S**3
SVD_VALUES, SVD_THIN = 4 * M * K**2 - 4 * K**3 / 3, 14 * M * K**2 + 8 * K**3

# (what a learner writes, its inputs, its FLOPs)
CALLS = {
    "mm": (lambda a, b: a @ b, (_r(M, K), _r(K, N)), _mm(M, K, N)),
    "matmul of 1-D vectors (dot)": (lambda a, b: a @ b, (_r(K), _r(K)), 2 * K),
    "matmul, matrix by vector (mv)": (lambda a, b: a @ b, (_r(M, K), _r(K)), _mm(M, K, 1)),
    "matmul, vector by matrix": (lambda a, b: a @ b, (_r(K), _r(K, N)), _mm(1, K, N)),
    "matmul, 3-D by 2-D": (lambda a, b: a @ b, (_r(B, M, K), _r(K, N)), _mm(M, K, N, B)),
    "matmul, 2-D by 3-D": (lambda a, b: a @ b, (_r(M, K), _r(B, K, N)), _mm(M, K, N, B)),
    "matmul, 4-D broadcast": (lambda a, b: a @ b, (_r(2, 1, M, K), _r(B, K, N)), _mm(M, K, N, 2 * B)),
    "bmm": (torch.bmm, (_r(B, M, K), _r(B, K, N)), _mm(M, K, N, B)),
    "addmm": (torch.addmm, (_r(M, N), _r(M, K), _r(K, N)), _mm(M, K, N)),
    "addmm_, in place": (lambda c, a, b: c.addmm_(a, b), (_r(M, N), _r(M, K), _r(K, N)), _mm(M, K, N)),
    "addbmm_, in place": (lambda c, a, b: c.addbmm_(a, b), (_r(M, N), _r(B, M, K), _r(B, K, N)), _mm(M, K, N, B)),
    "baddbmm_, in place": (lambda c, a, b: c.baddbmm_(a, b), (_r(B, M, N), _r(B, M, K), _r(B, K, N)),
                           _mm(M, K, N, B)),
    "addmv_, in place": (lambda c, a, b: c.addmv_(a, b), (_r(M), _r(M, K), _r(K)), _mm(M, K, 1)),
    "addr_, in place": (lambda c, a, b: c.addr_(a, b), (_r(M, N), _r(M), _r(N)), _mm(M, 1, N)),
    "addbmm": (torch.addbmm, (_r(M, N), _r(B, M, K), _r(B, K, N)), _mm(M, K, N, B)),
    "baddbmm": (torch.baddbmm, (_r(B, M, N), _r(B, M, K), _r(B, K, N)), _mm(M, K, N, B)),
    "addmv": (torch.addmv, (_r(M), _r(M, K), _r(K)), _mm(M, K, 1)),
    "addr": (torch.addr, (_r(M, N), _r(M), _r(N)), _mm(M, 1, N)),
    "mv": (torch.mv, (_r(M, K), _r(K)), _mm(M, K, 1)),
    "dot": (torch.dot, (_r(K), _r(K)), 2 * K),
    "vdot": (torch.vdot, (_r(K), _r(K)), 2 * K),
    "inner": (torch.inner, (_r(M, K), _r(N, K)), _mm(M, K, N)),
    "outer": (torch.outer, (_r(M), _r(N)), M * N),
    "einsum, batched": (lambda a, b: torch.einsum("bik,bkj->bij", a, b), (_r(B, M, K), _r(B, K, N)),
                        _mm(M, K, N, B)),
    "einsum, attention scores": (lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k), (_r(2, B, M, K), _r(2, B, N, K)),
                                 _mm(M, K, N, 2 * B)),
    "einsum, three operands": (lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c), (_r(M, K), _r(K, N), _r(N, 8)),
                               _mm(M, K, N) + _mm(M, N, 8)),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])), (_r(B, M, K), _r(M, K, N)),
                  _einsum("amk,mkn->an", _r(B, M, K), _r(M, K, N))),
    # multi_dot multiplies in the cheapest order: B·C first here
    "linalg.multi_dot": (lambda a, b, c: torch.linalg.multi_dot([a, b, c]), (_r(M, K), _r(K, N), _r(N, 8)),
                         _mm(K, N, 8) + _mm(M, K, 8)),
    "linalg.matrix_power": (lambda a: torch.linalg.matrix_power(a, 4), (_r(S, S),), 2 * _mm(S, S, S)),
    "F.linear": (F.linear, (_r(B, M, K), _r(N, K), _r(N)), _mm(M, K, N, B)),
    "F.bilinear": (F.bilinear, (_r(M, K), _r(M, 8), _r(N, K, 8), _r(N)), 2.0 * M * N * K * 8),
    "cdist": (torch.cdist, (_r(M, K), _r(N, K)), 3.0 * M * N * K),
    "conv1d": (F.conv1d, (_r(2, 4, 50), _r(6, 4, 5)), 2.0 * 2 * 6 * 46 * 4 * 5),
    "conv2d": (F.conv2d, (_r(2, 4, 12, 12), _r(6, 4, 3, 3)), 2.0 * 2 * 6 * 10 * 10 * 4 * 9),
    "conv_tbc": (torch.conv_tbc, (_r(30, 2, 4), _r(5, 4, 6), _r(6)), 2.0 * 26 * 2 * 6 * 4 * 5),
    "scaled_dot_product_attention": (F.scaled_dot_product_attention, (_r(2, B, M, K), _r(2, B, N, K), _r(2, B, N, K)),
                                     2 * _mm(M, K, N, 2 * B)),
    "scaled_dot_product_attention, causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (_r(2, B, M, K), _r(2, B, M, K), _r(2, B, M, K)), 2 * 2.0 * 2 * B * K * M * (M + 1) / 2),
    "_grouped_mm, 2-D by 3-D": (lambda a, b: torch._grouped_mm(a, b, offs=torch.tensor([8, 16, 24], dtype=torch.int32)),
                                (_r(24, 16, dtype=torch.float32), _r(3, 16, 8, dtype=torch.float32)),
                                _mm(24, 16, 8)),
    "_grouped_mm, 2-D by 2-D": (
        lambda a, b: torch._grouped_mm(a, b, offs=torch.tensor([16, 32, 48], dtype=torch.int32)),
        (_r(8, 48, dtype=torch.float32), _r(48, 8, dtype=torch.float32)), _mm(8, 48, 8)),
    "_grouped_mm, 3-D by 3-D": (torch._grouped_mm, (_r(3, 8, 16, dtype=torch.float32), _r(3, 16, 8,
                                                                                         dtype=torch.float32)),
                                _mm(8, 16, 8, 3)),
    "_foreach_mm": (lambda a, b: torch._foreach_mm([a, a], [b, b]), (_r(M, K), _r(K, N)), 2 * _mm(M, K, N)),
    "_int_mm": (torch._int_mm, (torch.ones(32, 32, dtype=torch.int8), torch.ones(32, 16, dtype=torch.int8)),
                _mm(32, 32, 16)),
    "_weight_int8pack_mm": (torch.ops.aten._weight_int8pack_mm,
                            (_r(M, 32, dtype=torch.float32), torch.ones(N, 32, dtype=torch.int8),
                             torch.ones(N, dtype=torch.float32)), _mm(M, 32, N)),
    "multi-head attention, fused path": (
        lambda q, w, b, pw, pb: torch.ops.aten._native_multi_head_attention(q, q, q, 16, 2, w, b, pw, pb)[0],
        (_r(2, 10, 16), _r(48, 16), _r(48), _r(16, 16), _r(16)),
        2 * 2 * 10 * 16 * 16 * 4 + 2 * _mm(10, 16, 10, 2)),
    "linalg.solve": (torch.linalg.solve, (_spd(S), _r(S, 4)), LU + 2 * S * S * 4),
    "linalg.inv": (torch.linalg.inv, (_spd(S),), INVERSE),
    "linalg.det": (torch.linalg.det, (_spd(S),), LU),
    "linalg.slogdet": (torch.linalg.slogdet, (_spd(S),), LU),
    "linalg.lu_factor": (torch.linalg.lu_factor, (_r(S, S),), LU),
    "linalg.lu": (torch.linalg.lu, (_r(S, S),), LU),
    "linalg.lu_solve": (lambda lu, piv, b: torch.linalg.lu_solve(lu, piv, b), (*torch.linalg.lu_factor(_spd(S)),
                                                                             _r(S, 4)), 2 * S * S * 4),
    "linalg.cholesky": (torch.linalg.cholesky, (_spd(S),), CHOLESKY),
    "cholesky_solve": (torch.cholesky_solve, (_r(S, 4), torch.linalg.cholesky(_spd(S))), 2 * S * S * 4),
    "cholesky_inverse": (torch.cholesky_inverse, (torch.linalg.cholesky(_spd(S)),), 2 * S**3 / 3),
    "linalg.solve_triangular": (lambda a, b: torch.linalg.solve_triangular(a, b, upper=True),
                                (torch.linalg.cholesky(_spd(S)).T.contiguous(), _r(S, 4)), S * S * 4),
    "triangular_solve": (lambda b, a: torch.triangular_solve(b, a).solution,
                         (_r(S, 4), torch.linalg.cholesky(_spd(S)).T.contiguous()), S * S * 4),
    "linalg.ldl_factor": (torch.linalg.ldl_factor, (_spd(S),), CHOLESKY),
    "geqrf": (torch.geqrf, (_r(M, K),), QR),
    "linalg.qr, R only": (lambda a: torch.linalg.qr(a, mode="r"), (_r(M, K),), QR),
    "linalg.qr, thin Q": (torch.linalg.qr, (_r(M, K),), 2 * QR),
    "linalg.householder_product": (torch.linalg.householder_product, torch.geqrf(_r(M, K)), QR),
    "ormqr": (lambda a, tau, c: torch.ormqr(a, tau, c), (*torch.geqrf(_r(M, K)), _r(M, N)),
              4 * N * M * K - 2 * N * K * K),
    # Under a dispatch mode (a rank's tracker) torch computes the singular and eigenvectors even for values alone
    # (it takes the mode's tensors for a subclass that may want a gradient): priced as computed.
    "linalg.svdvals": (torch.linalg.svdvals, (_r(M, K),), SVD_THIN),
    "linalg.svd, thin": (lambda a: torch.linalg.svd(a, full_matrices=False), (_r(M, K),), SVD_THIN),
    "linalg.svd, full": (torch.linalg.svd, (_r(M, K),), 4 * M * M * K + 8 * M * K * K + 9 * K**3),
    "linalg.eigvalsh": (torch.linalg.eigvalsh, (_spd(S),), EIGH_VECTORS),
    "linalg.eigh": (torch.linalg.eigh, (_spd(S),), EIGH_VECTORS),
    "linalg.eigvals": (torch.linalg.eigvals, (_r(S, S),), EIG_VECTORS),
    "_linalg_svd, values only": (lambda a: aten._linalg_svd(a, False, False)[1], (_r(M, K),), SVD_VALUES),
    "_linalg_eigh, values only": (lambda a: aten._linalg_eigh(a, "L", False)[0], (_spd(S),), EIGH_VALUES),
    "_linalg_eigvals": (aten._linalg_eigvals, (_r(S, S),), EIG_VALUES),
    "linalg.eig": (torch.linalg.eig, (_r(S, S),), EIG_VECTORS),
    "linalg.pinv": (torch.linalg.pinv, (_r(M, K),), SVD_THIN + 2 * M * K * K),
    "linalg.lstsq": (lambda a, b: torch.linalg.lstsq(a, b).solution, (_r(M, K), _r(M, 4)),
                     QR + 4 * M * K * 4 + K * K * 4),
    # the 1-norm of 0.2·I is 0.2, under float64's degree-12 threshold (0.2996): a polynomial of 4 products
    "linalg.matrix_exp, small norm": (torch.linalg.matrix_exp, (0.2 * torch.eye(S, dtype=torch.float64),),
                                      4 * _mm(S, S, S)),
    # 8·I: degree 18 (5 products) on the matrix scaled by 2^-3, then 3 squarings
    "linalg.matrix_exp, large norm": (torch.linalg.matrix_exp, (8 * torch.eye(S, dtype=torch.float64),),
                                      8 * _mm(S, S, S)),
    # LayerNorm: the mean, the deviation, its square, the variance, the scaling; the affine weight and bias
    "F.layer_norm": (lambda x: F.layer_norm(x, x.shape[-1:]), (_r(B, M, K),), 5 * B * M * K),
    "F.layer_norm, affine": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), (_r(B, M, K), _r(K), _r(K)),
                             7 * B * M * K),
    "fft.fft": (torch.fft.fft, (_r(B, 64, dtype=torch.complex128),), 5 * B * 64 * 6),
    "fft.rfft": (torch.fft.rfft, (_r(B, 64),), 2.5 * B * 64 * 6),
    "fft.irfft": (lambda x: torch.fft.irfft(x, n=64), (_r(B, 33, dtype=torch.complex128),), 2.5 * B * 64 * 6),
    # A matrix product written as an embedding bag: row i of the output adds the K rows of b, weighted by a's row i.
    "F.embedding_bag, per-sample weights": (
        lambda a, b: F.embedding_bag(torch.arange(K).repeat(M, 1), b, mode="sum", per_sample_weights=a),
        (_r(M, K), _r(K, N)), _mm(M, K, N)),
    "F.embedding_bag, its backward": (
        lambda a, b: F.embedding_bag(torch.arange(K).repeat(M, 1), b.requires_grad_(), mode="sum",
                                     per_sample_weights=a.requires_grad_()).sum().backward(),
        (_r(M, K), _r(K, N)), 3 * _mm(M, K, N)),
    "cdist, its matmul path": (torch.cdist, (_r(30, K), _r(N, K)), _mm(30, K, N)),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_an_op_is_priced_within_20_percent_of_its_flops(name):
    fn, args, flops = CALLS[name]
    _, counted = counted_flops(lambda: fn(*args))
    assert 0.8 * flops <= counted <= 1.2 * flops, f"{name}: counted {counted:,.0f}, its FLOPs {flops:,.0f}"


def test_a_product_is_priced_the_same_whichever_op_writes_it():
    """The cheat issue 32 found: zigzag attention computing every tile through addbmm paid one FLOP per output
    element. Every spelling of the same product now costs the same."""
    a, b, c = _r(B, M, K), _r(B, K, N), _r(M, N)
    spellings = [lambda: (a @ b).sum(0), lambda: torch.addbmm(c, a, b), lambda: torch.baddbmm(c, a, b).sum(0),
                 lambda: torch.einsum("bik,bkj->ij", a, b), lambda: torch.tensordot(a.transpose(0, 1), b, 2)]
    counts = [counted_flops(f)[1] for f in spellings]
    assert max(counts) <= 1.2 * min(counts) and min(counts) >= _mm(M, K, N, B), counts


@pytest.mark.parametrize("name", ["matmul, 3-D by 2-D", "einsum, batched", "tensordot", "F.linear", "F.bilinear",
                                  "scaled_dot_product_attention", "linalg.solve", "linalg.svdvals"])
def test_inference_mode_prices_a_composite_op_by_its_parts(name):
    """Under torch.inference_mode() a composite op (matmul, einsum, F.linear, attention) reaches the tracker whole,
    where autograd would have decomposed it: the tracker decomposes it, and it costs what it costs outside."""
    fn, args, flops = CALLS[name]
    args = tuple(a.clone() for a in args)

    def inside():
        with torch.inference_mode():
            return fn(*args)
    assert counted_flops(inside)[1] == pytest.approx(counted_flops(lambda: fn(*args))[1], rel=0.2)


# ---- every aten op that does matrix work and can reach a rank's tracker has a formula ------------------------------
# Words of an op's name that say it does matrix work (matched against the name's parts between underscores).
MATRIX_WORDS = {"mm", "bmm", "addmm", "addbmm", "baddbmm", "mv", "addmv", "dot", "vdot", "addr", "linalg", "cholesky",
                "triangular", "lu", "qr", "svd", "eigh", "eig", "eigvals", "trilinear", "cdist", "ormqr", "geqrf",
                "matrix", "linear", "solve", "inverse", "det", "slogdet", "pinv", "lstsq", "householder", "ldl",
                "transformer", "combination", "fft", "c2c", "r2c", "c2r", "attention", "tbc", "convolution",
                "conv2d", "conv3d", "dilated2d", "dilated3d", "transpose2d", "transpose3d", "depthwise3d",
                "depthwise2d", "matmul", "spmm", "hspmm", "sspaddmm"}


def _named_like_matrix_work(name: str) -> bool:
    return any(part in MATRIX_WORDS for part in name.split("_"))


# Named like matrix work, but elementwise or bookkeeping (priced per element, as they should be).
NOT_MATRIX_WORK = {"linalg_vector_norm", "linalg__powsum", "linalg_cross", "lu_unpack", "_linalg_check_errors",
                   "fft_fftfreq", "fft_rfftfreq", "slice_inverse"}
# Reachable in no simulated rank: a CPU call raises (GPU, MPS or private-backend kernels behind an explicit .out), or
# the op takes a layout a rank cannot hold (sparse and MKL-DNN tensors have no storage the tracker can count).
UNREACHABLE = {
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_fused_attention_overrideable_backward",
    "convolution_backward_overrideable", "_triton_multi_head_attention", "_triton_scaled_dot_attention",
    "conv_depthwise3d", "miopen_convolution", "miopen_convolution_transpose", "miopen_depthwise_convolution",
    "cudnn_convolution_add_relu", "cudnn_convolution_relu", "cudnn_convolution_transpose", "_mps_convolution",
    "_mps_convolution_transpose", "mps_convolution_backward", "mps_convolution_transpose_backward",
    "mkldnn_linear", "mkldnn_linear_backward", "mkldnn_linear_backward_input", "mkldnn_linear_backward_weights",
    "_sparse_addmm", "hspmm", "sspaddmm", "sparse_sampled_addmm", "_sparse_sparse_matmul", "_sparse_mm_reduce_impl",
    "_sparse_mm_reduce_impl_backward", "mkldnn_reorder_conv2d_weight", "mkldnn_reorder_conv3d_weight"}
KERNELS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "SparseCPU",
           "SparseCsrCPU", "MkldnnCPU")


def _reaching_a_dispatch_mode() -> set[str]:
    """The aten ops (by packet name) named like matrix work with an overload a Python dispatch mode sees on a CPU: a
    kernel of their own rather than a decomposition into other ops (CompositeImplicitAutograd)."""
    found = set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::") or not _named_like_matrix_work(schema.name[len("aten::"):]):
            continue
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        if not _has_kernel(name, "CompositeImplicitAutograd") and any(_has_kernel(name, k) for k in KERNELS):
            found.add(schema.name[len("aten::"):])
    return found


def _has_kernel(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    except RuntimeError:           # a TorchScript builtin (aten::gamma.int), not an op of the dispatcher
        return False


def test_every_op_that_does_matrix_work_has_a_formula():
    """Ops named like matrix work and seen by a rank's tracker: each is priced by a formula (torch's registry or
    lib.sim.flops), or is listed above as elementwise or as unreachable from a simulated rank. A new torch that adds
    one fails here until it is priced."""
    priced_names = {p.__name__ for p in priced()}
    matrix = _reaching_a_dispatch_mode()
    unpriced = matrix - priced_names - NOT_MATRIX_WORK - UNREACHABLE
    assert not unpriced, f"matrix work without a FLOP formula: {sorted(unpriced)}"
    assert NOT_MATRIX_WORK | UNREACHABLE <= matrix, "every exception listed is an op found"


@pytest.mark.parametrize("name", sorted(UNREACHABLE))
def test_an_unreachable_op_is_unreachable(name):
    """Each op listed as unreachable raises on the CPU tensors a rank holds, or needs a layout a rank cannot hold."""
    assert name in {p.__name__ for p in _device_only()} or name in _SPARSE_OR_MKLDNN, name


_SPARSE_OR_MKLDNN = {name for name in UNREACHABLE if "sparse" in name or "mkldnn" in name or "spmm" in name
                     or name == "sspaddmm"}


def _device_only() -> list:
    """The packets among UNREACHABLE whose every overload lacks a CPU kernel (their explicit kernels call a GPU's)."""
    found = []
    for name in UNREACHABLE - _SPARSE_OR_MKLDNN:
        packet = getattr(aten, name)
        if not any(torch._C._dispatch_has_kernel_for_dispatch_key(getattr(packet, o).name(), "CPU")
                   for o in packet.overloads()):
            found.append(packet)
    return found


def test_a_sparse_tensor_cannot_reach_a_product():
    """Sparse ops are left unpriced because a simulated rank cannot run them: its tracker counts storages."""
    import lib.sim
    from lib.errors import RankFailed

    def program(dist):
        return torch.sparse.mm(torch.eye(4).to_sparse(), torch.ones(4, 2))
    with pytest.raises(RankFailed, match="storage"):
        lib.sim.run(program, 1)
