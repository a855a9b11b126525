#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""cubin_code.py: compare the machine code of two directories of cubins
(tools/cubins.sh's), kernel by kernel: each .text.<kernel> section byte
for byte. For a template change that only moves kernels within a source:
the cubins then differ in their symbol order (.nv.info, .symtab), not in
any kernel's code. No cuobjdump needed: the sections are read from the ELF.

usage: tools/cubin_code.py DIR_A DIR_B   (exit 1 if any kernel's code differs)
"""
import os
import struct
import sys


def text_sections(path):
    b = open(path, "rb").read()
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]

    def name(off):
        end = b.index(b"\0", names + off)
        return b[names + off:end].decode()

    return {name(h[0]): b[h[4]:h[4] + h[5]] for h in hdrs if name(h[0]).startswith(".text.")}


def main():
    a, b = sys.argv[1], sys.argv[2]
    bad = 0
    files = sorted(f for f in os.listdir(a) if f.endswith(".cubin"))
    for f in files:
        if not os.path.exists(os.path.join(b, f)):
            print(f"only in {a}: {f}")
            bad += 1
            continue
        ta, tb = text_sections(os.path.join(a, f)), text_sections(os.path.join(b, f))
        diff = sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))
        if diff:
            bad += 1
            print(f"{f}: code differs in {', '.join(d[6:] for d in diff)}")
    print(f"{len(files) - bad} of {len(files)} cubins with the same code in every kernel")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
