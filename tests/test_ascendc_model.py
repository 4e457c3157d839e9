"""The Ascend C CPU model (tests/ascendc_model/, docs/ascendc_model.md) tested on its own: tiny
hand-written kernels, built with tests/ascendc_model/build.py and run in subprocesses (a rule
violation aborts the process, a crash must not kill the session).

* Every hardware rule of shared/tools/ASCENDC.md broken once: the process aborts with
  ``ascend-model: rule N (...)`` (and a positive control of the same kernel runs clean).
* Semantics against numpy / ml_dtypes: DataCopy and DataCopyPad in both directions (paddings,
  strides, the poisoned dummy bytes), every vector instruction, Cast in every A2 pair and round
  mode, ReduceSum (its documented summation order) / ReduceMax / ReduceMin, Compare / Select,
  double-buffered queues, SyncAll, integer atomic add, private UB per block, host-side launches
  from several threads and the platform queries.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.ascendc_model import build as model_build

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "ascendc-model-tests"
BF16 = ml_dtypes.bfloat16

# ---------------------------------------------------------------------------------------------
# kernels

RULES_CPP = r"""
#include "kernel_operator.h"
using namespace AscendC;

/* `which` selects one violation; 0 runs clean (the positive control) */
extern "C" __global__ __aicore__ void rules(GM_ADDR gm, uint32_t which) {
    TPipe pipe;
    GlobalTensor<float> g;
    g.SetGlobalBuffer((__gm__ float *)gm, 1024);
    TBuf<TPosition::VECCALC> b;
    TQue<TPosition::VECIN, 2> q;
    TQue<TPosition::VECIN, 1> q1;
    switch (which) {
    case 0: break;
    case 1: pipe.InitBuffer(q, 2, 100000); break;
    case 2: pipe.InitBuffer(b, 65536); break;
    case 3: { pipe.InitBuffer(b, 1024); LocalTensor<float> t = b.Get<float>(); DataCopy(t[4], g, 8); break; }
    case 4: { pipe.InitBuffer(b, 1024); LocalTensor<float> t = b.Get<float>(); Add(t[8], t[1], t[16], 8); break; }
    case 5: {
        GlobalTensor<half> h;
        h.SetGlobalBuffer((__gm__ half *)gm, 2048);
        pipe.InitBuffer(b, 1024);
        DataCopy(b.Get<half>(), h, 11);
        break;
    }
    case 6: {
        pipe.InitBuffer(b, 1024);
        DataCopyPad(b.Get<float>(), g, DataCopyExtParams{1, 6, 0, 0, 0},
                    DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
        break;
    }
    case 7: {
        pipe.InitBuffer(b, 1024);
        DataCopyPad(b.Get<float>(), g, DataCopyExtParams{1, 4, 0, 0, 0},
                    DataCopyPadExtParams<float>{true, 0, 9, 0.0f});
        break;
    }
    case 8: pipe.InitBuffer(q, 3, 64); break;
    case 9: { TBuf<> many[65]; for (auto &m : many) pipe.InitBuffer(m, 32); break; }
    case 10: {
        pipe.InitBuffer(q, 2, 64);
        q.AllocTensor<float>();
        q.AllocTensor<float>();
        q.AllocTensor<float>();
        break;
    }
    case 11: pipe.InitBuffer(q, 2, 64); q.DeQue<float>(); break;
    case 12: {
        pipe.InitBuffer(q, 2, 64);
        LocalTensor<float> t = q.AllocTensor<float>();
        q.FreeTensor(t);
        q.FreeTensor(t);
        break;
    }
    case 13: {
        pipe.InitBuffer(q, 2, 64);
        LocalTensor<float> t = q.AllocTensor<float>();
        q.FreeTensor(t);
        DataCopy(t, g, 16);
        break;
    }
    case 14: pipe.InitBuffer(q, 2, 64); pipe.InitBuffer(b, 64); q.EnQue(b.Get<float>()); break;
    case 15: {
        pipe.InitBuffer(q, 2, 64);
        LocalTensor<float> t = q.AllocTensor<float>();
        q.EnQue(t);
        Adds(t, t, 1.0f, 16);
        break;
    }
    case 16: {
        TQue<TPosition::VECIN, 2> qs[5];
        for (auto &x : qs) pipe.InitBuffer(x, 2, 32);
        for (int i = 0; i < 9; i++) qs[i / 2].AllocTensor<float>();
        break;
    }
    case 17: {
        pipe.InitBuffer(b, 65536);
        LocalTensor<float> t = b.Get<float>();
        Add(t, t, t, 64, 256, BinaryRepeatParams{});
        break;
    }
    case 18: {
        pipe.InitBuffer(b, 1024);
        LocalTensor<float> t = b.Get<float>();
        Add(t, t, t, 65, 1, BinaryRepeatParams{});
        break;
    }
    case 19: { pipe.InitBuffer(b, 256); LocalTensor<float> t = b.Get<float>(); Exp(t, t, 65); break; }
    case 20: { pipe.InitBuffer(b, 1024); LocalTensor<float> t = b.Get<float>(); Add(t[8], t, t, 16); break; }
    case 21: {
        pipe.InitBuffer(b, 1024);
        LocalTensor<float> t = b.Get<float>();
        Compare(t[128].ReinterpretCast<uint8_t>(), t, t[64], CMPMODE::LT, 40);
        break;
    }
    case 22: {
        pipe.InitBuffer(b, 1024);
        LocalTensor<float> t = b.Get<float>();
        Cast(t[128].ReinterpretCast<bfloat16_t>(), t, RoundMode::CAST_NONE, 64);
        break;
    }
    case 23: {
        pipe.InitBuffer(b, 1024);
        DataCopyPad(b.Get<float>(), g, DataCopyExtParams{2, 32, 0, 65536, 0}, DataCopyPadExtParams<float>{});
        break;
    }
    case 24: {
        pipe.InitBuffer(b, 1024);
        DataCopyPad(b.Get<float>(), g, DataCopyExtParams{4096, 32, 0, 0, 0}, DataCopyPadExtParams<float>{});
        break;
    }
    case 25: SetAtomicAdd<float>(); break;
    case 26: SyncAll(); break;
    case 27: if (GetBlockIdx() == 0) break; SyncAll(); break;
    case 28: g.GetValue(1024); break;
    case 29: { GlobalTensor<float> u; u.SetGlobalBuffer((__gm__ float *)gm); break; }
    case 30: pipe.InitBuffer(b, 1024); DataCopy(g[1000], b.Get<float>(), 32); break;
    case 31: {
        GlobalTensor<int16_t> s;
        s.SetGlobalBuffer((__gm__ int16_t *)gm, 2048);
        pipe.InitBuffer(b, 64);
        SetAtomicAdd<int32_t>();
        DataCopy(s, b.Get<int16_t>(), 16);
        break;
    }
    case 32: {
        pipe.InitBuffer(q1, 2, 64);
        LocalTensor<float> a = q1.AllocTensor<float>();
        LocalTensor<float> c = q1.AllocTensor<float>();
        q1.EnQue(a);
        q1.EnQue(c);
        break;
    }
    case 33: pipe.InitBuffer(b, 4096); DataCopyPad(g, b.Get<float>(), DataCopyExtParams{2, 32, 70000, 0, 0}); break;
    case 34: {
        TBuf<> w;
        pipe.InitBuffer(b, 4096);
        pipe.InitBuffer(w, 32);
        LocalTensor<float> t = b.Get<float>();
        ReduceMax(t[512], t, w.Get<float>(), 512);
        break;
    }
    case 35: { TPipe second; break; }
    case 36: {
        pipe.InitBuffer(b, 1024);
        LocalTensor<int32_t> t = b.Get<int32_t>();
        Cast(t[128].ReinterpretCast<half>(), t, RoundMode::CAST_NONE, 64);
        break;
    }
    case 37: { pipe.InitBuffer(b, 1024); LocalTensor<float> t = b.Get<float>(); t.GetValue(256); break; }
    case 38: {
        pipe.InitBuffer(b, 1024);
        LocalTensor<float> t = b.Get<float>();
        CompareScalar(t[128].ReinterpretCast<uint8_t>(), t, 0.5f, CMPMODE::GT, 72);
        break;
    }
    }
}
"""

COPY_CPP = r"""
#include "kernel_operator.h"
using namespace AscendC;

extern "C" __global__ __aicore__ void copy_roundtrip(GM_ADDR in, GM_ADDR out, uint32_t n) {
    TPipe pipe;
    TBuf<> a, c;
    pipe.InitBuffer(a, n * 4);
    pipe.InitBuffer(c, n * 4);
    GlobalTensor<float> gi, go;
    gi.SetGlobalBuffer((__gm__ float *)in, n);
    go.SetGlobalBuffer((__gm__ float *)out, n);
    LocalTensor<float> ta = a.Get<float>(), tc = c.Get<float>();
    DataCopy(ta, gi, n);
    DataCopy(tc, ta, n);
    DataCopy(go, tc, n);
}

/* prm: blockCount, blockLen (blocks), GM gap in, UB gap, GM gap out */
extern "C" __global__ __aicore__ void copy_params(GM_ADDR in, GM_ADDR out, GM_ADDR prm, uint32_t in_n, uint32_t out_n) {
    TPipe pipe;
    TBuf<> a;
    pipe.InitBuffer(a, 8192);
    GlobalTensor<int32_t> gp;
    gp.SetGlobalBuffer((__gm__ int32_t *)prm, 5);
    GlobalTensor<float> gi, go;
    gi.SetGlobalBuffer((__gm__ float *)in, in_n);
    go.SetGlobalBuffer((__gm__ float *)out, out_n);
    LocalTensor<float> t = a.Get<float>();
    Duplicate(t, -1.0f, 2048);
    DataCopyParams p;
    p.blockCount = gp.GetValue(0);
    p.blockLen = gp.GetValue(1);
    p.srcStride = gp.GetValue(2);
    p.dstStride = gp.GetValue(3);
    DataCopy(t, gi, p);
    DataCopyParams back(p.blockCount, p.blockLen, p.dstGap, (uint16_t)gp.GetValue(4));
    DataCopy(go, t, back);
}

/* prm: blockCount, blockLen (B), srcStride, dstStride, isPad, left, right, paddingValue */
template <typename T>
__aicore__ inline void pad_in(GM_ADDR in, GM_ADDR dump, GM_ADDR prm, uint32_t in_n, uint32_t ub_n) {
    TPipe pipe;
    TBuf<> a;
    pipe.InitBuffer(a, ub_n * sizeof(T));
    GlobalTensor<int32_t> gp;
    gp.SetGlobalBuffer((__gm__ int32_t *)prm, 8);
    GlobalTensor<T> gi, gd;
    gi.SetGlobalBuffer((__gm__ T *)in, in_n);
    gd.SetGlobalBuffer((__gm__ T *)dump, ub_n);
    LocalTensor<T> t = a.Get<T>();
    Duplicate(t, (T)-7.0f, ub_n);
    DataCopyExtParams p;
    p.blockCount = gp.GetValue(0);
    p.blockLen = gp.GetValue(1);
    p.srcStride = gp.GetValue(2);
    p.dstStride = gp.GetValue(3);
    DataCopyPadExtParams<T> pad;
    pad.isPad = gp.GetValue(4) != 0;
    pad.leftPadding = gp.GetValue(5);
    pad.rightPadding = gp.GetValue(6);
    pad.paddingValue = (T)(float)gp.GetValue(7);
    DataCopyPad(t, gi, p, pad);
    DataCopy(gd, t, ub_n);
}
extern "C" __global__ __aicore__ void pad_in_f32(GM_ADDR in, GM_ADDR dump, GM_ADDR prm, uint32_t in_n, uint32_t ub_n) {
    pad_in<float>(in, dump, prm, in_n, ub_n);
}
extern "C" __global__ __aicore__ void pad_in_f16(GM_ADDR in, GM_ADDR dump, GM_ADDR prm, uint32_t in_n, uint32_t ub_n) {
    pad_in<half>(in, dump, prm, in_n, ub_n);
}

/* prm: blockCount, blockLen (B), srcStride (UB blocks), dstStride (GM bytes) */
template <typename T>
__aicore__ inline void pad_out(GM_ADDR src, GM_ADDR out, GM_ADDR prm, uint32_t ub_n, uint32_t out_n) {
    TPipe pipe;
    TBuf<> a;
    pipe.InitBuffer(a, ub_n * sizeof(T));
    GlobalTensor<int32_t> gp;
    gp.SetGlobalBuffer((__gm__ int32_t *)prm, 4);
    GlobalTensor<T> gs, go;
    gs.SetGlobalBuffer((__gm__ T *)src, ub_n);
    go.SetGlobalBuffer((__gm__ T *)out, out_n);
    LocalTensor<T> t = a.Get<T>();
    DataCopy(t, gs, ub_n);
    DataCopyExtParams p;
    p.blockCount = gp.GetValue(0);
    p.blockLen = gp.GetValue(1);
    p.srcStride = gp.GetValue(2);
    p.dstStride = gp.GetValue(3);
    DataCopyPad(go, t, p);
}
extern "C" __global__ __aicore__ void pad_out_f32(GM_ADDR src, GM_ADDR out, GM_ADDR prm, uint32_t ub_n,
                                                  uint32_t out_n) {
    pad_out<float>(src, out, prm, ub_n, out_n);
}
extern "C" __global__ __aicore__ void pad_out_f16(GM_ADDR src, GM_ADDR out, GM_ADDR prm, uint32_t ub_n,
                                                  uint32_t out_n) {
    pad_out<half>(src, out, prm, ub_n, out_n);
}
"""

VECTOR_CPP = r"""
#include "kernel_operator.h"
using namespace AscendC;

template <typename T>
__aicore__ inline void bin(GM_ADDR a, GM_ADDR b, GM_ADDR out, uint32_t op, uint32_t n) {
    TPipe pipe;
    TBuf<> ba, bb, bo;
    pipe.InitBuffer(ba, n * sizeof(T));
    pipe.InitBuffer(bb, n * sizeof(T));
    pipe.InitBuffer(bo, n * sizeof(T));
    GlobalTensor<T> ga, gb, go;
    ga.SetGlobalBuffer((__gm__ T *)a, n);
    gb.SetGlobalBuffer((__gm__ T *)b, n);
    go.SetGlobalBuffer((__gm__ T *)out, n);
    LocalTensor<T> x = ba.Get<T>(), y = bb.Get<T>(), z = bo.Get<T>();
    DataCopy(x, ga, n);
    DataCopy(y, gb, n);
    Duplicate(z, (T)0, n);
    const T s = gb.GetValue(0);
    constexpr uint32_t per = 256 / sizeof(T);
    switch (op) {
    case 0: Add(z, x, y, n); break;
    case 1: Sub(z, x, y, n); break;
    case 2: Mul(z, x, y, n); break;
    case 3: if constexpr (std::is_same_v<T, float> || std::is_same_v<T, half>) Div(z, x, y, n); break;
    case 4: Max(z, x, y, n); break;
    case 5: Min(z, x, y, n); break;
    case 6: Adds(z, x, s, n); break;
    case 7: Muls(z, x, s, n); break;
    case 8: Maxs(z, x, s, n); break;
    case 9: Mins(z, x, s, n); break;
    case 10: Add(x, x, y, n); DataCopy(z, x, n); break;
    case 11: Add(z, x, y, per, n / per, BinaryRepeatParams{}); break;
    case 12: Add(z, x, y, per / 2, n / per / 2, BinaryRepeatParams(1, 1, 1, 16, 8, 16)); break;
    }
    DataCopy(go, z, n);
}
#define BIN(name, T)                                                                                \
    extern "C" __global__ __aicore__ void name(GM_ADDR a, GM_ADDR b, GM_ADDR o, uint32_t op, uint32_t n) { \
        bin<T>(a, b, o, op, n);                                                                     \
    }
BIN(bin_f32, float)
BIN(bin_f16, half)
BIN(bin_i32, int32_t)
BIN(bin_i16, int16_t)

template <typename T>
__aicore__ inline void un(GM_ADDR a, GM_ADDR out, uint32_t op, uint32_t n) {
    TPipe pipe;
    TBuf<> ba, bo;
    pipe.InitBuffer(ba, n * sizeof(T));
    pipe.InitBuffer(bo, n * sizeof(T));
    GlobalTensor<T> ga, go;
    ga.SetGlobalBuffer((__gm__ T *)a, n);
    go.SetGlobalBuffer((__gm__ T *)out, n);
    LocalTensor<T> x = ba.Get<T>(), z = bo.Get<T>();
    DataCopy(x, ga, n);
    if constexpr (std::is_same_v<T, int32_t>) {
        if (op == 6) Relu(z, x, n);
        if (op == 7) Duplicate(z, ga.GetValue(0), n);
    } else {
        switch (op) {
        case 0: Exp(z, x, n); break;
        case 1: Ln(z, x, n); break;
        case 2: Sqrt(z, x, n); break;
        case 3: Rsqrt(z, x, n); break;
        case 4: Reciprocal(z, x, n); break;
        case 5: Abs(z, x, n); break;
        case 6: Relu(z, x, n); break;
        case 7: Duplicate(z, ga.GetValue(0), n); break;
        case 8: Exp(x, x, n); DataCopy(z, x, n); break;
        }
    }
    DataCopy(go, z, n);
}
#define UN(name, T) \
    extern "C" __global__ __aicore__ void name(GM_ADDR a, GM_ADDR o, uint32_t op, uint32_t n) { un<T>(a, o, op, n); }
UN(un_f32, float)
UN(un_f16, half)
UN(un_i32, int32_t)

template <typename D, typename S>
__aicore__ inline void cast(GM_ADDR src, GM_ADDR dst, uint32_t mode, uint32_t n) {
    TPipe pipe;
    TBuf<> bs, bd;
    pipe.InitBuffer(bs, n * sizeof(S));
    pipe.InitBuffer(bd, n * sizeof(D));
    GlobalTensor<S> gs;
    GlobalTensor<D> gd;
    gs.SetGlobalBuffer((__gm__ S *)src, n);
    gd.SetGlobalBuffer((__gm__ D *)dst, n);
    LocalTensor<S> s = bs.Get<S>();
    LocalTensor<D> d = bd.Get<D>();
    DataCopy(s, gs, n);
    Cast(d, s, (RoundMode)mode, n);
    DataCopy(gd, d, n);
}
#define CAST(sn, S, dn, D)                                                                           \
    extern "C" __global__ __aicore__ void cast_##sn##_##dn(GM_ADDR s, GM_ADDR d, uint32_t m, uint32_t n) { \
        cast<D, S>(s, d, m, n);                                                                       \
    }
CAST(f32, float, f16, half)
CAST(f32, float, bf16, bfloat16_t)
CAST(f32, float, i32, int32_t)
CAST(f32, float, f32, float)
CAST(f32, float, i16, int16_t)
CAST(f32, float, i64, int64_t)
CAST(f16, half, f32, float)
CAST(f16, half, i32, int32_t)
CAST(f16, half, i16, int16_t)
CAST(f16, half, i8, int8_t)
CAST(f16, half, u8, uint8_t)
CAST(bf16, bfloat16_t, f32, float)
CAST(bf16, bfloat16_t, i32, int32_t)
CAST(i32, int32_t, f32, float)
CAST(i32, int32_t, i16, int16_t)
CAST(i32, int32_t, i64, int64_t)
CAST(i64, int64_t, i32, int32_t)
CAST(i64, int64_t, f32, float)
CAST(i16, int16_t, f16, half)
CAST(i16, int16_t, f32, float)
CAST(i8, int8_t, f16, half)
CAST(u8, uint8_t, f16, half)

template <typename T>
__aicore__ inline void red(GM_ADDR src, GM_ADDR out, uint32_t op, uint32_t n) {
    TPipe pipe;
    TBuf<> bs, bw, bo;
    pipe.InitBuffer(bs, n * sizeof(T));
    pipe.InitBuffer(bw, (n + 256) * sizeof(T));
    pipe.InitBuffer(bo, 32);
    GlobalTensor<T> gs, go;
    gs.SetGlobalBuffer((__gm__ T *)src, n);
    go.SetGlobalBuffer((__gm__ T *)out, 16);
    LocalTensor<T> s = bs.Get<T>(), w = bw.Get<T>(), o = bo.Get<T>();
    DataCopyPad(s, gs, DataCopyExtParams{1, (uint32_t)(n * sizeof(T)), 0, 0, 0},
                DataCopyPadExtParams<T>{false, 0, 0, (T)0});
    switch (op) {
    case 0: ReduceSum(o, s, w, n); break;
    case 1: ReduceMax(o, s, w, n); break;
    case 2: ReduceMax(o, s, w, n, true); break;
    case 3: ReduceMin(o, s, w, n); break;
    case 4: ReduceMin(o, s, w, n, true); break;
    }
    DataCopyPad(go, o, DataCopyExtParams{1, 2 * sizeof(T), 0, 0, 0});
}
#define RED(name, T) \
    extern "C" __global__ __aicore__ void name(GM_ADDR s, GM_ADDR o, uint32_t op, uint32_t n) { red<T>(s, o, op, n); }
RED(red_f32, float)
RED(red_f16, half)

/* Compare / CompareScalar into bit masks, Select both ways, And / Or / Not of the masks as uint16_t
 * words (logic: and, or, not of the two masks, n / 8 bytes each) */
template <typename T>
__aicore__ inline void cmpsel(GM_ADDR a, GM_ADDR b, GM_ADDR mask_out, GM_ADDR sel, GM_ADDR sel2, GM_ADDR smask_out,
                              GM_ADDR logic_out, uint32_t mode, uint32_t n) {
    TPipe pipe;
    TBuf<> ba, bb, bm, bz, bz2, bs, bl;
    pipe.InitBuffer(ba, n * sizeof(T));
    pipe.InitBuffer(bb, n * sizeof(T));
    pipe.InitBuffer(bm, n / 8);
    pipe.InitBuffer(bz, n * sizeof(T));
    pipe.InitBuffer(bz2, n * sizeof(T));
    pipe.InitBuffer(bs, n / 8);
    pipe.InitBuffer(bl, 3 * n / 8);
    GlobalTensor<T> ga, gb, gz, gz2;
    GlobalTensor<uint8_t> gm, gs, gl;
    ga.SetGlobalBuffer((__gm__ T *)a, n);
    gb.SetGlobalBuffer((__gm__ T *)b, n);
    gz.SetGlobalBuffer((__gm__ T *)sel, n);
    gz2.SetGlobalBuffer((__gm__ T *)sel2, n);
    gm.SetGlobalBuffer((__gm__ uint8_t *)mask_out, n / 8);
    gs.SetGlobalBuffer((__gm__ uint8_t *)smask_out, n / 8);
    gl.SetGlobalBuffer((__gm__ uint8_t *)logic_out, 3 * n / 8);
    LocalTensor<T> x = ba.Get<T>(), y = bb.Get<T>(), z = bz.Get<T>(), z2 = bz2.Get<T>();
    LocalTensor<uint8_t> m = bm.Get<uint8_t>(), ms = bs.Get<uint8_t>(), lg = bl.Get<uint8_t>();
    DataCopy(x, ga, n);
    DataCopy(y, gb, n);
    Compare(m, x, y, (CMPMODE)mode, n);
    CompareScalar(ms, x, (T)1.5f, (CMPMODE)mode, n);
    Select(z, m, x, y, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    Select(z2, m, x, (T)2.5f, SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    const int32_t words = (int32_t)(n / 16);
    And(lg.ReinterpretCast<uint16_t>(), m.ReinterpretCast<uint16_t>(), ms.ReinterpretCast<uint16_t>(), words);
    Or(lg[n / 8].ReinterpretCast<uint16_t>(), m.ReinterpretCast<uint16_t>(), ms.ReinterpretCast<uint16_t>(), words);
    Not(lg[n / 4].ReinterpretCast<uint16_t>(), m.ReinterpretCast<uint16_t>(), words);
    DataCopyPad(gm, m, DataCopyExtParams{1, n / 8, 0, 0, 0});
    DataCopyPad(gs, ms, DataCopyExtParams{1, n / 8, 0, 0, 0});
    DataCopyPad(gl, lg, DataCopyExtParams{1, 3 * n / 8, 0, 0, 0});
    DataCopy(gz, z, n);
    DataCopy(gz2, z2, n);
}
#define CMPSEL(name, T)                                                                                  \
    extern "C" __global__ __aicore__ void name(GM_ADDR a, GM_ADDR b, GM_ADDR m, GM_ADDR s, GM_ADDR s2,     \
                                               GM_ADDR ms, GM_ADDR lg, uint32_t mode, uint32_t n) {      \
        cmpsel<T>(a, b, m, s, s2, ms, lg, mode, n);                                                      \
    }
CMPSEL(cmpsel_f32, float)
CMPSEL(cmpsel_f16, half)
"""

BLOCKS_CPP = r"""
#include "kernel_operator.h"
using namespace AscendC;

/* y = 2x + 1 through VECIN/VECOUT queues of 2 buffers each; PRELOAD keeps two tiles in flight
 * (a class template: the queues' member templates need `.template`, with bisheng too) */
template <int32_t DEPTH, bool PRELOAD>
class Pipeline {
public:
    __aicore__ inline void Init(GM_ADDR x, GM_ADDR y, uint32_t total, uint32_t tile) {
        tile_ = tile;
        per_ = total / GetBlockNum();
        xg.SetGlobalBuffer((__gm__ float *)x + per_ * GetBlockIdx(), per_);
        yg.SetGlobalBuffer((__gm__ float *)y + per_ * GetBlockIdx(), per_);
        pipe.InitBuffer(inQ, 2, tile * sizeof(float));
        pipe.InitBuffer(outQ, 2, tile * sizeof(float));
    }
    __aicore__ inline void Process() {
        uint32_t tiles = per_ / tile_;
        if (PRELOAD) {
            for (uint32_t i = 0; i < tiles && i < 2; i++) CopyIn(i);
            for (uint32_t i = 0; i < tiles; i++) {
                Compute();
                CopyOut(i);
                if (i + 2 < tiles) CopyIn(i + 2);
            }
        } else {
            for (uint32_t i = 0; i < tiles; i++) {
                CopyIn(i);
                Compute();
                CopyOut(i);
            }
        }
    }

private:
    __aicore__ inline void CopyIn(uint32_t i) {
        LocalTensor<float> t = inQ.template AllocTensor<float>();
        DataCopy(t, xg[i * tile_], tile_);
        inQ.EnQue(t);
    }
    __aicore__ inline void Compute() {
        LocalTensor<float> x = inQ.template DeQue<float>();
        LocalTensor<float> y = outQ.template AllocTensor<float>();
        Muls(y, x, 2.0f, tile_);
        Adds(y, y, 1.0f, tile_);
        outQ.template EnQue<float>(y);
        inQ.FreeTensor(x);
    }
    __aicore__ inline void CopyOut(uint32_t i) {
        LocalTensor<float> y = outQ.template DeQue<float>();
        DataCopy(yg[i * tile_], y, tile_);
        outQ.FreeTensor(y);
    }
    TPipe pipe;
    TQue<QuePosition::VECIN, DEPTH> inQ;
    TQue<QuePosition::VECOUT, DEPTH> outQ;
    GlobalTensor<float> xg, yg;
    uint32_t tile_ = 0, per_ = 0;
};
extern "C" __global__ __aicore__ void pipeline_d1(GM_ADDR x, GM_ADDR y, uint32_t total, uint32_t tile) {
    Pipeline<1, false> op;
    op.Init(x, y, total, tile);
    op.Process();
}
extern "C" __global__ __aicore__ void pipeline_d2(GM_ADDR x, GM_ADDR y, uint32_t total, uint32_t tile) {
    Pipeline<2, true> op;
    op.Init(x, y, total, tile);
    op.Process();
}
extern "C" __global__ __aicore__ void pipeline_d1_preload(GM_ADDR x, GM_ADDR y, uint32_t total, uint32_t tile) {
    Pipeline<1, true> op;
    op.Init(x, y, total, tile);
    op.Process();
}

/* each block sums its slice into ws; after SyncAll block 0 adds the partial sums in block order;
 * after a second SyncAll every block reads the total back */
extern "C" __global__ __aicore__ void syncall_sum(GM_ADDR x, GM_ADDR ws, GM_ADDR out, uint32_t per) {
    TPipe pipe;
    TBuf<> bx, bw, bs;
    pipe.InitBuffer(bx, per * 4);
    pipe.InitBuffer(bw, per * 4 + 256);
    pipe.InitBuffer(bs, 32);
    int64_t idx = GetBlockIdx(), num = GetBlockNum();
    GlobalTensor<float> gx, gws, gout;
    gx.SetGlobalBuffer((__gm__ float *)x + idx * per, per);
    gws.SetGlobalBuffer((__gm__ float *)ws, num * 8);
    gout.SetGlobalBuffer((__gm__ float *)out, num + 1);
    LocalTensor<float> tx = bx.Get<float>(), tw = bw.Get<float>(), ts = bs.Get<float>();
    DataCopy(tx, gx, per);
    ReduceSum(ts, tx, tw, per);
    DataCopy(gws[idx * 8], ts, 8);
    SyncAll();
    if (idx == 0) {
        float total = 0;
        for (int64_t b = 0; b < num; b++) total += gws.GetValue(b * 8);
        gout.SetValue(0, total);
    }
    SyncAll();
    gout.SetValue(1 + idx, gout.GetValue(0));
}

template <typename T>
__aicore__ inline void atomic_add(GM_ADDR x, GM_ADDR out, uint32_t n) {
    TPipe pipe;
    TBuf<> b;
    pipe.InitBuffer(b, n * sizeof(T));
    GlobalTensor<T> gx, go;
    gx.SetGlobalBuffer((__gm__ T *)x + GetBlockIdx() * n, n);
    go.SetGlobalBuffer((__gm__ T *)out, n);
    LocalTensor<T> t = b.Get<T>();
    DataCopy(t, gx, n);
    SetAtomicAdd<T>();
    DataCopy(go, t, n);
    SetAtomicNone();
}
extern "C" __global__ __aicore__ void atomic_i32(GM_ADDR x, GM_ADDR o, uint32_t n) { atomic_add<int32_t>(x, o, n); }
extern "C" __global__ __aicore__ void atomic_i8(GM_ADDR x, GM_ADDR o, uint32_t n) { atomic_add<int8_t>(x, o, n); }
extern "C" __global__ __aicore__ void atomic_pad_i32(GM_ADDR x, GM_ADDR out, uint32_t n) {
    TPipe pipe;
    TBuf<> b;
    pipe.InitBuffer(b, n * 4);
    GlobalTensor<int32_t> gx, go;
    gx.SetGlobalBuffer((__gm__ int32_t *)x + GetBlockIdx() * n, n);
    go.SetGlobalBuffer((__gm__ int32_t *)out, n);
    LocalTensor<int32_t> t = b.Get<int32_t>();
    DataCopyPad(t, gx, DataCopyExtParams{1, n * 4, 0, 0, 0}, DataCopyPadExtParams<int32_t>{});
    SetAtomicAdd<int32_t>();
    DataCopyPad(go, t, DataCopyExtParams{1, n * 4, 0, 0, 0});
    DisableDmaAtomic();
}

/* every block writes its own value at the same UB address */
extern "C" __global__ __aicore__ void ub_private(GM_ADDR out) {
    TPipe pipe;
    TBuf<> b;
    pipe.InitBuffer(b, 32);
    LocalTensor<int32_t> t = b.Get<int32_t>();
    Duplicate(t, (int32_t)GetBlockIdx() * 10 + 1, 8);
    SyncAll();
    GlobalTensor<int32_t> g;
    g.SetGlobalBuffer((__gm__ int32_t *)out, GetBlockNum() * 2);
    g.SetValue(GetBlockIdx() * 2, t.GetValue(0));
    g.SetValue(GetBlockIdx() * 2 + 1, (int32_t)t.GetPhyAddr());
}

/* sync helpers compile and do nothing */
extern "C" __global__ __aicore__ void sync_noops(GM_ADDR out) {
    TPipe pipe;
    PipeBarrier<PIPE_ALL>();
    PipeBarrier<PIPE_V>();
    PipeBarrier<PIPE_MTE2>();
    PipeBarrier<PIPE_MTE3>();
    TEventID e = GetTPipePtr()->FetchEventID(HardEvent::V_S);
    SetFlag<HardEvent::V_S>(e);
    WaitFlag<HardEvent::V_S>(e);
    GlobalTensor<int32_t> g;
    g.SetGlobalBuffer((__gm__ int32_t *)out, 1);
    g.SetValue(0, 42);
}
"""

HOST_CPP = r"""
#include "aclrtlaunch_pipeline_d1.h" /* includes acl/acl_base.h (ACL_SUCCESS) when the include path has it */
#include "tiling/platform/platform_ascendc.h"
#include "acl/acl.h"                 /* the project's acl headers after the model's: same aclrtStream */
#include <thread>
#include <vector>

extern "C" int host_platform(uint64_t *out) {
    platform_ascendc::PlatformAscendC *p = platform_ascendc::PlatformAscendCManager::GetInstance();
    platform_ascendc::PlatformAscendC q(nullptr);
    uint64_t ub = 0, ub2 = 0;
    p->GetCoreMemSize(platform_ascendc::CoreMemType::UB, ub);
    q.GetCoreMemSize(platform_ascendc::CoreMemType::UB, ub2);
    out[0] = p->GetCoreNumAiv();
    out[1] = ub;
    out[2] = q.GetCoreNumAiv();
    out[3] = ub2;
    out[4] = p->GetCoreNumAic();
    return ACL_SUCCESS;
}

/* nthreads host threads launch pipeline_d1 on their own slices at once */
extern "C" int host_threads(float *x, float *y, uint32_t total, uint32_t tile, uint32_t nthreads) {
    std::vector<std::thread> ts;
    std::vector<uint32_t> rc(nthreads, 1);
    aclrtStream stream = nullptr;
    for (uint32_t t = 0; t < nthreads; t++)
        ts.emplace_back([=, &rc] {
            rc[t] = ACLRT_LAUNCH_KERNEL(pipeline_d1)(4, stream, x + t * total, y + t * total, total, tile);
        });
    for (auto &t : ts) t.join();
    int bad = 0;
    for (uint32_t r : rc) bad += r != 0;
    return bad;
}
"""

MM_TILING_H = r"""
#ifndef MM_TILING_H
#define MM_TILING_H
#include "kernel_tiling/kernel_tiling.h" /* as an op's tiling header includes it: host and kernel */
/* the parameters of one matmul test: a batch of P_ITEMS products, item w at offsets off + w * stride */
enum { P_M, P_N, P_K, P_ORGM, P_ORGN, P_ORGKA, P_ORGKB, P_ORGKC, P_OFFA, P_OFFB, P_OFFC, P_STRA, P_STRB, P_STRC,
       P_TA, P_TB, P_ITEMS, P_SZA, P_SZB, P_SZC, P_BIAS, P_COUNT };
typedef struct {
    int32_t p[24];
    TCubeTiling mm0;
    TCubeTiling mm1;
} mm_tiling_t;
#endif
"""

MATMUL_CPP = r"""
#include "kernel_operator.h"
#include "lib/matmul_intf.h"
#include "mm_tiling.h"
using namespace AscendC;
using namespace matmul;

template <typename T>
__aicore__ inline void mm_run(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws, GM_ADDR tiling) {
    SetSysWorkspace(ws);
    GM_ADDR usr = GetUserWorkspace(ws);
    (void)usr;
    mm_tiling_t tl;
    memcpy(&tl, (const void *)tiling, sizeof tl);
    const int32_t *p = tl.p;
    GlobalTensor<T> gA, gB;
    GlobalTensor<float> gC, gBias;
    gA.SetGlobalBuffer((__gm__ T *)a, p[P_SZA]);
    gB.SetGlobalBuffer((__gm__ T *)b, p[P_SZB]);
    gC.SetGlobalBuffer((__gm__ float *)c, p[P_SZC]);
    gBias.SetGlobalBuffer((__gm__ float *)bias, p[P_N]);
    TPipe pipe;
    Matmul<MatmulType<TPosition::GM, CubeFormat::ND, T, true>, MatmulType<TPosition::GM, CubeFormat::ND, T, true>,
           MatmulType<TPosition::GM, CubeFormat::ND, float>, MatmulType<TPosition::GM, CubeFormat::ND, float>> mm0;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm0, &tl.mm0);
    TBuf<> scratch;
    pipe.InitBuffer(scratch, 1024); /* vector buffers after the registration */
    for (int64_t i = GetBlockIdx(); i < p[P_ITEMS]; i += GetBlockNum() * GetTaskRation()) {
        if (p[P_ORGKA] == p[P_ORGKB] && p[P_ORGKC] == 0)
            mm0.SetOrgShape(p[P_ORGM], p[P_ORGN], p[P_ORGKA]);
        else
            mm0.SetOrgShape(p[P_ORGM], p[P_ORGN], p[P_ORGKA], p[P_ORGKB], p[P_ORGKC]);
        mm0.SetSingleShape(p[P_M], p[P_N], p[P_K]);
        mm0.SetTensorA(gA[p[P_OFFA] + i * p[P_STRA]], p[P_TA] != 0);
        mm0.SetTensorB(gB[p[P_OFFB] + i * p[P_STRB]], p[P_TB] != 0);
        if (p[P_BIAS])
            mm0.SetBias(gBias);
        else
            mm0.DisableBias();
        mm0.IterateAll(gC[p[P_OFFC] + i * p[P_STRC]]);
    }
    mm0.End();
}
extern "C" __global__ __aicore__ void mm_f16(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws,
                                             GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    mm_run<half>(a, b, bias, c, ws, tiling);
}
extern "C" __global__ __aicore__ void mm_f32(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws,
                                             GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    mm_run<float>(a, b, bias, c, ws, tiling);
}

/* what a block of a MIX launch sees (and SyncAll over all 2B AIV blocks) */
extern "C" __global__ __aicore__ void mix_ids(GM_ADDR out, GM_ADDR ws) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    GlobalTensor<int32_t> g;
    g.SetGlobalBuffer((__gm__ int32_t *)out, GetBlockNum() * GetTaskRation() * 5);
    int64_t i = GetBlockIdx();
    g.SetValue(i * 5, (int32_t)i);
    g.SetValue(i * 5 + 1, (int32_t)GetBlockNum());
    g.SetValue(i * 5 + 2, (int32_t)GetTaskRation());
    if ASCEND_IS_AIV {
        g.SetValue(i * 5 + 3, 1);
    }
    if ASCEND_IS_AIC {
        g.SetValue(i * 5 + 3, 2);
    }
    g.SetValue(i * 5 + 4, (int32_t)(GetUserWorkspace(ws) - ws));
    SyncAll();
}
extern "C" __global__ __aicore__ void plain_ids(GM_ADDR out) {
    GlobalTensor<int32_t> g;
    g.SetGlobalBuffer((__gm__ int32_t *)out, GetBlockNum() * 3);
    int64_t i = GetBlockIdx();
    g.SetValue(i * 3, (int32_t)i);
    g.SetValue(i * 3 + 1, (int32_t)GetBlockNum());
    g.SetValue(i * 3 + 2, (int32_t)GetTaskRation());
}

using MM = Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>, MatmulType<TPosition::GM, CubeFormat::ND, half>,
                  MatmulType<TPosition::GM, CubeFormat::ND, float>>;

/* the Matmul rules: `which` selects one violation; 0 and 15 run clean */
extern "C" __global__ __aicore__ void mm_rules(GM_ADDR gm, uint32_t which) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    TCubeTiling t;
    t.usedCoreNum = 1;
    t.M = t.N = t.Ka = t.Kb = t.singleCoreM = t.singleCoreN = t.singleCoreK = 32;
    t.baseM = t.baseN = t.baseK = 32;
    t.depthA1 = t.depthB1 = t.stepM = t.stepN = t.stepKa = t.stepKb = t.dbL0A = t.dbL0B = t.dbL0C = 1;
    if (which == 9) t.baseM = t.baseK = 256;
    GlobalTensor<half> h;
    h.SetGlobalBuffer((__gm__ half *)gm, 2048);
    GlobalTensor<float> f;
    f.SetGlobalBuffer((__gm__ float *)gm + 1024, 1024);
    if (which != 5) SetSysWorkspace(gm);
    TPipe pipe;
    TBuf<> b;
    MM mm, m2, m3, m4, m5;
    switch (which) {
    case 1: pipe.InitBuffer(b, 64); REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t); break;
    case 2: REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t); mm.SetSingleShape(33, 32, 32); break;
    case 5: REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t); break;
    case 6:
        REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t, m2, &t, m3, &t, m4, &t);
        REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), m5, &t);
        break;
    case 7: mm.SetSingleShape(32, 32, 32); break;
    case 9: REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t); break;
    case 10: REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t); mm.SetSingleShape(0, 32, 32); break;
    case 11: REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t); mm.SetTensorA(h, true); break;
    case 13: REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm); mm.SetSingleShape(32, 32, 32); break;
    case 14: REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t); mm.End(); mm.SetSingleShape(32, 32, 32); break;
    default: {
        if (which == 15) {
            REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm);
            mm.Init(&t, &pipe);
            REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), m2, &t, m3, &t, m4, &t);
        } else {
            REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
        }
        pipe.InitBuffer(b, 64);
        if (which == 12) mm.SetOrgShape(32, 32, 16);
        mm.SetSingleShape(32, 32, 32);
        if (which != 8) mm.SetTensorA(h);
        mm.SetTensorB(h[1024]);
        if (which == 3) mm.IterateAll(f, 1);
        mm.IterateAll(which == 4 ? f[100] : f);
        mm.End();
    }
    }
}

/* Matmul in a kernel without KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2) */
extern "C" __global__ __aicore__ void mm_not_mix(GM_ADDR gm) {
    SetSysWorkspace(gm);
    TCubeTiling t;
    TPipe pipe;
    MM mm;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
}

/* the macro outside the kernel's own body: build.py does not see it, the launch is not MIX */
__aicore__ inline void declare_mix() { KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2); }
extern "C" __global__ __aicore__ void mix_in_helper(GM_ADDR gm) {
    (void)gm;
    declare_mix();
}
"""

MATMUL_HOST_CPP = r"""
#include <cstring>
#include <vector>
#include "aclrtlaunch_mm_f16.h"
#include "aclrtlaunch_mm_f32.h"
#include "tiling/tiling_api.h"
#include "tiling/platform/platform_ascendc.h"
#include "mm_tiling.h"

using matmul_tiling::CubeFormat;
using matmul_tiling::DataType;
using matmul_tiling::TPosition;

/* host tiling + launch, as a generated host entry does it; the workspace = system part + user part */
extern "C" int64_t host_matmul(void *a, void *b, void *bias, void *c, const int32_t *prm, uint32_t blocks, uint32_t f32,
                               mm_tiling_t *tl) {
    memcpy(tl->p, prm, sizeof tl->p);
    matmul_tiling::MatmulApiTiling mt(*platform_ascendc::PlatformAscendCManager::GetInstance());
    DataType dt = f32 ? DataType::DT_FLOAT : DataType::DT_FLOAT16;
    mt.SetAType(TPosition::GM, CubeFormat::ND, dt, prm[P_TA] != 0);
    mt.SetBType(TPosition::GM, CubeFormat::ND, dt, prm[P_TB] != 0);
    mt.SetCType(TPosition::GM, CubeFormat::ND, DataType::DT_FLOAT);
    mt.SetBiasType(TPosition::GM, CubeFormat::ND, DataType::DT_FLOAT);
    mt.SetShape(prm[P_M], prm[P_N], prm[P_K]);
    mt.SetOrgShape(prm[P_ORGM], prm[P_ORGN], prm[P_ORGKA], prm[P_ORGKB]);
    mt.SetBias(prm[P_BIAS] != 0);
    mt.SetBufferSpace(-1, -1, -1);
    if (mt.GetTiling(tl->mm0) == -1) return -1;
    uint32_t sys = platform_ascendc::PlatformAscendCManager::GetInstance()->GetLibApiWorkSpaceSize();
    std::vector<uint8_t> ws(sys + 64);
    if (f32) return ACLRT_LAUNCH_KERNEL(mm_f32)(blocks, nullptr, a, b, bias, c, ws.data(), tl);
    return ACLRT_LAUNCH_KERNEL(mm_f16)(blocks, nullptr, a, b, bias, c, ws.data(), tl);
}

static int64_t tiling_of(DataType a, DataType b, DataType c, int32_t m, int32_t n, int32_t k, int32_t orgM,
                         TCubeTiling *out = nullptr) {
    matmul_tiling::MatmulApiTiling mt;
    mt.SetAType(TPosition::GM, CubeFormat::ND, a);
    mt.SetBType(TPosition::GM, CubeFormat::ND, b, true);
    mt.SetCType(TPosition::GM, CubeFormat::ND, c);
    mt.SetShape(m, n, k);
    if (orgM) mt.SetOrgShape(orgM, n, orgM);
    TCubeTiling t;
    int64_t r = mt.GetTiling(t);
    if (out) *out = t;
    return r;
}

/* GetTiling's results and fields (see test_matmul_host_tiling) */
extern "C" int64_t host_tiling(int64_t *out) {
    const DataType F16 = DataType::DT_FLOAT16, F32 = DataType::DT_FLOAT, BF16 = DataType::DT_BF16;
    TCubeTiling t;
    int i = 0;
    out[i++] = tiling_of(F16, F16, F32, 100, 300, 70, 0, &t);
    for (int32_t v : {t.usedCoreNum, t.M, t.N, t.Ka, t.Kb, t.singleCoreM, t.singleCoreN, t.singleCoreK, t.baseM,
                      t.baseN, t.baseK, t.depthA1, t.depthB1, t.stepM, t.stepN, t.stepKa, t.stepKb, t.isBias,
                      t.iterateOrder, t.dbL0A, t.dbL0B, t.dbL0C})
        out[i++] = v;
    out[i++] = tiling_of(F32, F32, F32, 200, 300, 100, 0, &t);
    out[i++] = t.baseM;
    out[i++] = t.baseN;
    out[i++] = t.baseK;
    out[i++] = tiling_of(BF16, BF16, F32, 8, 8, 8, 0);
    out[i++] = tiling_of(F16, F32, F32, 16, 16, 16, 0);   /* A and B differ */
    out[i++] = tiling_of(F16, F16, F16, 16, 16, 16, 0);   /* C not float */
    out[i++] = tiling_of(F16, F16, F32, 0, 16, 16, 0);    /* shape 0 */
    out[i++] = tiling_of(F16, F16, F32, 16, 16, 16, 8);   /* shape > org shape */
    out[i++] = tiling_of(F16, F16, F32, 16, 16, 16, 70000); /* orgM * orgKa > INT32_MAX */
    out[i++] = tiling_of(DataType::DT_INT8, DataType::DT_INT8, F32, 16, 16, 16, 0);
    matmul_tiling::MatmulApiTiling none;
    none.SetShape(16, 16, 16);
    out[i++] = none.GetTiling(t); /* no types set */
    matmul_tiling::MultiCoreMatmulTiling mc(*platform_ascendc::PlatformAscendCManager::GetInstance());
    mc.SetAType(TPosition::GM, CubeFormat::ND, F16);
    mc.SetBType(TPosition::GM, CubeFormat::ND, F16);
    mc.SetCType(TPosition::GM, CubeFormat::ND, F32);
    mc.SetShape(128, 128, 64);
    mc.SetDim(4);
    mc.SetSingleShape(64, 64, -1);
    out[i++] = mc.GetTiling(t);
    out[i++] = t.usedCoreNum;
    out[i++] = t.singleCoreM;
    out[i++] = t.singleCoreK;
    mc.SetDim(2);
    out[i++] = mc.GetTiling(t); /* needs 4 cores */
    out[i++] = platform_ascendc::PlatformAscendCManager::GetInstance()->GetLibApiWorkSpaceSize();
    return i;
}
"""

SOURCES = {"rules.cpp": RULES_CPP, "copy.cpp": COPY_CPP, "vector.cpp": VECTOR_CPP, "blocks.cpp": BLOCKS_CPP,
           "host.cpp": HOST_CPP, "mm_tiling.h": MM_TILING_H, "matmul.cpp": MATMUL_CPP,
           "matmul_host.cpp": MATMUL_HOST_CPP}

pytestmark = pytest.mark.skipif(model_build.cxx() is None, reason="no C++ compiler (g++)")


@pytest.fixture(scope="module")
def lib() -> Path:
    return model_build.build(SOURCES, OUT, include_dirs=[REPO / "generated" / "include"])


# ---------------------------------------------------------------------------------------------
# running kernels in a subprocess

_WORKER = r"""
import ctypes, json, sys, threading
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
arrays = dict(np.load(sys.argv[2]))
calls = json.loads(sys.argv[4])
kinds = {"u32": ctypes.c_uint32, "i32": ctypes.c_int32, "u64": ctypes.c_uint64}
def conv(a):
    if a[0] == "a":
        return ctypes.c_void_p(arrays[a[1]].ctypes.data)
    if a[0] == "null":
        return ctypes.c_void_p(None)
    return kinds[a[0]](a[1])
rets = [None] * len(calls)
def one(i):
    f = getattr(lib, calls[i]["fn"])
    f.restype = ctypes.c_int64
    rets[i] = f(*[conv(a) for a in calls[i]["args"]])
i = 0
while i < len(calls):
    j = i + 1
    g = calls[i].get("group")
    while g is not None and j < len(calls) and calls[j].get("group") == g:
        j += 1
    ts = [threading.Thread(target=one, args=(k,)) for k in range(i, j)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    i = j
np.savez(sys.argv[3], **arrays)
print(json.dumps(rets))
"""


def kernel(name: str, blocks: int, *args: object, group: int | None = None) -> dict:
    """A launch of ``aclrtlaunch_<name>(blocks, NULL, args...)``: str = array, int = uint32_t."""
    return call(f"aclrtlaunch_{name}", ("u32", blocks), ("null",), *args, group=group)


def call(fn: str, *args: object, group: int | None = None) -> dict:
    conv = [["a", a] if isinstance(a, str) else ["u32", a] if isinstance(a, int) else list(a) for a in args]
    return {"fn": fn, "args": conv, "group": group}


def _spawn(lib: Path, calls: list[dict], arrays: dict[str, np.ndarray], env: dict[str, str] | None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPGEN_ASCEND_")}
    full_env.update(env or {})
    with tempfile.TemporaryDirectory() as d:
        np.savez(Path(d) / "in.npz", **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
        r = subprocess.run([sys.executable, "-c", _WORKER, str(lib), str(Path(d) / "in.npz"),
                            str(Path(d) / "out.npz"), json.dumps(calls)],
                           capture_output=True, text=True, env=full_env, timeout=120)
        out = dict(np.load(Path(d) / "out.npz")) if r.returncode == 0 else {}
    return r, out


def run(lib: Path, calls: list[dict], env: dict[str, str] | None = None, **arrays: np.ndarray):
    """Run the calls in a fresh process; returns (arrays after the calls, return values)."""
    r, out = _spawn(lib, calls, arrays, env)
    assert r.returncode == 0, f"worker failed ({r.returncode}):\n{r.stderr[-4000:]}"
    return out, json.loads(r.stdout.strip().splitlines()[-1])


def aborts(lib: Path, calls: list[dict], env: dict[str, str] | None = None, **arrays: np.ndarray) -> str:
    """Run the calls, which must abort; returns the model's message."""
    r, _ = _spawn(lib, calls, arrays, env)
    assert r.returncode == -signal.SIGABRT, f"expected an abort, got {r.returncode}:\n{r.stdout}\n{r.stderr}"
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ascend-model: ")]
    assert len(lines) == 1, r.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------
# the rules: each broken once

RULE_CASES = [
    # which, blocks, env, rule, short name, text
    (1, 1, None, 1, "ub capacity", "> UB size 196608 B"),
    (2, 1, {"OPGEN_ASCEND_UB_SIZE": "32768"}, 1, "ub capacity", "> UB size 32768 B"),
    (3, 1, None, 2, "ub alignment", "DataCopy(GM->UB): dst starts at UB byte 16"),
    (4, 1, None, 2, "ub alignment", "Add: src0 starts at UB byte 4"),
    (5, 1, None, 3, "datacopy length", "11 x half = 22 B is not a multiple of 32 B"),
    (6, 1, None, 4, "datacopypad", "blockLen 6 B is not a multiple of sizeof(float) = 4"),
    (7, 1, None, 4, "datacopypad", "rightPadding 9 elements of float"),
    (8, 1, None, 5, "initbuffer", "num must be 1 or 2"),
    (9, 1, None, 5, "initbuffer", "64 buffers already + 1 = 65 > 64"),
    (10, 1, None, 6, "queue protocol", "all 2 buffer(s) from InitBuffer are allocated"),
    (11, 1, None, 6, "queue protocol", "DeQue on an empty TQue<VECIN, 2>"),
    (12, 1, None, 6, "queue protocol", "FreeTensor of a tensor (UB 0) that was already freed"),
    (13, 1, None, 6, "queue protocol", "DataCopy(GM->UB): tensor (UB 0, 64 B) used after FreeTensor"),
    (14, 1, None, 6, "queue protocol", "EnQue of a TBuf tensor"),
    (15, 1, None, 6, "queue protocol", "Adds: tensor (UB 0) used while it is in its queue"),
    (16, 1, None, 6, "queue protocol", "a 9th tensor allocated at once on TPosition::VECIN"),
    (17, 1, None, 7, "vector op", "repeatTime 256 is outside [0, 255]"),
    (18, 1, None, 7, "vector op", "mask 65 > 64 elements of float per repeat"),
    (19, 1, None, 7, "vector op", "Exp: dst needs 260 B but the tensor has 256 B"),
    (20, 1, None, 7, "vector op", "partially overlap"),
    (21, 1, None, 7, "vector op", "count 40 x float = 160 B is not a multiple of 256 B"),
    (22, 1, None, 7, "vector op", "Cast float->bfloat16_t does not support RoundMode::CAST_NONE"),
    (23, 1, None, 8, "copy params", "dstStride (UB side, 32-B blocks) 65536 > 65535"),
    (24, 1, None, 8, "copy params", "blockCount 4096 > 4095"),
    (33, 1, None, 8, "copy params", "srcStride (UB side, 32-B blocks) 70000 > 65535"),
    (25, 1, None, 9, "atomic", "SetAtomicAdd<float>(): float atomic add is forbidden"),
    (31, 1, None, 9, "atomic", "DataCopy(UB->GM) of int16_t while SetAtomicAdd<int32_t>() is on"),
    (26, 8, {"OPGEN_ASCEND_AIV_CORES": "4"}, 10, "blocks", "SyncAll with numBlocks 8 > 4 AIV cores"),
    (27, 2, None, 10, "blocks", "returned without reaching it"),
    (28, 1, None, 0, "bounds", "GlobalTensor::GetValue: GM bytes [4096, 4100)"),
    (29, 1, None, 0, "model", "SetGlobalBuffer(buffer) without a size"),
    (30, 1, None, 0, "bounds", "DataCopy(UB->GM): GM bytes [4000, 4128)"),
    (32, 1, None, 6, "queue protocol", "EnQue on TQue<VECIN, 1>: the queue already holds 1 tensor(s)"),
    (34, 1, None, 7, "vector op", "sharedTmpBuffer has 32 B; 16 elements of float (64 B) are needed"),
    (35, 1, None, 0, "model", "a second TPipe"),
    (36, 1, None, 0, "model", "Cast int32_t->half works with SetDeqScale"),
    (37, 1, None, 0, "bounds", "LocalTensor::GetValue(256): index out of range"),
    (38, 1, None, 7, "vector op", "CompareScalar: count 72 x float = 288 B is not a multiple of 256 B"),
]


@pytest.mark.parametrize(("which", "blocks", "env", "rule", "name", "text"), RULE_CASES,
                         ids=[f"rule{c[3]}-case{c[0]}" for c in RULE_CASES])
def test_each_rule_aborts_with_its_message(lib: Path, which: int, blocks: int, env: dict | None, rule: int,
                                           name: str, text: str) -> None:
    msg = aborts(lib, [kernel("rules", blocks, "gm", which)], env, gm=np.zeros(4096, np.float32))
    assert msg.startswith(f"ascend-model: rule {rule} ({name}): "), msg
    assert text in msg, msg
    assert msg.endswith(" of kernel rules]") and "[block " in msg, msg


def test_positive_controls_run_clean(lib: Path) -> None:
    """The same kernel without a violation; the UB-size and SyncAll cases pass with the defaults."""
    gm = np.zeros(4096, np.float32)
    _, rets = run(lib, [kernel("rules", 1, "gm", 0), kernel("rules", 1, "gm", 2), kernel("rules", 8, "gm", 26),
                        kernel("rules", 48, "gm", 26)], gm=gm)
    assert rets == [0, 0, 0, 0]


def test_queue_depth_1_rejects_two_tiles_in_flight(lib: Path) -> None:
    x = np.zeros(4096, np.float32)
    msg = aborts(lib, [kernel("pipeline_d1_preload", 2, "x", "y", 4096, 256)], x=x, y=x.copy())
    assert msg.startswith("ascend-model: rule 6 (queue protocol): EnQue on TQue<VECIN, 1>"), msg


def test_what_bisheng_rejects_fails_to_compile(tmp_path: Path) -> None:
    """Unsupported types are static_asserts; narrowing in list-initialisation is an error (as with clang)."""
    src = tmp_path / "bad.cpp"
    src.write_text('#include "kernel_operator.h"\nusing namespace AscendC;\n'
                   "void f(LocalTensor<float> d, LocalTensor<uint8_t> s) { Cast(d, s, RoundMode::CAST_NONE, 32); }\n"
                   "void g(LocalTensor<int8_t> d) { Add(d, d, d, 32); }\n"
                   "void h(uint32_t n) { DataCopyExtParams p{1, n * sizeof(float), 0, 0, 0}; (void)p; }\n")
    r = subprocess.run([model_build.cxx(), *model_build.FLAGS, "-fsyntax-only", f"-I{model_build.HERE}", str(src)],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "ascend-model: rule 7 (vector op): this Cast<dst, src> pair is not supported on A2" in r.stderr
    assert "ascend-model: rule 7 (vector op): Add supports int16_t, half, int32_t, float on A2" in r.stderr
    assert "error: narrowing conversion" in r.stderr


# ---------------------------------------------------------------------------------------------
# data movement


def test_datacopy_roundtrip_and_datacopyparams(lib: Path, rng: np.random.Generator) -> None:
    x = rng.standard_normal(1024).astype(np.float32)
    # DataCopyParams: 3 rows of 2 blocks (16 floats); GM gap 1 block in, UB gap 2 blocks, GM gap 3 out
    cnt, blen, gin, gub, gout = 3, 2, 1, 2, 3
    src = rng.standard_normal(256).astype(np.float32)
    out = np.full(256, 9.0, np.float32)
    res, _ = run(lib, [kernel("copy_roundtrip", 1, "x", "y", 1024),
                       kernel("copy_params", 1, "src", "out", "prm", 256, 256)],
                 x=x, y=np.zeros_like(x), src=src, out=out, prm=np.array([cnt, blen, gin, gub, gout], np.int32))
    np.testing.assert_array_equal(res["y"], x)
    want = np.full(256, 9.0, np.float32)
    row = blen * 8
    for r in range(cnt):
        want[r * (blen + gout) * 8:][:row] = src[r * (blen + gin) * 8:][:row]
    np.testing.assert_array_equal(res["out"], want)


PAD_IN_CASES = [
    # dtype, blockCount, blockLen (B), srcStride (B), dstStride (blocks), isPad, left, right, value
    (np.float32, 3, 20, 8, 1, 1, 1, 2, 7),
    (np.float32, 2, 20, 0, 0, 0, 1, 2, 7),  # paddings but no isPad: pads + dummy undefined (poison)
    (np.float32, 4, 44, 4, 0, 1, 0, 0, 5),  # no paddings: the dummy up to 32 B is undefined (poison)
    (np.float16, 3, 22, 2, 2, 1, 3, 5, -2),
    (np.float16, 1, 64, 0, 0, 1, 0, 16, 3),  # exactly 32 B of right padding
]


@pytest.mark.parametrize("case", PAD_IN_CASES, ids=lambda c: f"{np.dtype(c[0]).name}-{c[1:]}")
def test_datacopypad_gm_to_ub_layout(lib: Path, rng: np.random.Generator, case: tuple) -> None:
    dt, cnt, blen, sstride, dstride, ispad, left, right, val = case
    sz = np.dtype(dt).itemsize
    src = rng.standard_normal(512).astype(dt)
    ub_n = 1024 // sz
    prm = np.array([cnt, blen, sstride, dstride, ispad, left, right, val], np.int32)
    res, _ = run(lib, [kernel(f"pad_in_{'f32' if sz == 4 else 'f16'}", 1, "src", "dump", "prm", 512, ub_n)],
                 src=src, dump=np.zeros(ub_n, dt), prm=prm)
    want = np.full(ub_n, -7, dt)
    row = -(-(left * sz + blen + right * sz) // 32) * 32
    pitch = row + dstride * 32
    poison = np.frombuffer(b"\xff" * row, dt)
    for r in range(cnt):
        rowv = np.full(row // sz, val, dt) if ispad and (left or right) else poison.copy()
        start = r * (blen + sstride) // sz
        rowv[left:left + blen // sz] = src[start:start + blen // sz]
        want[r * pitch // sz:][:row // sz] = rowv
    np.testing.assert_array_equal(res["dump"].view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize(("dt", "cnt", "blen", "ub_gap", "gm_gap"),
                         [(np.float32, 3, 20, 1, 12), (np.float32, 2, 64, 0, 0), (np.float16, 4, 6, 2, 2)])
def test_datacopypad_ub_to_gm(lib: Path, rng: np.random.Generator, dt, cnt: int, blen: int, ub_gap: int,
                              gm_gap: int) -> None:
    sz = np.dtype(dt).itemsize
    ub_n = 1024 // sz
    src = rng.standard_normal(ub_n).astype(dt)
    out = np.full(256, 9, dt)
    prm = np.array([cnt, blen, ub_gap, gm_gap], np.int32)
    res, _ = run(lib, [kernel(f"pad_out_{'f32' if sz == 4 else 'f16'}", 1, "src", "out", "prm", ub_n, 256)],
                 src=src, out=out, prm=prm)
    want = np.full(256, 9, dt)
    ub_pitch = (-(-blen // 32) * 32 + ub_gap * 32) // sz
    gm_pitch = (blen + gm_gap) // sz
    for r in range(cnt):
        want[r * gm_pitch:][:blen // sz] = src[r * ub_pitch:][:blen // sz]
    np.testing.assert_array_equal(res["out"], want)


# ---------------------------------------------------------------------------------------------
# vector instructions

BIN_OPS = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Adds", "Muls", "Maxs", "Mins", "AddInPlace", "AddRepeat",
           "AddRepeatStrided"]


def _bin_ref(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    s = b[0]
    per = 256 // a.itemsize
    if op == "AddRepeatStrided":
        z = np.zeros_like(a)
        for r in range(a.size // per // 2):
            z[r * 2 * per:][:per // 2] = a[r * per:][:per // 2] + b[r * 2 * per:][:per // 2]
        return z
    return {"Add": lambda: a + b, "Sub": lambda: a - b, "Mul": lambda: a * b, "Div": lambda: a / b,
            "Max": lambda: np.maximum(a, b), "Min": lambda: np.minimum(a, b), "Adds": lambda: a + s,
            "Muls": lambda: a * s, "Maxs": lambda: np.maximum(a, s), "Mins": lambda: np.minimum(a, s),
            "AddInPlace": lambda: a + b, "AddRepeat": lambda: a + b}[op]()


@pytest.mark.parametrize(("kname", "dt"), [("bin_f32", np.float32), ("bin_f16", np.float16), ("bin_i32", np.int32),
                                           ("bin_i16", np.int16)])
def test_binary_and_scalar_ops(lib: Path, rng: np.random.Generator, kname: str, dt) -> None:
    n = 1024
    if np.dtype(dt).kind == "f":
        a = (rng.standard_normal(n) * 100).astype(dt)
        b = (rng.standard_normal(n) * 100).astype(dt)
        b[b == 0] = 1
        a[:4] = [np.inf, -0.0, 1e-3, 3]
        b[1:4] = [np.nan, 0.0, 3]
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt)
        b = rng.integers(info.min, info.max, n, dtype=dt)
    ops = [op for op in BIN_OPS if not (op == "Div" and np.dtype(dt).kind == "i")]
    calls = [kernel(kname, 1, "a", "b", f"out_{op}", BIN_OPS.index(op), n) for op in ops]
    res, _ = run(lib, calls, a=a, b=b, **{f"out_{op}": np.zeros(n, dt) for op in ops})
    with np.errstate(all="ignore"):
        for op in ops:
            np.testing.assert_array_equal(res[f"out_{op}"], _bin_ref(op, a, b), err_msg=op)


UN_OPS = ["Exp", "Ln", "Sqrt", "Rsqrt", "Reciprocal", "Abs", "Relu", "Duplicate", "ExpInPlace"]


@pytest.mark.parametrize(("kname", "dt"), [("un_f32", np.float32), ("un_f16", np.float16), ("un_i32", np.int32)])
def test_unary_ops(lib: Path, rng: np.random.Generator, kname: str, dt) -> None:
    n = 512
    if dt == np.int32:
        a = rng.integers(-1000, 1000, n, dtype=np.int32)
        ops = ["Relu", "Duplicate"]
    else:
        a = (rng.standard_normal(n) * 3).astype(dt)
        a[:3] = [-0.0, 0.0, np.inf]
        ops = UN_OPS
    calls = [kernel(kname, 1, "a", f"out_{op}", UN_OPS.index(op), n) for op in ops]
    res, _ = run(lib, calls, a=a, **{f"out_{op}": np.zeros(n, dt) for op in ops})
    f = a.astype(np.float32)
    one = np.float32(1)
    with np.errstate(all="ignore"):
        refs = {"Exp": np.exp(f), "Ln": np.log(f), "Sqrt": np.sqrt(f), "Rsqrt": one / np.sqrt(f),
                "Reciprocal": one / f, "Abs": np.abs(f), "Relu": np.where(a < 0, 0, a), "Duplicate": np.full(n, a[0]),
                "ExpInPlace": np.exp(f)}
    for op in ops:
        want = refs[op].astype(dt)
        got = res[f"out_{op}"]
        if op in ("Exp", "Ln", "ExpInPlace"):  # libm's expf/logf: within one unit in the last place
            with np.errstate(all="ignore"):
                exact = (np.exp if op != "Ln" else np.log)(a.astype(np.float64)).astype(dt)
            np.testing.assert_array_max_ulp(got, exact, maxulp=1)
        else:
            np.testing.assert_array_equal(got, want, err_msg=op)


# ---- Cast -------------------------------------------------------------------------------------

MODES = {"CAST_NONE": 0, "CAST_RINT": 1, "CAST_FLOOR": 2, "CAST_CEIL": 3, "CAST_ROUND": 4, "CAST_TRUNC": 5,
         "CAST_ODD": 6}
R5 = ["CAST_RINT", "CAST_FLOOR", "CAST_CEIL", "CAST_ROUND", "CAST_TRUNC"]


def _round_float(x: np.ndarray, dt, mode: str) -> np.ndarray:
    """``x`` (float64, exactly the source values) rounded to ``dt`` the way ``mode`` says."""
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        r = x.astype(dt)
        rv = r.astype(np.float64)
        up = np.nextafter(r, np.array(np.inf, dt))
        down = np.nextafter(r, np.array(-np.inf, dt))
        lo = np.where(rv <= x, r, down)
        hi = np.where(rv >= x, r, up)
        exact = rv == x
        if mode in ("CAST_RINT", "CAST_NONE"):
            out = r
        elif mode == "CAST_FLOOR":
            out = lo
        elif mode == "CAST_CEIL":
            out = hi
        elif mode == "CAST_TRUNC":
            out = np.where(x > 0, lo, hi)
        elif mode == "CAST_ROUND":
            tie = (x - lo.astype(np.float64)) == (hi.astype(np.float64) - x)
            out = np.where(tie & ~exact, np.where(x > 0, hi, lo), r)
        else:  # CAST_ODD
            bits = lo.view(np.uint16 if np.dtype(dt).itemsize == 2 else np.uint32)
            out = np.where(exact, r, np.where(bits & 1, lo, hi))
    return np.where(np.isnan(x), x.astype(dt), out).astype(dt)


def _round_int(x: np.ndarray, dt, mode: str) -> np.ndarray:
    x = np.asarray(x, np.float64)
    f = {"CAST_NONE": np.rint, "CAST_RINT": np.rint, "CAST_FLOOR": np.floor, "CAST_CEIL": np.ceil,
         "CAST_TRUNC": np.trunc, "CAST_ROUND": lambda v: np.where(v >= 0, np.floor(v + 0.5), np.ceil(v - 0.5))}[mode]
    info = np.iinfo(dt)
    with np.errstate(invalid="ignore"):
        r = np.clip(f(np.nan_to_num(x, nan=0.0)), info.min, info.max)
    return r.astype(dt)


def _ties(dt, lo: float, hi: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Midpoints between neighbouring values of ``dt`` in [lo, hi), both signs (exact in float32)."""
    v = rng.uniform(lo, hi, n).astype(dt)
    nxt = np.nextafter(v, np.array(np.inf, dt))
    mid = (v.astype(np.float64) + nxt.astype(np.float64)) / 2
    return np.concatenate([mid, -mid])


CAST_CASES = {
    # kernel: (source values, dst dtype, modes); reference from the float64 source values
    "f32_f16": (lambda g: np.concatenate([np.sign(g.standard_normal(700)) * 10 ** g.uniform(-3, 4.5, 700),
                                          _ties(np.float16, 1, 30000, 150, g)]), np.float16,
                ["CAST_NONE", *R5, "CAST_ODD"]),
    "f32_bf16": (lambda g: np.concatenate([np.sign(g.standard_normal(700)) * 10 ** g.uniform(-30, 30, 700),
                                           _ties(BF16, 1, 1e30, 150, g), [np.nan, -np.inf]]), BF16, R5),
    "f32_i32": (lambda g: np.concatenate([g.uniform(-1e6, 1e6, 700), np.arange(-50, 50) + 0.5,
                                          [3e9, -3e9, np.nan, 2**31, -(2**31) - 1e3]]), np.int32, R5),
    "f32_f32": (lambda g: np.concatenate([g.uniform(-1e6, 1e6, 700), np.arange(-50, 50) + 0.5, [1e30, -np.inf]]),
                np.float32, R5),
    "f32_i16": (lambda g: np.concatenate([g.uniform(-40000, 40000, 700), np.arange(-50, 50) + 0.5]), np.int16, R5),
    "f32_i64": (lambda g: np.concatenate([g.uniform(-1e12, 1e12, 700), np.arange(-50, 50) + 0.5]), np.int64, R5),
    "f16_i32": (lambda g: np.concatenate([g.uniform(-1000, 1000, 700), np.arange(-50, 50) + 0.5]), np.int32, R5),
    "f16_i16": (lambda g: np.concatenate([g.uniform(-1000, 1000, 700), np.arange(-50, 50) + 0.5]), np.int16, R5),
    "f16_i8": (lambda g: np.concatenate([g.uniform(-200, 200, 700), np.arange(-50, 50) + 0.5]), np.int8,
               ["CAST_NONE", *R5]),
    "f16_u8": (lambda g: np.concatenate([g.uniform(0, 300, 700), np.arange(0, 100) + 0.5]), np.uint8,
               ["CAST_NONE", *R5]),
    "bf16_i32": (lambda g: np.concatenate([g.uniform(-1000, 1000, 700), np.arange(-50, 50) + 0.5]), np.int32, R5),
    "i32_f32": (lambda g: np.concatenate([g.integers(-(2**30), 2**30, 700), g.integers(-1000, 1000, 100)]),
                np.float32, ["CAST_NONE", *R5]),
    "i64_f32": (lambda g: g.integers(-(2**50), 2**50, 800), np.float32, R5),
    "i16_f16": (lambda g: g.integers(-32768, 32767, 800), np.float16, ["CAST_NONE", *R5]),
}
SRC_DT = {"f32": np.float32, "f16": np.float16, "bf16": BF16, "i32": np.int32, "i64": np.int64, "i16": np.int16,
          "i8": np.int8, "u8": np.uint8}


@pytest.mark.parametrize("pair", sorted(CAST_CASES))
def test_cast_round_modes(lib: Path, rng: np.random.Generator, pair: str) -> None:
    make, dst, modes = CAST_CASES[pair]
    src_dt = SRC_DT[pair.split("_")[0]]
    with np.errstate(all="ignore"):
        src = np.asarray(make(rng)).astype(src_dt)
    n = -(-src.size // 32) * 32
    src = np.concatenate([src, np.zeros(n - src.size, src_dt)])
    calls = [kernel(f"cast_{pair}", 1, "src", f"out_{m}", MODES[m], n) for m in modes]
    res, _ = run(lib, calls, src=src, **{f"out_{m}": np.zeros(n, dst) for m in modes})
    x = src.astype(np.float64)
    for m in modes:
        if pair == "f32_f32":  # float -> float rounds to an integral value
            with np.errstate(invalid="ignore"):
                want = np.where(np.isfinite(x), _round_int(x, np.int64, m), x)
            want = np.copysign(np.where(np.abs(x) >= 2**23, x, want), x).astype(np.float32)  # rint(-0.5) = -0.0
        elif np.dtype(dst).kind in "iu":
            want = _round_int(x, dst, m)
        else:
            want = _round_float(x, dst, m)
        got = res[f"out_{m}"]
        item = np.dtype(dst).itemsize
        bad = np.flatnonzero((got.view(np.uint8) != want.view(np.uint8)).reshape(n, item).any(1))
        assert bad.size == 0, f"{pair} {m}: (source, got, want) {[(x[i], got[i], want[i]) for i in bad[:5]]}"


def test_cast_f32_to_f16_overflow_nan_and_exact_pairs(lib: Path, rng: np.random.Generator) -> None:
    special = np.array([70000, -70000, 65519, 65520, np.inf, np.nan, 1e-8, -1e-8] * 4, np.float32)
    exact = {
        "f16_f32": (rng.standard_normal(64).astype(np.float16), np.float32),
        "bf16_f32": (rng.standard_normal(64).astype(BF16), np.float32),
        "i32_i64": (rng.integers(-(2**31), 2**31 - 1, 64, dtype=np.int32), np.int64),
        "i16_f32": (rng.integers(-32768, 32767, 64, dtype=np.int16), np.float32),
        "i8_f16": (rng.integers(-128, 127, 64, dtype=np.int8), np.float16),
        "u8_f16": (rng.integers(0, 255, 64, dtype=np.uint8), np.float16),
        "i32_i16": (np.array([2**31 - 1, -(2**31), 40000, -40000, 5, -5] * 16, np.int32)[:64], np.int16),
        "i64_i32": (np.array([2**31, -(2**31) - 1, 2**40, 7, -7, 0, 1, 2] * 8, np.int64), np.int32),
    }
    calls = [kernel("cast_f32_f16", 1, "special", f"sp_{m}", mode, 32)
             for m, mode in (("rint", 1), ("trunc", 5), ("floor", 2))]
    arrays = {"special": special, "sp_rint": np.zeros(32, np.float16), "sp_trunc": np.zeros(32, np.float16),
              "sp_floor": np.zeros(32, np.float16)}
    for pair, (src, dst) in exact.items():
        calls.append(kernel(f"cast_{pair}", 1, f"src_{pair}", f"out_{pair}", 0, 64))
        arrays[f"src_{pair}"] = src
        arrays[f"out_{pair}"] = np.zeros(64, dst)
    res, _ = run(lib, calls, **arrays)
    inf, nan, tiny = np.inf, np.nan, np.float16(2**-24)
    want = {"rint": [inf, -inf, 65504, inf, inf, nan, 0, -0.0],
            "trunc": [65504, -65504, 65504, 65504, inf, nan, 0, -0.0],
            "floor": [65504, -inf, 65504, 65504, inf, nan, 0, -tiny]}
    for m, w in want.items():
        np.testing.assert_array_equal(res[f"sp_{m}"][:8], np.array(w, np.float16), err_msg=m)
    assert np.signbit(res["sp_rint"][7]) and np.signbit(res["sp_trunc"][7])
    for pair, (src, dst) in exact.items():
        want = np.clip(src.astype(np.float64), *(np.iinfo(dst).min, np.iinfo(dst).max)).astype(dst) \
            if np.dtype(dst).kind == "i" else src.astype(dst)
        np.testing.assert_array_equal(res[f"out_{pair}"], want, err_msg=pair)


# ---- reductions, Compare / Select -----------------------------------------------------------------

def _tree(v: np.ndarray) -> np.generic:
    level = list(v)
    while len(level) > 1:
        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0]


def reduce_sum_ref(v: np.ndarray) -> np.generic:
    """A2 count-form ReduceSum: a pairwise tree inside each 256-B repeat, repeat sums added in order."""
    per = 256 // v.itemsize
    acc = _tree(v[:per])
    for r in range(per, v.size, per):
        acc = acc + _tree(v[r:r + per])
    return acc


@pytest.mark.parametrize(("kname", "dt"), [("red_f32", np.float32), ("red_f16", np.float16)])
def test_reductions(lib: Path, rng: np.random.Generator, kname: str, dt) -> None:
    sizes = [1, 5, 64, 100, 1000, 4099]
    calls, arrays = [], {}
    for n in sizes:
        arrays[f"x{n}"] = rng.uniform(-1, 1, n).astype(dt)
        arrays[f"t{n}"] = rng.integers(-20, 20, n).astype(dt)  # ties: the first index wins
        for op in range(5):
            src = f"x{n}" if op == 0 else f"t{n}"
            calls.append(kernel(kname, 1, src, f"o{n}_{op}", op, n))
            arrays[f"o{n}_{op}"] = np.zeros(16, dt)
    arrays["nan"] = np.array([1, 2, np.nan, 5, np.nan, 0, 0, 0], dt)
    calls.append(kernel(kname, 1, "nan", "o_nan", 2, 8))
    arrays["o_nan"] = np.zeros(16, dt)
    res, _ = run(lib, calls, **arrays)
    idx_t = np.uint16 if dt == np.float16 else np.uint32
    for n in sizes:
        x, t = arrays[f"x{n}"], arrays[f"t{n}"]
        got_sum = res[f"o{n}_0"][0]
        assert got_sum == reduce_sum_ref(x), (n, got_sum, reduce_sum_ref(x))
        np.testing.assert_allclose(got_sum, x.astype(np.float64).sum(), rtol=1e-2 if dt == np.float16 else 1e-5,
                                   atol=0.5 if dt == np.float16 else 1e-4)
        assert res[f"o{n}_1"][0] == t.max() and res[f"o{n}_3"][0] == t.min()
        assert res[f"o{n}_2"][0] == t.max() and res[f"o{n}_2"][1:2].view(idx_t)[0] == np.argmax(t)
        assert res[f"o{n}_4"][0] == t.min() and res[f"o{n}_4"][1:2].view(idx_t)[0] == np.argmin(t)
    assert np.isnan(res["o_nan"][0]) and res["o_nan"][1:2].view(idx_t)[0] == 2


@pytest.mark.parametrize(("kname", "dt"), [("cmpsel_f32", np.float32), ("cmpsel_f16", np.float16)])
def test_compare_and_select(lib: Path, rng: np.random.Generator, kname: str, dt) -> None:
    n = 512
    a = rng.integers(-5, 5, n).astype(dt)
    b = rng.integers(-5, 5, n).astype(dt)
    a[:2] = np.nan
    names = ["LT", "GT", "EQ", "LE", "GE", "NE"]
    calls, arrays = [], {"a": a, "b": b}
    a[5:9] = 1.5  # (ties with CompareScalar's scalar)
    for i, m in enumerate(names):
        calls.append(kernel(kname, 1, "a", "b", f"m_{m}", f"s_{m}", f"s2_{m}", f"ms_{m}", f"lg_{m}", i, n))
        arrays |= {f"m_{m}": np.zeros(n // 8, np.uint8), f"s_{m}": np.zeros(n, dt), f"s2_{m}": np.zeros(n, dt),
                   f"ms_{m}": np.zeros(n // 8, np.uint8), f"lg_{m}": np.zeros(3 * n // 8, np.uint8)}
    res, _ = run(lib, calls, **arrays)
    ops = {"LT": np.less, "GT": np.greater, "EQ": np.equal, "LE": np.less_equal, "GE": np.greater_equal,
           "NE": np.not_equal}
    with np.errstate(invalid="ignore"):
        for m in names:
            bits, sbits = ops[m](a, b), ops[m](a, dt(1.5))
            np.testing.assert_array_equal(res[f"m_{m}"], np.packbits(bits, bitorder="little"), err_msg=m)
            np.testing.assert_array_equal(res[f"ms_{m}"], np.packbits(sbits, bitorder="little"), err_msg=m)
            np.testing.assert_array_equal(res[f"s_{m}"], np.where(bits, a, b), err_msg=m)
            np.testing.assert_array_equal(res[f"s2_{m}"], np.where(bits, a, dt(2.5)), err_msg=m)
            logic = np.concatenate([bits & sbits, bits | sbits, ~bits])
            np.testing.assert_array_equal(res[f"lg_{m}"], np.packbits(logic, bitorder="little"), err_msg=m)


# ---------------------------------------------------------------------------------------------
# queues, blocks, atomics, host side


@pytest.mark.parametrize("kname", ["pipeline_d1", "pipeline_d2"])
def test_double_buffered_queues(lib: Path, rng: np.random.Generator, kname: str) -> None:
    total, tile, blocks = 8 * 2048, 256, 8
    x = rng.standard_normal(total).astype(np.float32)
    res, rets = run(lib, [kernel(kname, blocks, "x", "y", total, tile)], x=x, y=np.zeros_like(x))
    assert rets == [0]
    np.testing.assert_array_equal(res["y"], x * np.float32(2) + np.float32(1))


def test_syncall_across_blocks(lib: Path, rng: np.random.Generator) -> None:
    blocks, per = 16, 384
    x = rng.standard_normal(blocks * per).astype(np.float32)
    res, _ = run(lib, [kernel("syncall_sum", blocks, "x", "ws", "out", per)], x=x,
                 ws=np.zeros(blocks * 8, np.float32), out=np.zeros(blocks + 1, np.float32))
    total = np.float32(0)
    for b in range(blocks):
        total = total + reduce_sum_ref(x[b * per:(b + 1) * per])
    np.testing.assert_array_equal(res["out"], np.full(blocks + 1, total, np.float32))


def test_integer_atomic_add_across_blocks(lib: Path, rng: np.random.Generator) -> None:
    blocks, n, npad = 24, 256, 37
    x32 = rng.integers(-(2**30), 2**30, blocks * n, dtype=np.int32)
    x8 = rng.integers(-128, 127, blocks * n, dtype=np.int8)
    xp = rng.integers(-1000, 1000, blocks * npad, dtype=np.int32)
    o32 = rng.integers(-100, 100, n, dtype=np.int32)
    res, _ = run(lib, [kernel("atomic_i32", blocks, "x32", "o32", n), kernel("atomic_i8", blocks, "x8", "o8", n),
                       kernel("atomic_pad_i32", blocks, "xp", "op", npad)],
                 x32=x32, o32=o32, x8=x8, o8=np.zeros(n, np.int8), xp=xp, op=np.zeros(npad + 3, np.int32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(res["o32"], o32 + x32.reshape(blocks, n).sum(0, dtype=np.int32))
        np.testing.assert_array_equal(res["o8"], x8.reshape(blocks, n).sum(0, dtype=np.int8))
    np.testing.assert_array_equal(res["op"][:npad], xp.reshape(blocks, npad).sum(0))
    np.testing.assert_array_equal(res["op"][npad:], 0)


def test_blocks_have_private_ub(lib: Path) -> None:
    blocks = 12
    res, _ = run(lib, [kernel("ub_private", blocks, "out"), kernel("sync_noops", 1, "flag")],
                 out=np.zeros(blocks * 2, np.int32), flag=np.zeros(1, np.int32))
    np.testing.assert_array_equal(res["out"][0::2], np.arange(blocks) * 10 + 1)
    np.testing.assert_array_equal(res["out"][1::2], 0)  # the same UB address in every block
    assert res["flag"][0] == 42


def test_platform_queries_follow_the_environment(lib: Path) -> None:
    res, rets = run(lib, [call("host_platform", "out")], out=np.zeros(5, np.uint64))
    assert rets == [0]
    assert list(res["out"]) == [48, 196608, 48, 196608, 24]
    env = {"OPGEN_ASCEND_AIV_CORES": "40", "OPGEN_ASCEND_UB_SIZE": "131072"}
    res, _ = run(lib, [call("host_platform", "out")], env, out=np.zeros(5, np.uint64))
    assert list(res["out"]) == [40, 131072, 40, 131072, 20]
    # the UB arena follows the same variable: a 65536-B TBuf fits a 65536-B UB, not a 65504-B one
    gm = np.zeros(4096, np.float32)
    _, rets = run(lib, [kernel("rules", 1, "gm", 2)], {"OPGEN_ASCEND_UB_SIZE": "65536"}, gm=gm)
    assert rets == [0]
    msg = aborts(lib, [kernel("rules", 1, "gm", 2)], {"OPGEN_ASCEND_UB_SIZE": "65504"}, gm=gm)
    assert "65536 B = 65536 B > UB size 65504 B" in msg


def test_launches_from_several_host_threads(lib: Path, rng: np.random.Generator) -> None:
    total, tile, threads = 4 * 1024, 128, 6
    x = rng.standard_normal(total * threads).astype(np.float32)
    want = x * np.float32(2) + np.float32(1)
    # C++ host code: ACLRT_LAUNCH_KERNEL from std::threads; then Python threads calling the stubs
    calls = [call("host_threads", "x", "y", total, tile, threads)]
    calls += [kernel("pipeline_d2", 4, f"x{t}", f"y{t}", total, tile, group=1) for t in range(threads)]
    arrays = {"x": x, "y": np.zeros_like(x)}
    for t in range(threads):
        arrays |= {f"x{t}": x[t * total:(t + 1) * total], f"y{t}": np.zeros(total, np.float32)}
    res, rets = run(lib, calls, **arrays)
    assert rets == [0] * (threads + 1)
    np.testing.assert_array_equal(res["y"], want)
    for t in range(threads):
        np.testing.assert_array_equal(res[f"y{t}"], want[t * total:(t + 1) * total])


def test_build_finds_kernels_and_generates_launch_headers(lib: Path) -> None:
    ks = model_build.find_kernels('/* extern "C" __global__ void old(GM_ADDR x) {} */\n'
                                  'extern "C" __global__ __mix__(0, 1) void k2(GM_ADDR a, __gm__ float *b,\n'
                                  '    uint32_t n) {\n}\nextern "C" __global__ __aicore__ void k3() { }\n')
    assert [(k.name, [(p.type, p.name, p.is_gm) for p in k.params]) for k in ks] == [
        ("k2", [("GM_ADDR", "a", True), ("__gm__ float *", "b", True), ("uint32_t", "n", False)]), ("k3", [])]
    # CANN renames its leading parameters when the kernel has parameters of those names
    clash = model_build.find_kernels('extern "C" __global__ __aicore__ void k4(GM_ADDR stream, uint32_t numBlocks) {}')
    assert "uint32_t aclrtlaunch_k4(uint32_t _numBlocks, aclrtStream _stream, void * stream, uint32_t numBlocks);" \
        in model_build._launch_header(clash[0])
    header = (OUT / "gen" / "include" / "aclrtlaunch_pipeline_d1.h").read_text()
    assert ("uint32_t aclrtlaunch_pipeline_d1(uint32_t numBlocks, aclrtStream stream, void * x, void * y, "
            "uint32_t total, uint32_t tile);") in header


# ---------------------------------------------------------------------------------------------
# the Matmul API (lib/matmul_intf.h, tiling/tiling_api.h) and MIX launches

P_FIELDS = ["m", "n", "k", "orgM", "orgN", "orgKa", "orgKb", "orgKc", "offA", "offB", "offC", "strA", "strB", "strC",
            "tA", "tB", "items", "szA", "szB", "szC", "bias"]
MM_CASES = [
    # dtype, m, n, k, transA, transB, orgKc (0: ldC = orgN), bias, blocks, items
    ("f16", 37, 45, 29, False, False, 0, False, 2, 5),
    ("f16", 33, 17, 70, True, True, 50, False, 1, 3),
    ("f16", 16, 64, 48, False, True, 0, True, 3, 6),
    ("f32", 21, 19, 35, False, True, 0, False, 2, 4),
    ("f32", 40, 9, 1, True, False, 12, True, 1, 2),
]


def _mm_case(rng: np.random.Generator, dt, m: int, n: int, k: int, ta: bool, tb: bool, kc: int, bias: bool,
             items: int):
    """Operands in larger ND tensors (org shape > single shape, offsets, a stride per item) and the float64
    reference; returns (arrays, params, want C, |A|@|B| for the tolerance)."""
    orgM, orgN, orgKa = m + 5, n + 3, k + 4
    orgKb = orgKa if kc == 0 and not bias else k + 2  # equal Ka/Kb and no Kc: the 3-argument SetOrgShape
    ldc = kc or orgN
    offA, offB, offC = 3 * orgKa + 5, 7, 2 * ldc + 1
    strA, strB, strC = orgM * orgKa + 7, orgKb * orgN + 3, (m + 1) * ldc
    szA, szB, szC = offA + items * strA, offB + items * strB, offC + items * strC
    A = rng.standard_normal(szA).astype(dt)
    B = rng.standard_normal(szB).astype(dt)
    bv = rng.standard_normal(n).astype(np.float32)
    C = np.full(szC, 7.0, np.float32)
    want, mag = C.astype(np.float64), np.zeros(szC)
    for w in range(items):
        a0, b0, c0 = offA + w * strA, offB + w * strB, offC + w * strC
        if ta:  # A stored K x orgM
            a = A[a0:a0 + orgKa * orgM].astype(np.float64).reshape(orgKa, orgM)[:k, :m].T
        else:
            a = A[a0:a0 + orgM * orgKa].astype(np.float64).reshape(orgM, orgKa)[:m, :k]
        if tb:  # B stored N x orgKb
            b = B[b0:b0 + orgN * orgKb].astype(np.float64).reshape(orgN, orgKb)[:n, :k].T
        else:
            b = B[b0:b0 + orgKb * orgN].astype(np.float64).reshape(orgKb, orgN)[:k, :n]
        r = a @ b + (bv.astype(np.float64) if bias else 0)
        for i in range(m):
            want[c0 + i * ldc:c0 + i * ldc + n] = r[i]
            mag[c0 + i * ldc:c0 + i * ldc + n] = (np.abs(a) @ np.abs(b))[i] + (np.abs(bv) if bias else 0)
    prm = dict(m=m, n=n, k=k, orgM=orgM, orgN=orgN, orgKa=orgKa, orgKb=orgKb, orgKc=kc, offA=offA, offB=offB,
               offC=offC, strA=strA, strB=strB, strC=strC, tA=int(ta), tB=int(tb), items=items, szA=szA, szB=szB,
               szC=szC, bias=int(bias))
    p = np.zeros(24, np.int32)
    p[:len(P_FIELDS)] = [prm[f] for f in P_FIELDS]
    return {"A": A, "B": B, "bias": bv, "C": C, "prm": p, "tl": np.zeros(128, np.int32)}, want, mag


@pytest.mark.parametrize("case", MM_CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-tA{int(c[4])}-tB{int(c[5])}"
                                                f"-kc{c[6]}-bias{int(c[7])}" for c in MM_CASES])
def test_matmul_iterateall_against_numpy(lib: Path, rng: np.random.Generator, case: tuple) -> None:
    """Host tiling (MatmulApiTiling) + a MIX kernel looping over items with GetBlockNum() * GetTaskRation();
    C == float64 reference within float-accumulation error; C outside the m x n blocks untouched."""
    dt_name, m, n, k, ta, tb, kc, bias, blocks, items = case
    dt = np.float16 if dt_name == "f16" else np.float32
    arrays, want, mag = _mm_case(rng, dt, m, n, k, ta, tb, kc, bias, items)
    res, rets = run(lib, [call("host_matmul", "A", "B", "bias", "C", "prm", blocks, int(dt_name == "f32"), "tl")],
                    **arrays)
    assert rets == [0]
    got = res["C"].astype(np.float64)
    assert np.all(np.abs(got - want) <= 4e-6 * k * mag + 1e-30), np.max(np.abs(got - want) - 4e-6 * k * mag)
    assert np.count_nonzero(res["C"] != 7.0) > 0


def test_mix_launch_blocks_see_two_aivs_per_block(lib: Path) -> None:
    res, rets = run(lib, [kernel("mix_ids", 3, "out", "ws"), kernel("plain_ids", 3, "plain")],
                    out=np.full(30, -1, np.int32), ws=np.zeros(8, np.uint8), plain=np.full(9, -1, np.int32))
    assert rets == [0, 0]
    ids = res["out"].reshape(6, 5)
    np.testing.assert_array_equal(ids[:, 0], np.arange(6))  # GetBlockIdx in [0, 2B)
    np.testing.assert_array_equal(ids[:, 1], 3)  # GetBlockNum = B
    np.testing.assert_array_equal(ids[:, 2], 2)  # GetTaskRation
    np.testing.assert_array_equal(ids[:, 3], 1)  # if ASCEND_IS_AIV ran, ASCEND_IS_AIC did not
    np.testing.assert_array_equal(ids[:, 4], 16 * 1024 * 1024)  # GetUserWorkspace = ws + GetLibApiWorkSpaceSize
    np.testing.assert_array_equal(res["plain"].reshape(3, 3), [[0, 3, 1], [1, 3, 1], [2, 3, 1]])
    # SyncAll residency of a MIX launch counts AIC cores (AIV / 2): 4 groups fit 8 AIVs, 5 do not
    env = {"OPGEN_ASCEND_AIV_CORES": "8"}
    _, rets = run(lib, [kernel("mix_ids", 4, "out", "ws")], env, out=np.zeros(40, np.int32), ws=np.zeros(8, np.uint8))
    assert rets == [0]
    msg = aborts(lib, [kernel("mix_ids", 5, "out", "ws")], env, out=np.zeros(50, np.int32), ws=np.zeros(8, np.uint8))
    assert msg.startswith("ascend-model: rule 10 (blocks): SyncAll with numBlocks 5 > 4 AIC cores (MIX launch"), msg
    assert msg.endswith("of kernel mix_ids]"), msg


MM_RULE_CASES = [
    # kernel, which, rule, short name, text
    ("mm_rules", 1, 11, "matmul", "REGIST_MATMUL_OBJ after pipe.InitBuffer (1 buffer(s) already)"),
    ("mm_rules", 2, 11, "matmul", "SetSingleShape(m 33, n 32, k 32): each must be in [1, the tiling's singleCoreM/N/K"),
    ("mm_rules", 3, 9, "atomic", "Matmul::IterateAll(gm, enAtomic = 1): atomic accumulation of float results"),
    ("mm_rules", 4, 0, "bounds", "Matmul::IterateAll (C): GM bytes [400, 4496) of a GlobalTensor<float> whose "
     "SetGlobalBuffer size is 1024 elements"),
    ("mm_rules", 5, 11, "matmul", "GetSysWorkSpacePtr() before SetSysWorkspace(workspace)"),
    ("mm_rules", 6, 11, "matmul", "REGIST_MATMUL_OBJ: 5 Matmul objects registered (at most 4)"),
    ("mm_rules", 7, 11, "matmul", "SetSingleShape on a Matmul object that REGIST_MATMUL_OBJ never registered"),
    ("mm_rules", 8, 11, "matmul", "IterateAll before SetTensorA"),
    ("mm_rules", 9, 11, "matmul", "cube buffer: baseM 256 x baseK 256 x 2 B x dbL0A 1 = 131072 B > L0A 65536 B"),
    ("mm_rules", 10, 11, "matmul", "SetSingleShape(m 0, n 32, k 32)"),
    ("mm_rules", 11, 11, "matmul", "SetTensorA(gm, isTransposeA = true) but A's MatmulType has ISTRANS = false"),
    ("mm_rules", 12, 11, "matmul", "IterateAll: A rows hold 16 elements (org Ka 16) but the single shape needs 32"),
    ("mm_rules", 13, 11, "matmul", "SetSingleShape before Init"),
    ("mm_rules", 14, 11, "matmul", "SetSingleShape after End()"),
    ("mm_not_mix", 0, 11, "matmul", "Matmul REGIST_MATMUL_OBJ in a kernel that did not declare "
     "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)"),
    ("mix_in_helper", 0, 10, "blocks", "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2) but the kernel was "
     "launched as vector-only"),
]


@pytest.mark.parametrize(("kname", "which", "rule", "name", "text"), MM_RULE_CASES,
                         ids=[f"rule{c[2]}-{c[0]}-{c[1]}" for c in MM_RULE_CASES])
def test_each_matmul_rule_aborts_with_its_message(lib: Path, kname: str, which: int, rule: int, name: str,
                                                  text: str) -> None:
    args = ("gm", which) if kname == "mm_rules" else ("gm",)
    msg = aborts(lib, [kernel(kname, 1, *args)], gm=np.zeros(4096, np.float32))
    assert msg.startswith(f"ascend-model: rule {rule} ({name}): "), msg
    assert text in msg, msg
    assert msg.endswith(f" of kernel {kname}]") and "[block " in msg, msg


def test_matmul_positive_controls_run_clean(lib: Path, rng: np.random.Generator) -> None:
    """mm_rules 0 (REGIST with the tiling) and 15 (REGIST + Init, 4 objects): C = A @ B of 32 x 32 halves."""
    for which in (0, 15):
        ab = rng.standard_normal(2048).astype(np.float16)
        gm = np.zeros(4096, np.float32)
        gm[:1024] = ab.view(np.float32)
        res, rets = run(lib, [kernel("mm_rules", 2, "gm", which)], gm=gm)
        assert rets == [0]
        want = ab[:1024].astype(np.float64).reshape(32, 32) @ ab[1024:].astype(np.float64).reshape(32, 32)
        np.testing.assert_allclose(res["gm"][1024:2048].reshape(32, 32), want, rtol=1e-5, atol=1e-4)


def test_matmul_host_tiling(lib: Path) -> None:
    res, rets = run(lib, [call("host_tiling", "out")], out=np.zeros(64, np.int64))
    out = list(res["out"][:rets[0]])
    # f16 100 x 300 x 70: fields; base blocks fit L0A/L0B (64 KiB) and L0C (128 KiB) once each
    assert out[:23] == [0, 1, 100, 300, 70, 70, 100, 300, 70, 112, 256, 64, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1]
    assert out[23:27] == [0, 128, 256, 32]  # f32: baseK 32
    assert out[27] == 0  # bf16
    # -1: A/B types differ, C f16, shape 0, shape > org, int32 overflow, int8, no types set
    assert out[28:35] == [-1, -1, -1, -1, -1, -1, -1]
    assert out[35:40] == [0, 4, 64, 64, -1]  # MultiCoreMatmulTiling: 4 cores of 64 x 64; SetDim(2) too few
    assert out[40] == 16 * 1024 * 1024  # GetLibApiWorkSpaceSize


def test_matmul_type_rules_fail_to_compile(tmp_path: Path) -> None:
    src = tmp_path / "bad_mm.cpp"
    src.write_text('#include "kernel_operator.h"\n#include "lib/matmul_intf.h"\nusing namespace matmul;\n'
                   "using namespace AscendC;\n"
                   "Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>, MatmulType<TPosition::GM, CubeFormat::ND,"
                   " float>, MatmulType<TPosition::GM, CubeFormat::ND, half>> *bad;\n"
                   "void f() { (void)sizeof(*bad); }\n")
    r = subprocess.run([model_build.cxx(), *model_build.FLAGS, "-fsyntax-only", f"-I{model_build.HERE}", str(src)],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "ascend-model: rule 11 (matmul): A and B must have the same type" in r.stderr
    assert "ascend-model: rule 11 (matmul): C must be float" in r.stderr


def test_build_detects_mix_kernels() -> None:
    ks = model_build.find_kernels(
        '__aicore__ void helper() { KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2); }\n'
        'extern "C" __global__ __aicore__ void a(GM_ADDR x) { if (1) { helper(); } }\n'
        'extern "C" __global__ __aicore__ void b(GM_ADDR x) { const char *s = "}"; (void)s;\n'
        '    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2); }\n'
        'extern "C" __global__ __aicore__ void c(GM_ADDR x) { KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY); }\n'
        '/* KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2) */\n')
    assert [(k.name, k.mix) for k in ks] == [("a", False), ("b", True), ("c", False)]
    assert '"b", true);' in model_build._launch_stub(ks)
    assert '"a");' in model_build._launch_stub(ks)
