# CPU model of warp_select_kernel (backend/cuda/ops_indexer_select_warp.cu, landed in step 34): the
# threshold search, the tie cut, the ballot compaction and the register/shuffle bitonic sort, with
# lanes and registers as lists, against topk_indices' rule (score desc, index asc). Written while no
# device machine came (step 34) to check the algorithm before its first run; `python3` it: "bad 0".
# STATS counts the paths taken (ties or not, more or fewer than 256 picks).
import random, struct
def fkey(f):
    if f == 0.0: f = 0.0
    b = struct.unpack('<I', struct.pack('<f', f))[0]
    return (~b) & 0xffffffff if b & 0x80000000 else b | 0x80000000
def ref(sc, topk):
    idx = sorted(range(len(sc)), key=lambda i: (-sc[i], i))
    return idx[:min(topk, len(sc))]
def warp_select(sc, topk):
    n = len(sc); kk = min(topk, n)
    if kk == 0: return []
    keys = [fkey(sc[i]) if i < n else 0 for i in range(2048)]  # keys[32*jj+lane]
    cnt = lambda t: sum(1 for x in keys if x >= t)
    t = 0; need = 0; ties = False
    if n > kk:
        a = 0xffffffff; o = 0
        for i in range(n): a &= keys[i]; o |= keys[i]
        d = a ^ o
        if d == 0: t = a; ties = True; need = kk
        else:
            top = d.bit_length() - 1
            t = a & ~(((2 << top) - 1) & 0xffffffff) & 0xffffffff
            at = n; b = top
            while b >= 0 and at != kk:
                c = t | (1 << b); m = cnt(c)
                if m >= kk: t = c; at = m
                b -= 1
            if at != kk:
                ties = True; need = kk - (0 if t == 0xffffffff else cnt(t + 1))
    cut = 0
    if ties:
        seen = 0; found = False
        for jj in range(64):
            tb = [l for l in range(32) if 32*jj+l < n and keys[32*jj+l] == t]
            if not found and seen + len(tb) >= need:
                cut = 32*jj + tb[need - seen - 1]; found = True
            seen += len(tb)
    buf = []
    for jj in range(64):
        for lane in range(32):
            i = 32 * jj + lane
            if i >= n: continue
            k = keys[i]
            take = (k > t or (k == t and i <= cut)) if ties else (k >= t)
            if take: buf.append((k << 32) | ((~i) & 0xffffffff))
    assert len(buf) == kk, (len(buf), kk)
    STATS[(ties, kk > 256)] = STATS.get((ties, kk > 256), 0) + 1
    q = (kk + 31) // 32; E = 1 if q <= 1 else 2 if q <= 2 else 4 if q <= 4 else 8 if q <= 8 else 16
    P = 32 * E
    v = [[buf[32 * e + l] if 32 * e + l < kk else 0 for l in range(32)] for e in range(E)]
    k = 2
    while k <= P:
        j = k >> 1
        while j > 0:
            if j >= 32:
                for e in range(E):
                    f = e ^ (j >> 5)
                    if f < e: continue
                    desc = (e & (k >> 5)) == 0
                    for l in range(32):
                        if (v[e][l] < v[f][l]) == desc: v[e][l], v[f][l] = v[f][l], v[e][l]
            else:
                for e in range(E):
                    old = v[e][:]
                    for l in range(32):
                        o = old[l ^ j]; lower = (l & j) == 0
                        desc = ((32 * e + l) & k) == 0
                        if (o > old[l]) == (lower == desc): v[e][l] = o
            j >>= 1
        k <<= 1
    out = [v[x // 32][x % 32] for x in range(P)]
    return [(~x) & 0xffffffff for x in out[:kk]]
STATS = {}
random.seed(1)
bad = 0
for trial in range(400):
    n = random.choice([0, 1, 2, 31, 32, 33, 300, 511, 512, 513, 1000, 2047, 2048, random.randint(0, 2048)])
    kind = trial % 4
    sc = [random.gauss(0, 1) for _ in range(n)]
    sc = [struct.unpack('<f', struct.pack('<f', x))[0] for x in sc]
    if kind == 1: sc = [float(round(x * 2)) for x in sc]
    if kind == 2: sc = [0.25] * n
    if kind == 3: sc = [(-0.0 if i % 3 == 0 else 0.0) if i % 3 < 2 else -x * x for i, x in enumerate(sc)]
    sc = [struct.unpack('<f', struct.pack('<f', x))[0] for x in sc]
    for topk in (512, 300, 33, 1):
        if warp_select(sc, topk) != ref(sc, topk):
            bad += 1; print("mismatch", n, kind, topk)
print("bad", bad)
print(STATS)
