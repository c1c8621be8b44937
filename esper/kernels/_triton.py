"""Raw Triton kernels and their launchers. Imported lazily by :mod:`esper.kernels.gae` and
:mod:`esper.kernels.categorical`, only when a tensor is about to go through Triton, so ``esper.kernels``
imports (and falls back to the core) where Triton is absent.

The launchers write into ``out`` buffers the caller allocates (modded-nanogpt's discipline); they check
nothing beyond what the kernel needs: validation lives in the wrappers and in ``esper.core``.

Without a GPU the kernels still run under Triton's interpreter, which ``triton.jit`` picks when
``TRITON_INTERPRET=1`` is set *before this module is imported* (decoration time). The tests do that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _compute_dtype(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


# ------------------------------------------------------------------------------------------------ GAE
@triton.jit
def _affine_combine(c_acc, a_acc, c_new, a_new):
    # Composition of two steps of A <- a + c * A, scanned from the last step backwards: `acc` holds the
    # steps after t (already composed), `new` is step t. Triton's reverse scan is flip-scan-flip, so this
    # is its `linear_recurrence` combine with (c, a) = (decay, input).
    return c_acc * c_new, a_acc * c_new + a_new


@triton.jit
def _gae_kernel(
    reward_ptr,
    value_ptr,
    next_value_ptr,
    done_ptr,
    terminated_ptr,
    adv_ptr,
    target_ptr,
    n_envs,
    T,
    gamma,
    gamma_lmbda,
    GAMMA64: tl.constexpr,
    GAMMA_LMBDA64: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_T: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """One program per BLOCK_E envs; rows are [n_envs, T] contiguous (time last).

    Time is walked backwards in BLOCK_T-wide chunks, each loaded as one coalesced [BLOCK_E, BLOCK_T]
    tile. Inside a chunk the recurrence A_t = delta_t + c_t * A_{t+1} is a reverse associative scan of
    (c_t, delta_t) pairs, which yields A_t = L_t + P_t * carry with carry = A at the chunk's end; the
    carry then moves to the chunk's first column.
    """
    pid = tl.program_id(0)
    env = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    env_ok = env < n_envs
    row = env.to(tl.int64) * T
    step = tl.arange(0, BLOCK_T)
    if COMPUTE == tl.float64:
        # float arguments arrive as float32: in float64 the coefficients come as constexprs instead
        # (one compile per value), kept exact by tl.full
        gamma = tl.full([], GAMMA64, COMPUTE)
        gamma_lmbda = tl.full([], GAMMA_LMBDA64, COMPUTE)
    carry = tl.zeros([BLOCK_E], dtype=COMPUTE)
    n_chunks = tl.cdiv(T, BLOCK_T)
    for i in range(n_chunks):
        t = (n_chunks - 1 - i) * BLOCK_T + step
        ok = env_ok[:, None] & (t < T)[None, :]
        off = row[:, None] + t[None, :]
        r = tl.load(reward_ptr + off, mask=ok, other=0.0).to(COMPUTE)
        v = tl.load(value_ptr + off, mask=ok, other=0.0).to(COMPUTE)
        nv = tl.load(next_value_ptr + off, mask=ok, other=0.0).to(COMPUTE)
        done = tl.load(done_ptr + off, mask=ok, other=1) != 0
        term = tl.load(terminated_ptr + off, mask=ok, other=1) != 0
        # Padding (t >= T) gets delta = 0, c = 0: it adds nothing and cuts nothing that exists.
        delta = (r - v) + gamma * tl.where(term, 0.0, nv)
        coef = tl.where(done, 0.0, gamma_lmbda)
        decay, local = tl.associative_scan((coef, delta), 1, _affine_combine, reverse=True)
        adv = local + decay * carry[:, None]
        tl.store(adv_ptr + off, adv.to(adv_ptr.dtype.element_ty), mask=ok)
        tl.store(target_ptr + off, (adv + v).to(target_ptr.dtype.element_ty), mask=ok)
        carry = tl.sum(tl.where(step[None, :] == 0, adv, 0.0), axis=1)


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    adv_out: torch.Tensor,
    target_out: torch.Tensor,
    gamma: float,
    lmbda: float,
) -> None:
    """Fill ``adv_out`` and ``target_out`` (``[*B, T]``, contiguous) from ``[*B, T]`` inputs."""
    T = reward.shape[-1]
    n_envs = reward.numel() // T if T else 0
    if n_envs == 0 or T == 0:
        return
    rows = [x.reshape(n_envs, T).contiguous() for x in (reward, value, next_value)]
    flags = [x.reshape(n_envs, T).contiguous().view(torch.uint8) for x in (done, terminated)]
    # tiles of 16..32 x 16..32: coalesced along time, no degenerate size-1 dims for the compiler
    block_t = max(16, min(32, triton.next_power_of_2(T)))
    block_e = max(16, min(32, triton.next_power_of_2(n_envs)))
    compute = _compute_dtype(adv_out.dtype)
    _gae_kernel[(triton.cdiv(n_envs, block_e),)](
        *rows,
        *flags,
        adv_out,
        target_out,
        n_envs,
        T,
        float(gamma),
        float(gamma) * float(lmbda),
        GAMMA64=float(gamma) if adv_out.dtype == torch.float64 else None,
        GAMMA_LMBDA64=float(gamma) * float(lmbda) if adv_out.dtype == torch.float64 else None,
        BLOCK_E=block_e,
        BLOCK_T=block_t,
        COMPUTE=compute,
        num_warps=4,
    )


# ---------------------------------------------------------------------------------- masked categorical
@triton.jit
def _k3(lr, SMALL: tl.constexpr):
    # k3 = expm1(lr) - lr = lr^2/2 + lr^3/6 + ...: a Taylor polynomial where exp(lr) - 1 - lr would cancel
    # (|lr| < SMALL, the remainder is below the dtype's epsilon there), the direct form beyond.
    small = tl.abs(lr) < SMALL
    x = tl.where(small, lr, 0.0)
    # Horner form with integer divisors (exact in any float dtype): x^2/2! + x^3/3! + ... + x^9/9!
    tail = 1 + x / 5 * (1 + x / 6 * (1 + x / 7 * (1 + x / 8 * (1 + x / 9))))
    poly = x * x / 2 * (1 + x / 3 * (1 + x / 4 * tail))
    return tl.where(small, poly, tl.exp(lr) - 1.0 - lr)


@triton.jit
def _masked_row_stats(
    logits_ptr,
    mask_ptr,
    action_ptr,
    old_ptr,
    rows,
    cols,
    row_ok,
    col_ok,
    stride_l,
    stride_m,
    FILL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    COMPUTE: tl.constexpr,
    K3_SMALL: tl.constexpr,
):
    """Per row: legal [R, N], probabilities, log-softmax, log-prob of the action, entropy H (not
    normalized), number of legal choices, log-ratio vs the old log-prob and k3."""
    ok = row_ok[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)
    x = tl.load(logits_ptr + r64[:, None] * stride_l + cols[None, :], mask=ok, other=0.0).to(COMPUTE)
    if HAS_MASK:
        legal = (tl.load(mask_ptr + r64[:, None] * stride_m + cols[None, :], mask=ok, other=0) != 0) & ok
    else:
        legal = ok
    # Illegal choices get the dtype's most negative finite value, exactly like the core (an all-illegal
    # row is then uniform, not NaN); padding columns get -inf so they weigh nothing.
    x = tl.where(legal, x, FILL)
    x = tl.where(col_ok[None, :], x, float("-inf"))
    shifted = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(shifted)
    s = tl.sum(e, axis=1)
    lsm = shifted - tl.log(s)[:, None]
    p = e / s[:, None]
    action = tl.load(action_ptr + rows, mask=row_ok, other=0).to(tl.int32)
    hit = cols[None, :] == action[:, None]
    lp = tl.sum(tl.where(hit, lsm, 0.0), axis=1)
    h = -tl.sum(p * tl.where(legal, lsm, 0.0), axis=1)  # illegal: p = 0, lsm may be -inf
    n_legal = tl.sum(legal.to(tl.int32), axis=1)
    old = tl.load(old_ptr + rows, mask=row_ok, other=0.0).to(COMPUTE)
    lr = lp - old
    k3 = _k3(lr, K3_SMALL)
    return legal, hit, p, lsm, lp, h, n_legal, lr, k3


@triton.jit
def _categorical_fwd_kernel(
    logits_ptr,
    mask_ptr,
    action_ptr,
    old_ptr,
    lp_ptr,
    ent_ptr,
    kl_ptr,
    n_rows,
    n,
    stride_l,
    stride_m,
    FILL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMPUTE: tl.constexpr,
    K3_SMALL: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n
    _, _, _, _, lp, h, n_legal, _, k3 = _masked_row_stats(
        logits_ptr, mask_ptr, action_ptr, old_ptr, rows, cols, row_ok, col_ok, stride_l, stride_m, FILL,
        HAS_MASK, COMPUTE, K3_SMALL,
    )  # fmt: skip
    log_n = tl.log(tl.maximum(n_legal, 2).to(COMPUTE))
    ent = tl.where(n_legal > 1, h / log_n, 0.0)
    tl.store(lp_ptr + rows, lp, mask=row_ok)
    tl.store(ent_ptr + rows, ent, mask=row_ok)
    tl.store(kl_ptr + rows, k3, mask=row_ok)


@triton.jit
def _categorical_bwd_kernel(
    logits_ptr,
    mask_ptr,
    action_ptr,
    old_ptr,
    g_lp_ptr,
    g_ent_ptr,
    g_kl_ptr,
    g_logits_ptr,
    g_old_ptr,
    n_rows,
    n,
    stride_l,
    stride_m,
    FILL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMPUTE: tl.constexpr,
    K3_SMALL: tl.constexpr,
):
    """Recomputes the row (cheaper than saving [R, n] probabilities) and writes d/dlogits of
    g_lp * lp + g_ent * ent + g_kl * k3, and d/dold of the k3 term."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n
    legal, hit, p, lsm, _, h, n_legal, lr, k3 = _masked_row_stats(
        logits_ptr, mask_ptr, action_ptr, old_ptr, rows, cols, row_ok, col_ok, stride_l, stride_m, FILL,
        HAS_MASK, COMPUTE, K3_SMALL,
    )  # fmt: skip
    g_lp = tl.load(g_lp_ptr + rows, mask=row_ok, other=0.0).to(COMPUTE)
    g_ent = tl.load(g_ent_ptr + rows, mask=row_ok, other=0.0).to(COMPUTE)
    g_kl = tl.load(g_kl_ptr + rows, mask=row_ok, other=0.0).to(COMPUTE)
    # dk3/dlp = expm1(lr) = k3 + lr
    g_k3_lr = g_kl * (k3 + lr)
    g_lp_total = g_lp + g_k3_lr
    # d lp / dz_j = [j == a] - p_j ;  d H / dz_j = -p_j (log p_j + H) ;  ent = H / log(n_legal)
    g_h = tl.where(n_legal > 1, g_ent / tl.log(tl.maximum(n_legal, 2).to(COMPUTE)), 0.0)
    lsm = tl.where(legal, lsm, 0.0)
    grad = g_lp_total[:, None] * (tl.where(hit, 1.0, 0.0) - p) - g_h[:, None] * p * (lsm + h[:, None])
    grad = tl.where(legal, grad, 0.0)  # illegal logits are replaced by a constant: no gradient
    ok = row_ok[:, None] & col_ok[None, :]
    out = g_logits_ptr + rows.to(tl.int64)[:, None] * n + cols[None, :]
    tl.store(out, grad.to(g_logits_ptr.dtype.element_ty), mask=ok)
    tl.store(g_old_ptr + rows, (-g_k3_lr).to(g_old_ptr.dtype.element_ty), mask=row_ok)


def _categorical_launch(kernel, logits, mask, *tensors) -> None:
    n = logits.shape[-1]
    n_rows = logits.numel() // n if n else 0
    if n_rows == 0:
        return
    x = _rows(logits, n_rows, n)
    m = _rows(mask, n_rows, n).view(torch.uint8) if mask is not None else x
    block_n = max(2, triton.next_power_of_2(n))
    # about 4096 elements a program: 128 rows of short heads, fewer rows of wide ones
    block_r = max(1, min(128, 4096 // block_n, max(16, triton.next_power_of_2(n_rows))))
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    kernel[(triton.cdiv(n_rows, block_r),)](
        x,
        m,
        *tensors,
        n_rows,
        n,
        x.stride(0),
        m.stride(0),
        FILL=torch.finfo(dtype).min,
        HAS_MASK=mask is not None,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        COMPUTE=_compute_dtype(dtype),
        K3_SMALL=0.05 if dtype == torch.float64 else 0.5,
        num_warps=4,
    )


def _rows(x: torch.Tensor, n_rows: int, n: int) -> torch.Tensor:
    """A [n_rows, n] view with unit column stride (a strided slice of a wider tensor stays a view)."""
    x = x.reshape(n_rows, n)
    return x if x.stride(-1) == 1 else x.contiguous()


def masked_categorical(
    logits: torch.Tensor,
    action: torch.Tensor,
    mask: torch.Tensor | None,
    old_log_prob: torch.Tensor,
    lp_out: torch.Tensor,
    ent_out: torch.Tensor,
    kl_out: torch.Tensor,
) -> None:
    """Fill ``lp_out``, ``ent_out``, ``kl_out`` (``[...]``, contiguous, compute dtype)."""
    _categorical_launch(
        _categorical_fwd_kernel,
        logits,
        mask,
        action.contiguous(),
        old_log_prob.contiguous(),
        lp_out,
        ent_out,
        kl_out,
    )


def masked_categorical_backward(
    logits: torch.Tensor,
    action: torch.Tensor,
    mask: torch.Tensor | None,
    old_log_prob: torch.Tensor,
    grad_lp: torch.Tensor,
    grad_ent: torch.Tensor,
    grad_kl: torch.Tensor,
    grad_logits_out: torch.Tensor,
    grad_old_out: torch.Tensor,
) -> None:
    """Fill ``grad_logits_out`` (``[..., n]`` contiguous) and ``grad_old_out`` (``[...]``)."""
    _categorical_launch(
        _categorical_bwd_kernel,
        logits,
        mask,
        action.contiguous(),
        old_log_prob.contiguous(),
        grad_lp.contiguous(),
        grad_ent.contiguous(),
        grad_kl.contiguous(),
        grad_logits_out,
        grad_old_out,
    )
