# SPDX-License-Identifier: BSD-3-Clause
# Model of the mbarrier protocol of templates/broadcast_bwd_sm90.cu with
# rotary embeddings (.bq_sm90_rotary): two query warpgroups copying and
# rotating the K, V tiles of a ring of K slots (kv_full / kv_empty, one
# arrival a warpgroup here for the template's 128 threads each), handing P
# and dS to the key warpgroup through two slots (full / empty); the first
# tiles of a sequence rotated before its loop, a loop tile rotated
# kRotateLag tiles after its copy started (1 with three stages or more, else
# 0). Random interleavings of random walks (sequences of 0 to 7 tiles):
# asserts no deadlock, no tile read before both warpgroups copied and
# rotated it, no slot written while a warpgroup reads it. Written from a
# helper's review in session 44. Verification aid (not run by CI):
#   python3 tools/emulate/broadcast_sm90_protocol.py
# Keep its order of waits and arrivals in step with the template's by hand.
import random

# mbarrier: count, pending, phase
class Bar:
    def __init__(s, cnt): s.cnt=cnt; s.pend=cnt; s.phase=0
    def arrive(s):
        s.pend-=1
        assert s.pend>=0
        if s.pend==0: s.phase+=1; s.pend=s.cnt
    def done(s, parity):  # try_wait.parity: phase with that parity complete <=> current phase parity != parity
        return (s.phase & 1) != parity
def run(seqs, K, rotKV, seed):
    lag = 1 if K >= 3 else 0  # kRotateLag
    rnd=random.Random(seed)
    kvf=[Bar(2) for _ in range(K)]; kve=[Bar(2) for _ in range(K)]
    full=[Bar(2) for _ in range(2)]; empty=[Bar(1) for _ in range(2)]
    slot_tile=[None]*K; written={}  # tile -> set of wgs that wrote (copied+rotated)
    readers={}  # tile -> set of wgs reading
    def qwg(w):
        n=0
        for ns in seqs:
            if ns==0: continue
            if n>0:
                yield ('wait', empty[(n-1)&1], ((n-1)>>1)&1)
                yield ('wait', kve[(n-1)%K], ((n-1)//K)&1)
            n0=n
            def load(t, arrive):
                m=n0+t; x=m%K
                if m>=K: yield ('wait', kve[x], (m//K-1)&1)
                yield ('write', x, m, w)
                if arrive: yield ('arrive', kvf[x])
            for t in range(min(K-1, ns)):
                yield from load(t, False)
            for t in range(min(K-1, ns)):
                yield ('rot', (n0+t)%K, n0+t, w)
            for t in range(min(K-1, ns)):
                yield ('arrive', kvf[(n0+t)%K])
            for i in range(ns):
                ahead = i+K-1<ns
                if ahead: yield from load(i+K-1, not rotKV)
                kx=n%K
                yield ('wait', kvf[kx], (n//K)&1)
                yield ('read', kx, n, w)
                x=n&1
                if n>=2: yield ('wait', empty[x], ((n>>1)-1)&1)
                yield ('arrive', full[x])
                t=i+K-1-lag
                if rotKV and i>=lag and t<ns:
                    yield ('rot', (n0+t)%K, n0+t, w)
                    yield ('arrive', kvf[(n0+t)%K])
                yield ('endread', kx, n, w)
                yield ('arrive', kve[kx])
                n+=1
    def kwg():
        n=0
        for ns in seqs:
            for i in range(ns):
                x=n&1
                yield ('wait', full[x], (n>>1)&1)
                yield ('arrive', empty[x])
                n+=1
    agents=[qwg(0), qwg(1), kwg()]
    cur=[None]*3
    while True:
        live=[i for i in range(3) if agents[i] is not None]
        if not live: break
        progressed=False
        order=live[:]; rnd.shuffle(order)
        for i in order:
            if cur[i] is None:
                try: cur[i]=next(agents[i])
                except StopIteration: agents[i]=None; progressed=True; break
            op=cur[i]
            if op[0]=='wait':
                if not op[1].done(op[2]): continue
            elif op[0]=='arrive': op[1].arrive()
            elif op[0] in ('write','rot'):
                _,x,m,w=op
                # no one may be reading slot x
                for t,rs in readers.items():
                    assert not (t%K==x and rs), ('race write', x, m, t, rs)
                slot_tile[x]=m
                if op[0]=='rot': written.setdefault(m,set()).add(w)
                elif not rotKV: written.setdefault(m,set()).add(w)
            elif op[0]=='read':
                _,x,m,w=op
                assert slot_tile[x]==m and written.get(m)=={0,1}, ('read before ready', x,m,written.get(m))
                readers.setdefault(m,set()).add(w)
            elif op[0]=='endread':
                readers[op[2]].discard(op[3])
            cur[i]=None; progressed=True
            break
        if not progressed:
            raise Exception(('deadlock', seqs, K, rotKV, [c[0] if c else None for c in cur]))
for K in (2,3,4):
  for rotKV in (False, True):
    for s in range(6000):
        r=random.Random(s)
        seqs=[r.choice([0,1,1,2,3,4,5,7]) for _ in range(r.randint(1,5))]
        run(seqs,K,rotKV,s)
print("broadcast_sm90_protocol: 36,000 walks, no deadlock, no early read, no overwrite")
