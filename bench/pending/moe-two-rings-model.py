# bench/pending/moe-two-rings-model.py (step 36): run with python3; prints "bad 0" when every case passes.
# Protocol model of moe-two-rings.patch's persistent kernel: one producer agent, one consumer
# agent, parity-waited mbarriers; checks deadlock freedom and that every read sees the block it
# expects and no write overwrites unconsumed data.
import itertools, random, sys
class Bar:
    def __init__(s, count): s.count, s.arrived, s.done = count, 0, 0
    def arrive(s):
        s.arrived += 1
        if s.arrived == s.count: s.arrived, s.done = 0, s.done + 1
    def ready(s, parity): return (s.done & 1) != parity
class Cur:
    def __init__(s, n): s.n, s.idx, s.phase = n, 0, 0
    def next(s):
        s.idx += 1
        if s.idx == s.n: s.idx, s.phase = 0, s.phase ^ 1
def run(kR, kF, kAhead, nkb, items, seed):
    rng = random.Random(seed)
    full = [Bar(1) for _ in range(kR)]; empty = [Bar(1) for _ in range(kR)]; fempty = [Bar(1) for _ in range(kF)]
    raw = [None] * kR; rawfree = [True] * kR; fold = [None] * kF; foldfree = [True] * kF
    A = min(kAhead, nkb - 1)
    def producer():
        cc, fc, ac = Cur(kR), Cur(kR), Cur(kF)
        def copy(item, kb):
            while not empty[cc.idx].ready(cc.phase ^ 1): yield
            assert rawfree[cc.idx], ("overwrite raw", cc.idx, raw[cc.idx], (item, kb))
            raw[cc.idx] = (item, kb); rawfree[cc.idx] = False; cc.next()
        def fold_block(item, kb):
            while not fempty[ac.idx].ready(ac.phase ^ 1): yield
            assert foldfree[ac.idx], ("overwrite fold", ac.idx)
            assert raw[fc.idx] == (item, kb), ("fold reads", raw[fc.idx], (item, kb))
            fold[ac.idx] = (item, kb); foldfree[ac.idx] = False
            full[fc.idx].arrive(); fc.next(); ac.next()
        for b in range(A): yield from copy(items[0], b)
        for n, item in enumerate(items):
            has_next = n + 1 < len(items); d_at = nkb - A
            for kb in range(d_at):
                yield from copy(item, kb + A); yield from fold_block(item, kb)
            for kb in range(d_at, nkb):
                if has_next: yield from copy(items[n + 1], kb - d_at)
                yield from fold_block(item, kb)
    def consumer():
        cc, ca = Cur(kR), Cur(kF)
        for item in items:
            for kb in range(nkb):
                while not full[cc.idx].ready(cc.phase): yield
                assert raw[cc.idx] == (item, kb), ("consumer raw", raw[cc.idx], (item, kb))
                assert fold[ca.idx] == (item, kb), ("consumer fold", fold[ca.idx], (item, kb))
                yield  # the wgmmas
                foldfree[ca.idx] = True; fempty[ca.idx].arrive(); ca.next()
                if kb + 1 == nkb: break
                rawfree[cc.idx] = True; empty[cc.idx].arrive(); cc.next()
            yield  # outputs through raw[cc]
            assert raw[cc.idx] == (item, nkb - 1), "outputs' entry overwritten"
            rawfree[cc.idx] = True; empty[cc.idx].arrive(); cc.next()
    agents = {"p": producer(), "c": consumer()}
    live = dict(agents); steps = 0
    while live:
        k = rng.choice(sorted(live))
        try:
            next(live[k])
        except StopIteration:
            del live[k]
        steps += 1
        if steps > 200000: return "deadlock"
    return "ok"
bad = 0
for kR, kF, kAhead in [(5, 3, 3), (5, 3, 2), (5, 3, 1), (4, 4, 2), (5, 2, 3)]:
    for nkb in [1, 2, 3, 4, 5, 8, 16, 32]:
        for seed in range(20):
            items = list(range(random.Random(seed).randint(1, 7)))
            try:
                r = run(kR, kF, kAhead, nkb, items, seed)
            except AssertionError as e:
                r = "assert " + str(e)
            if r != "ok":
                bad += 1
                if bad < 6: print(kR, kF, kAhead, nkb, len(items), seed, r)
print("bad", bad)
