#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""ncu_sass_top.py: the stall picture of one kernel from an ncu source page
(`ncu -i REP --page source --csv --print-source sass > FILE`): the stall
reasons over all samples, the samples by opcode, and the N instructions
with the most samples (their index in the page, share, text, top reasons).

usage: ncu_sass_top.py FILE [N]
"""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = collections.Counter(); total = 0
items = []
for i, r in enumerate(data):
    if len(r) < len(hdr): continue
    s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0); total += s
    br = {h: int(r[ix[h]] or 0) for h in stalls}
    for h, v in br.items(): tot[h] += v
    items.append((s, i, r[ix["Source"]].strip(), br))
print("total samples", total)
for h, v in tot.most_common(12): print(f"  {h:28s} {v:8d} {100*v/total:5.1f}%")
# by opcode class
cls = collections.Counter()
for s, i, src, br in items:
    op = src.split()[0] if src else "?"
    if op.startswith("@"): op = src.split()[1]
    cls[op.split(".")[0]] += s
print("by opcode:", ", ".join(f"{k} {100*v/total:.1f}%" for k, v in cls.most_common(15)))
for s, i, src, br in sorted(items, reverse=True)[:n]:
    top = ", ".join(f"{h[6:]} {v}" for h, v in sorted(br.items(), key=lambda x: -x[1])[:3] if v)
    print(f"{i:5d} {100*s/total:5.2f}% {src[:70]:70s} {top}")
