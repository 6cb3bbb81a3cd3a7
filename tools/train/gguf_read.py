#!/usr/bin/python3
"""Minimal GGUF v3 reader (F32/F16 tensors) for the reference: reads back exactly the file the
C++ engine reads, so the fixtures are computed from the stored bytes."""
import struct

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(_SCALAR[t])

    assert buf[:4] == b"GGUF"
    pos = 4
    version, n_t, n_kv = take("<I"), take("<Q"), take("<Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("<I"))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        t, off = take("<I"), take("<Q")
        infos.append((name, ne, t, off))
    align = kv.get("general.alignment", 32)
    start = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, t, off in infos:
        dt = {0: np.float32, 1: np.float16}[t]
        n = int(np.prod(ne))
        a = np.frombuffer(buf, dtype=dt, count=n, offset=start + off).reshape(list(reversed(ne)))
        tensors[name] = a
    return kv, tensors
