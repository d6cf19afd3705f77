#!/usr/bin/env python3
# CPU model of fa2_mma_sm80's backward main kernel at the fragment level
# (src/kernels/sm80/fa2_mma_sm80/fa2_mma_sm80_bwd_kernel.cuh): ldmatrix(.trans)
# and mma.sync m16n8k16 as the PTX ISA defines their fragments, warp by warp,
# with the kernel's lane patterns (common/ptx_sm80.h: ldmatrix_offset_rows16 /
# _pairs, warp_gemm_smem), warp layouts (BwdTraits in fa2_mma_sm80.h), masks
# (common/visible_keys.h) and walk over query blocks, checked against numpy
# gradients of masked attention. float64 throughout: it checks the index math,
# not rounding; it models neither the pipeline (barriers, cp.async) nor GQA,
# varlen or the deterministic split. Run it (numpy only, no GPU) after changing
# a tiling or a lane pattern; it mirrors the C++ by hand, so change both.
#
#   python3 scripts/fa2_bwd_fragment_model.py          # every case
#   python3 scripts/fa2_bwd_fragment_model.py 64 128   # the cases of these head dims
import numpy as np
import math

def ldsm(flat, lane_addr, trans):
    # lane_addr: 32 element indices (row starts). returns regs[32][4] of (lo, hi)
    regs = [[None] * 4 for _ in range(32)]
    for i in range(4):
        M = np.array([flat[lane_addr[8 * i + r]: lane_addr[8 * i + r] + 8] for r in range(8)])
        for t in range(32):
            if not trans:
                regs[t][i] = (M[t // 4][2 * (t % 4)], M[t // 4][2 * (t % 4) + 1])
            else:
                regs[t][i] = (M[2 * (t % 4)][t // 4], M[2 * (t % 4) + 1][t // 4])
    return regs

def mma(acc, a, b0, b1):
    # acc: list of 32 lists of 4 floats; a: [32][4] pairs; b0,b1: [32] pairs
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g][2 * t], A[g][2 * t + 1] = a[l][0]
        A[g + 8][2 * t], A[g + 8][2 * t + 1] = a[l][1]
        A[g][2 * t + 8], A[g][2 * t + 9] = a[l][2]
        A[g + 8][2 * t + 8], A[g + 8][2 * t + 9] = a[l][3]
        B[2 * t][g], B[2 * t + 1][g] = b0[l]
        B[2 * t + 8][g], B[2 * t + 9][g] = b1[l]
    C = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        acc[l][0] += C[g][2 * t]; acc[l][1] += C[g][2 * t + 1]
        acc[l][2] += C[g + 8][2 * t]; acc[l][3] += C[g + 8][2 * t + 1]

def off_rows16(lane, stride):
    return (lane & 15) * stride + (lane >> 4) * 8

def off_pairs(lane, stride):
    return ((lane & 7) + ((lane >> 4) << 3)) * stride + ((lane >> 3) & 1) * 8

# Shared tile layouts (common/smem_layout.h), in elements: 8-element chunks.
class Padded:
    def __init__(self, row_elems): self.row = row_elems
    def chunk_offset(self, r, c): return r * self.row + c * 8
    def advance(self, lane, rows, chunks): return lane + rows * self.row + chunks * 8
    def store(self, tile, cols):  # tile rows x cols -> flat
        flat = np.zeros(tile.shape[0] * self.row)
        for r in range(tile.shape[0]): flat[r * self.row: r * self.row + cols] = tile[r, :cols]
        return flat

class Swizzled:
    def __init__(self, row_elems):
        assert row_elems % 64 == 0
        self.row = row_elems
    def chunk_offset(self, r, c): return r * self.row + ((c ^ (r & 7)) * 8)
    # The kernel XORs address bits 4-6 (bytes): chunk bits 0-2, element bits 3-5.
    def advance(self, lane, rows, chunks): return (lane ^ ((chunks & 7) << 3)) + rows * self.row + (chunks & ~7) * 8
    def store(self, tile, cols):
        flat = np.zeros(tile.shape[0] * self.row)
        for r in range(tile.shape[0]):
            for c in range(cols // 8):
                o = self.chunk_offset(r, c); flat[o:o + 8] = tile[r, c * 8:c * 8 + 8]
        return flat

def cell_rows16(lane): return lane & 15, lane >> 4
def cell_pairs(lane): return (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1

def new_acc(mt, nt):
    return [[[[0.0] * 4 for _ in range(32)] for _ in range(nt)] for _ in range(mt)]

def warp_gemm(acc, flat_a, a_lane, flat_b, b_lane, at, bt, ksteps, alayout, blayout):
    kMT = len(acc); kNT = len(acc[0])
    for ks in range(ksteps):
        a = []
        for mt in range(kMT):
            rc = (ks * 16, mt * 2) if at else (mt * 16, ks * 2)
            a.append(ldsm(flat_a, [alayout.advance(x, *rc) for x in a_lane], at))
        for nb in range(kNT // 2):
            rc = (ks * 16, nb * 2) if bt else (nb * 16, ks * 2)
            b = ldsm(flat_b, [blayout.advance(x, *rc) for x in b_lane], bt)
            for mt in range(kMT):
                mma(acc[mt][2 * nb], a[mt], [b[l][0] for l in range(32)], [b[l][1] for l in range(32)])
                mma(acc[mt][2 * nb + 1], a[mt], [b[l][2] for l in range(32)], [b[l][3] for l in range(32)])

def visible_keys(row, sq, sk, wl, wr):
    diag = row + (sk - sq)
    first, last = 0, sk - 1
    if wl >= 0 and diag - wl > first: first = diag - wl
    if wr >= 0 and diag + wr < last: last = diag + wr
    return first, last

def visible_rows_of_keys(kf, kl, sq, sk, wl, wr):
    off = sk - sq
    first, last = 0, sq - 1
    if wr >= 0 and kf - off - wr > first: first = kf - off - wr
    if wl >= 0 and kl - off + wl < last: last = kl - off + wl
    return first, last

def tile_fully_visible(rf, rl, kf, kl, sq, sk, wl, wr):
    top = visible_keys(rf, sq, sk, wl, wr); bottom = visible_keys(rl, sq, sk, wl, wr)
    return kl <= top[1] and kf >= bottom[0]

class Tr:
    def __init__(self, D, BM, BN, W):
        self.D, self.BM, self.BN, self.W = D, BM, BN, W
        self.S = D + 8; self.PS = BN + 8
        self.SdpWM = BM // 32; self.SdpWN = W // self.SdpWM
        self.SdpRows = BM // self.SdpWM; self.SdpCols = BN // self.SdpWN
        self.SdpMT = self.SdpRows // 16; self.SdpNT = self.SdpCols // 8
        self.KvWN = BN // 32; self.KvWD = W // self.KvWN; self.KvCols = D // self.KvWD
        self.KvMT = 2; self.KvNT = self.KvCols // 8
        rows32 = min(BM // 32, 4)  # BwdTraits::kDqWarpsM
        self.DqWM = rows32 if rows32 >= 1 and W % rows32 == 0 and (D // (W // rows32)) % 16 == 0 else min(BM // 16, 4)
        self.DqWD = W // self.DqWM; self.DqCols = D // self.DqWD
        self.DqRows = BM // self.DqWM; self.DqMT = self.DqRows // 16
        self.DqChunkCols = min(64 // self.DqMT, self.DqCols); self.DqChunks = self.DqCols // self.DqChunkCols
        self.DqChunkNT = self.DqChunkCols // 8
        # BwdTraits::QLayout / KvLayout / PLayout
        self.QL = Swizzled(D) if D % 64 == 0 else Padded(self.S)
        self.KvL = Padded(self.S); self.PL = Padded(self.PS)

def reference(q, k, v, do, scale, wl, wr):
    sq, sk = q.shape[0], k.shape[0]
    S = scale * q @ k.T
    mask = np.zeros_like(S, dtype=bool)
    for i in range(sq):
        f, l = visible_keys(i, sq, sk, wl, wr)
        for j in range(sk):
            mask[i, j] = f <= j <= l
    S = np.where(mask, S, -np.inf)
    m = S.max(axis=1, keepdims=True)
    lse = np.full((sq,), -np.inf)
    P = np.zeros_like(S)
    for i in range(sq):
        if mask[i].any():
            e = np.exp(S[i] - m[i]); lse[i] = m[i, 0] + math.log(e.sum()); P[i] = e / e.sum()
    o = P @ v
    dP = do @ v.T
    D = (do * o).sum(axis=1, keepdims=True)
    dS = P * (dP - D)
    return o, lse, scale * dS @ k, scale * dS.T @ q, P.T @ do

def simulate(tr, q, k, v, do, o, lse, scale, wl, wr, n_block):
    D, BM, BN = tr.D, tr.BM, tr.BN
    sq, sk = q.shape[0], k.shape[0]
    n0 = n_block * BN
    keys_here = min(BN, sk - n0)
    rf, rl = visible_rows_of_keys(n0, n0 + keys_here - 1, sq, sk, wl, wr)
    empty = rl < rf
    m_begin = 0 if empty else rf // BM
    m_count = 0 if empty else rl // BM + 1 - m_begin
    # shared tiles (flat, in their layouts)
    Kt = np.zeros((BN, D)); Vt = np.zeros((BN, D))
    Kt[:keys_here] = k[n0:n0 + keys_here]; Vt[:keys_here] = v[n0:n0 + keys_here]
    Kf, Vf = tr.KvL.store(Kt, D), tr.KvL.store(Vt, D)
    Dvec = (do * o).sum(axis=1)
    acc_dk = [None] * tr.W; acc_dv = [None] * tr.W
    for w in range(tr.W):
        acc_dk[w] = new_acc(tr.KvMT, tr.KvNT); acc_dv[w] = new_acc(tr.KvMT, tr.KvNT)
    # The dq accumulator of one head: whole BM-row blocks in fragment order.
    dq_accum = np.zeros(((sq + BM - 1) // BM) * BM * D)
    scale_log2 = scale * math.log2(math.e)
    for j in range(m_count):
        m0 = (m_begin + j) * BM
        Qt = np.zeros((BM, D)); Dot = np.zeros((BM, D))
        nr = min(BM, sq - m0)
        Qt[:nr] = q[m0:m0 + nr]; Dot[:nr] = do[m0:m0 + nr]
        Qf, Dof = tr.QL.store(Qt, D), tr.QL.store(Dot, D)
        Pt = np.zeros((BM, tr.PS)); dSt = np.zeros((BM, tr.PS))
        needs_mask = not tile_fully_visible(m0, m0 + BM - 1, n0, n0 + BN - 1, sq, sk, wl, wr)
        for w in range(tr.W):
            sdp_row0 = (w // tr.SdpWN) * tr.SdpRows; sdp_col0 = (w % tr.SdpWN) * tr.SdpCols
            a_lane = [tr.QL.chunk_offset(sdp_row0 + cell_rows16(l)[0], cell_rows16(l)[1]) for l in range(32)]
            b_lane = [tr.KvL.chunk_offset(sdp_col0 + cell_pairs(l)[0], cell_pairs(l)[1]) for l in range(32)]
            acc_s = new_acc(tr.SdpMT, tr.SdpNT); acc_dp = new_acc(tr.SdpMT, tr.SdpNT)
            warp_gemm(acc_s, Qf, a_lane, Kf, b_lane, False, False, D // 16, tr.QL, tr.KvL)
            warp_gemm(acc_dp, Dof, a_lane, Vf, b_lane, False, False, D // 16, tr.QL, tr.KvL)
            for l in range(32):
                qr, qc = l // 4, l % 4
                for mt in range(tr.SdpMT):
                    for h in range(2):
                        row = sdp_row0 + mt * 16 + qr + h * 8
                        grow = m0 + row
                        if grow < sq:
                            L = lse[grow]; L2 = math.inf if L == -math.inf else L * math.log2(math.e); dd = Dvec[grow]
                        else:
                            L2 = math.inf; dd = 0.0
                        kf, kl = visible_keys(grow, sq, sk, wl, wr)
                        for n in range(tr.SdpNT):
                            for i in range(2):
                                s = acc_s[mt][n][l][h * 2 + i]
                                key = n0 + sdp_col0 + n * 8 + qc * 2 + i
                                if needs_mask and not (kf <= key <= kl): s = -math.inf
                                x = s * scale_log2 - L2
                                p = 0.0 if x == -math.inf else 2.0 ** x
                                assert not math.isnan(p)
                                ds = p * (acc_dp[mt][n][l][h * 2 + i] - dd)
                                col = sdp_col0 + n * 8 + qc * 2 + i
                                Pt[row, col] = p; dSt[row, col] = ds
        Pf, dSf = Pt.ravel(), dSt.ravel()
        for w in range(tr.W):
            kv_row0 = (w // tr.KvWD) * 32; kv_col0 = (w % tr.KvWD) * tr.KvCols
            a_lane = [tr.PL.chunk_offset(cell_pairs(l)[0], kv_row0 // 8 + cell_pairs(l)[1]) for l in range(32)]
            b_lane = [tr.QL.chunk_offset(cell_rows16(l)[0], kv_col0 // 8 + cell_rows16(l)[1]) for l in range(32)]
            warp_gemm(acc_dv[w], Pf, a_lane, Dof, b_lane, True, True, BM // 16, tr.PL, tr.QL)
            warp_gemm(acc_dk[w], dSf, a_lane, Qf, b_lane, True, True, BM // 16, tr.PL, tr.QL)
            dq_row0 = (w // tr.DqWD) * tr.DqRows; dq_col0 = (w % tr.DqWD) * tr.DqCols
            a_lane = [tr.PL.chunk_offset(dq_row0 + cell_rows16(l)[0], cell_rows16(l)[1]) for l in range(32)]
            for chunk in range(tr.DqChunks):
                b_lane = [tr.KvL.advance(tr.KvL.chunk_offset(cell_rows16(l)[0], dq_col0 // 8 + cell_rows16(l)[1]),
                                         0, chunk * tr.DqChunkCols // 8) for l in range(32)]
                acc_dq = new_acc(tr.DqMT, tr.DqChunkNT)
                warp_gemm(acc_dq, dSf, a_lane, Kf, b_lane, False, True, BN // 16, tr.PL, tr.KvL)
                for l in range(32):
                    for mt in range(tr.DqMT):
                        for n in range(tr.DqChunkNT):
                            group = dq_fragment_group(tr, w, chunk, mt, n)
                            for i in range(4):
                                dq_accum[m0 * D + group * 128 + slot_of(l, i)] += acc_dq[mt][n][l][i]
    dk = np.full((keys_here, D), np.nan); dv = np.full((keys_here, D), np.nan)
    for w in range(tr.W):
        kv_row0 = (w // tr.KvWD) * 32; kv_col0 = (w % tr.KvWD) * tr.KvCols
        for l in range(32):
            qr, qc = l // 4, l % 4
            for mt in range(tr.KvMT):
                for n in range(tr.KvNT):
                    for h in range(2):
                        row = kv_row0 + mt * 16 + qr + h * 8
                        col = kv_col0 + n * 8 + qc * 2
                        if row < keys_here:
                            dk[row, col] = acc_dk[w][mt][n][l][h * 2] * scale
                            dk[row, col + 1] = acc_dk[w][mt][n][l][h * 2 + 1] * scale
                            dv[row, col] = acc_dv[w][mt][n][l][h * 2]
                            dv[row, col + 1] = acc_dv[w][mt][n][l][h * 2 + 1]
    return dq_accum, dk, dv

# The accumulator's fragment order (fa2_mma_sm80_bwd_kernel.cuh): 128-float groups
# per (warp, chunk, m16 tile, n8 tile); value i of a lane at lane * 4 + i (sm_90)
# or i * 32 + lane (sm_80).
SLOT_ORDERS = {"sm90": lambda l, i: l * 4 + i, "sm80": lambda l, i: i * 32 + l}
slot_of = SLOT_ORDERS["sm90"]

def dq_fragment_group(tr, w, chunk, mt, n):
    return ((w * tr.DqChunks + chunk) * tr.DqMT + mt) * tr.DqChunkNT + n

def convert_dq(tr, dq_accum, sq, scale):
    # The convert kernel's index math: each (group, lane) of a query block back to its rows and
    # columns (the kernel takes a query block a thread block, through a shared row-major tile).
    dq = np.zeros((sq, tr.D))
    lanes_per_block = tr.BM * tr.D // 4
    for index in range(dq_accum.size // 4):
        m_block, within = divmod(index, lanes_per_block)
        group, l = divmod(within, 32)
        n = group % tr.DqChunkNT
        mt = group // tr.DqChunkNT % tr.DqMT
        chunk = group // (tr.DqChunkNT * tr.DqMT) % tr.DqChunks
        w = group // (tr.DqChunkNT * tr.DqMT * tr.DqChunks)
        row = m_block * tr.BM + (w // tr.DqWD) * tr.DqRows + mt * 16 + l // 4
        col = (w % tr.DqWD) * tr.DqCols + chunk * tr.DqChunkCols + n * 8 + (l % 4) * 2
        for i in range(4):
            r = row + 8 * (i // 2)
            if r < sq:
                dq[r, col + i % 2] = dq_accum[m_block * tr.BM * tr.D + group * 128 + slot_of(l, i)] * scale
    return dq

def run(D, BM, BN, sq, sk, wl, wr, seed=0):
    rng = np.random.default_rng(seed)
    tr = Tr(D, BM, BN, 8)
    q = rng.standard_normal((sq, D)); k = rng.standard_normal((sk, D)); v = rng.standard_normal((sk, D))
    do = rng.standard_normal((sq, D))
    scale = 1 / math.sqrt(D)
    o, lse, dq_ref, dk_ref, dv_ref = reference(q, k, v, do, scale, wl, wr)
    dq_accum = np.zeros(((sq + BM - 1) // BM) * BM * D); dk = np.zeros_like(k); dv = np.zeros_like(v)
    for nb in range((sk + BN - 1) // BN):
        a, b, c = simulate(tr, q, k, v, do, o, lse, scale, wl, wr, nb)
        dq_accum += a; dk[nb * BN: nb * BN + b.shape[0]] = b; dv[nb * BN: nb * BN + c.shape[0]] = c
    dq = convert_dq(tr, dq_accum, sq, scale)
    errs = [np.abs(dq - dq_ref).max(), np.abs(dk - dk_ref).max(), np.abs(dv - dv_ref).max()]
    ok = all(e < 1e-9 for e in errs) and not np.isnan(dk).any() and not np.isnan(dv).any()
    print(f"D={D} {BM}x{BN} sq={sq} sk={sk} wl={wl} wr={wr}: dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e} {'OK' if ok else 'FAIL'}")
    return ok

if __name__ == "__main__":
    import sys
    # (head_dim, block_m, block_n, seqlen_q, seqlen_k, window_left, window_right);
    # the tiles of DefaultBwdTraits: 128 x 128 up to 64, 64 x 128 at 96/128, 64 x 64 at 256.
    cases = [
        (32, 128, 128, 7, 113, -1, -1),
        (64, 128, 128, 113, 7, -1, 0),
        (64, 64, 128, 113, 7, -1, 0),
        (96, 64, 128, 70, 150, -1, 0),
        (128, 64, 128, 65, 130, 16, 3),
        (256, 64, 64, 40, 70, -1, 0),
        (64, 64, 128, 1, 1, -1, -1),
        (32, 64, 128, 150, 20, -1, 0),   # causal, sq > sk: top rows see nothing
        (64, 128, 128, 200, 140, -1, 0),
        (32, 128, 128, 130, 129, 20, 20),
        (64, 128, 128, 1, 7, -1, -1),
    ]
    sel = sys.argv[1:]
    allok = True
    for order in SLOT_ORDERS:
        slot_of = SLOT_ORDERS[order]
        print(f"dq accumulator slot order {order}")
        for c in cases:
            if sel and str(c[0]) not in sel: continue
            allok &= run(*c)
    print("ALL OK" if allok else "SOME FAILED")
    sys.exit(0 if allok else 1)
