"""The tile ranges the attention kernels iterate (``_kv_blocks`` for the forward and dQ kernels,
``_q_blocks`` for dK/dV), read back from the device functions themselves through a probe kernel.

For every q block (resp. KV block) the visited tiles [lo, hi) must be exactly those with at
least one visible (query, key) pair: a sliding window costs its band, no fully masked tile is
loaded, and no visible one is skipped. The unmasked stage [full_lo, full_hi) may hold only
tiles that every row (resp. key) of the block sees, inside the sequence, since stage 2 loads
and computes without a mask.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl

from kerneltriage.kernels.attention.launch import UNBOUNDED
from kerneltriage.kernels.attention.reference import visible_mask
from kerneltriage.kernels.attention.triton_kernels import _kv_blocks, _q_blocks


@triton.jit
def _probe(OUT, Sq, Sk, win_left, win_right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program p writes OUT[0, p]: the key tiles of q block p (forward, dQ) and OUT[1, p]: the
    q tiles of key block p (dK/dV), as (lo, full_lo, full_hi, hi)."""
    pid = tl.program_id(0)
    off = Sk - Sq
    out = OUT + pid * 4
    if pid * BLOCK_M < Sq:
        lo, full_lo, full_hi, hi = _kv_blocks(
            pid * BLOCK_M, Sq, Sk, off, win_left, win_right, BLOCK_M, BLOCK_N
        )
        _store4(out, lo, full_lo, full_hi, hi)
    if pid * BLOCK_N < Sk:
        lo, full_lo, full_hi, hi = _q_blocks(
            pid * BLOCK_N, Sq, Sk, off, win_left, win_right, BLOCK_M, BLOCK_N
        )
        _store4(out + tl.num_programs(0) * 4, lo, full_lo, full_hi, hi)


@triton.jit
def _store4(out, a, b, c, d):
    tl.store(out, a)
    tl.store(out + 1, b)
    tl.store(out + 2, c)
    tl.store(out + 3, d)


def _bounds(device, sq, sk, left, right, bm, bn):
    """{False: bounds per q block, True: bounds per key block}, each a list of 4-tuples."""
    nq, nk = triton.cdiv(sq, bm), triton.cdiv(sk, bn)
    out = torch.full((2, max(nq, nk), 4), -1, dtype=torch.int32, device=device)
    _probe[(max(nq, nk),)](out, sq, sk, left, right, BLOCK_M=bm, BLOCK_N=bn)
    out = out.cpu()
    return {False: out[0, :nq], True: out[1, :nk]}


WINDOWS = {  # (left, right) as the kernels get them: UNBOUNDED for an open side, causal = right 0
    "dense": (UNBOUNDED, UNBOUNDED),
    "causal": (UNBOUNDED, 0),
    "window-40,16": (40, 16),
    "causal-window-48": (48, 0),
    "diagonal-only": (0, 0),
    "left-5": (5, UNBOUNDED),
    "right-7": (UNBOUNDED, 7),
}
LENGTHS = [(150, 150), (67, 200), (200, 67)]
TILES = [(64, 32), (32, 64)]  # BLOCK_M > BLOCK_N and the reverse; several blocks each way


def _check(what, mask, own, other, bounds):
    """``mask``: (own positions, other positions) visibility; ``bounds``: per own block, the
    (lo, full_lo, full_hi, hi) range of other tiles it visits."""
    n_own, n_other = mask.shape
    blocks, tiles = triton.cdiv(n_own, own), triton.cdiv(n_other, other)
    # per (own block, other tile): does any entry / every real entry show?
    padded = torch.zeros(blocks * own, tiles * other, dtype=torch.bool)
    padded[:n_own, :n_other] = mask
    real = torch.zeros_like(padded)
    real[:n_own, :n_other] = True
    by_tile = (blocks, own, tiles, other)
    any_visible = padded.view(by_tile).any(dim=(1, 3))
    all_visible = (padded | ~real).view(by_tile).all(dim=(1, 3))
    inside = torch.arange(tiles) * other + other <= n_other  # no padded rows/keys of the other side
    lo, full_lo, full_hi, hi = (bounds[:, i, None] for i in range(4))
    assert bool(((lo <= full_lo) & (full_lo <= full_hi) & (full_hi <= hi)).all()), what
    assert bool((bounds % other == 0).all()), what
    start = torch.arange(tiles)[None, :] * other
    visited = (lo <= start) & (start < hi)
    assert torch.equal(visited, any_visible), f"{what}: visited tiles {visited} != visible {any_visible}"
    # unmasked tiles: every entry seen, inside the other sequence (the own block's padded
    # rows/keys past its end are computed but never stored)
    full = (full_lo <= start) & (start < full_hi)
    assert bool((~full | (all_visible & inside[None, :])).all()), f"{what}: an unmasked tile is not full"


@pytest.mark.parametrize("window", list(WINDOWS))
def test_visited_tiles_are_exactly_the_visible_ones(window, device):
    left, right = WINDOWS[window]
    sides = (None if left == UNBOUNDED else left, None if right == UNBOUNDED else right)
    for (sq, sk), (bm, bn) in itertools.product(LENGTHS, TILES):
        mask = visible_mask(sq, sk, window=sides)
        bounds = _bounds(device, sq, sk, left, right, bm, bn)
        what = f"{window} Sq={sq} Sk={sk} tiles {bm}x{bn}"
        _check(f"{what}, key tiles per q block", mask, bm, bn, bounds[False])
        _check(f"{what}, q tiles per key block", mask.T, bn, bm, bounds[True])
