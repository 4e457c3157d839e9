"""The ``sched`` loop dialect in xDSL's idiom: enum attributes for kinds and statuses, a verifier
on every op, declared memory effects (so xDSL's CSE runs after lowering), and a textual form
that parses back."""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Block
from xdsl.parser import Parser
from xdsl.traits import MemoryEffectKind, get_effects
from xdsl.utils.exceptions import ParseError, VerifyException

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.passes import pipeline
from tests.conftest import SEED_OPS

I64 = ir.TensorType.make([], "i64")


def scalars(*dtypes: str) -> list:
    """Block arguments of the given rank-0 dtypes (values for building ops)."""
    return list(Block(arg_types=[ir.TensorType.make([], d) for d in dtypes]).args)


def buf(shape: list[str], dtype: str, role: str = "in"):
    return Block(arg_types=[s.BufType.make(shape, dtype, role)]).args[0]


def kinds(op) -> set[MemoryEffectKind]:
    effects = get_effects(op)
    assert effects is not None, f"{op.name} declares no memory effects"
    return {e.kind for e in effects}


@pytest.mark.parametrize("name", SEED_OPS)
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_lowered_kernels_print_and_parse_back(ops, name, target):
    m = ops[name].module()
    pipeline.run(m, target)
    text = str(m)
    assert "sched.for parallel " in text and "sched.load " in text  # (the ops' assembly formats)
    again = Parser(pipeline.context(), text).parse_module()
    again.verify()
    assert str(again) == text


def test_kinds_and_statuses_are_enums():
    lo, hi = scalars("i64", "i64")
    with pytest.raises(ValueError):
        s.ForOp(lo, hi, "sometimes")
    (v,) = scalars("f32")
    with pytest.raises(ValueError):
        s.AccumOp("product", v, buf([], "f32", "local"), [])
    (c,) = scalars("bool")
    with pytest.raises(ValueError):
        s.RequireOp(c, "oops", "message")
    loop = s.ForOp(lo, hi, "reduce")
    assert loop.kind.data == s.LoopKind.REDUCE == "reduce"
    bad = '"sched.require"(%c) <{status = #opgen<status whatever>, message = "m"}> : (!opgen.tensor<[], bool>) -> ()'
    with pytest.raises(ParseError):
        Parser(pipeline.context(), f"builtin.module {{\n^bb0(%c: !opgen.tensor<[], bool>):\n{bad}\n}}").parse_module()


def test_every_op_declares_its_memory_effects():
    i, n = scalars("i64", "i64")
    (f,) = scalars("f32")
    src, dst = buf(["N"], "f32"), buf(["N"], "f32", "out")
    load = s.LoadOp(src, [i])
    store = s.StoreOp(f, dst, [i])
    assert kinds(load) == {MemoryEffectKind.READ}
    assert kinds(store) == {MemoryEffectKind.WRITE}
    assert kinds(s.AccumOp("sum", f, dst, [i])) == {MemoryEffectKind.READ, MemoryEffectKind.WRITE}
    assert kinds(s.AllocOp(s.BufType.make(["N"], "f32", "temp"), [n])) == {MemoryEffectKind.ALLOC}
    assert kinds(s.SegWordsOp(i, n)) == set()  # pure
    assert kinds(ir.CeilDivOp(i, n)) == set()
    mask = buf(["L"], "u8")
    assert kinds(s.LoadBitOp(mask, i)) == {MemoryEffectKind.READ}
    assert kinds(s.FlagsPerElemOp(mask)) == set()
    assert kinds(s.PrefetchOp(src, [i], 2048)) == {MemoryEffectKind.READ}  # a hint: kept, never reordered past a store
    (ok,) = scalars("bool")
    assert kinds(s.RequireOp(ok, "index", "i out of range")) == {MemoryEffectKind.WRITE}  # may end the kernel
    assert kinds(s.BarrierOp()) == {MemoryEffectKind.READ, MemoryEffectKind.WRITE}  # orders memory accesses
    loop = s.ForOp(i, n, "serial")
    assert kinds(loop) == set()  # an empty body: nothing
    x = scalars("i64")[0]
    inner_load = s.LoadOp(src, [loop.iv])
    loop.body.block.add_op(inner_load)
    assert kinds(loop) == {MemoryEffectKind.READ}  # the body's effects
    branch = s.IfOp(ok, [], [s.StoreOp(f, dst, [i])])
    assert kinds(branch) == {MemoryEffectKind.WRITE}  # its regions' effects
    a2, b2, c2 = buf(["M", "K"], "f32"), buf(["K", "N"], "f32"), buf(["M", "N"], "f32", "temp")
    mm = s.BufferMatmulOp(a2, b2, c2, i, n, x, False, False)
    assert kinds(mm) == {MemoryEffectKind.READ, MemoryEffectKind.WRITE}


def rejects(op, pattern: str) -> None:
    with pytest.raises(VerifyException, match=pattern):
        op.verify()


def test_verifiers():
    i, n = scalars("i64", "i64")
    f, c = scalars("f32", "bool")
    rejects(s.RequireOp(f, "param", "m"), r"sched.require: the condition must be a rank-0 bool")
    rejects(s.IfOp(i), r"sched.if: the condition must be a rank-0 bool")
    rejects(s.LoadBitOp(buf(["A", "B"], "u8"), i), r"sched.load_bit: the mask must be a 1-D buffer")
    rejects(s.LoadBitOp(buf(["L"], "u8"), f), r"sched.load_bit: the flag number must be a rank-0 i64")
    rejects(s.FlagsPerElemOp(buf(["A", "B"], "bool")), r"sched.flags_per_elem: the mask must be a 1-D buffer")
    rejects(s.SegmentStartOp(buf(["segs(V,N)"], "i64", "temp"), f, i, n), r"sched.segment_start: v must be")
    rejects(s.PrefetchOp(buf(["N", "D"], "f32"), [i], 64), r"sched.prefetch: 1 indices for a rank-2 buffer")
    rejects(s.PrefetchOp(buf(["N"], "f32"), [i], -1), r"sched.prefetch: ahead must be a number of bytes, 0 or more")
    rejects(s.PrefetchOp(buf(["N"], "f32"), [i], 0, span=f), r"span")
    rejects(s.PrefetchOp(buf(["N"], "f32"), [i], 64, write=True, l2=True), r"sched.prefetch: a prefetch for writing")
    rejects(s.PrefetchOp(buf(["N"], "f32"), [i], 64, wrap=(i, n)), r"sched.prefetch: wrap moves to another row")
    rejects(s.PrefetchOp(buf(["N", "D"], "f32"), [i, i], 0, span=n, wrap=(i, n)), r"no span or shift")
    s.PrefetchOp(buf(["N", "D"], "f32"), [i, i], 64, wrap=(i, n)).verify()
    tile = buf(["16", "16"], "f32", "stage")
    rejects(s.TransposeTileOp(buf(["N"], "f32"), [i], tile, n, n), r"sched.transpose_tile: a tile of a rank >= 2")
    rejects(s.TransposeTileOp(buf(["N", "D"], "bf16"), [i, i], tile, n, n), r"sched.transpose_tile: dtype f32 holds")
    for role in ("temp", "local"):  # (a staged tile is a stage buffer: held as the caller holds bf16)
        rejects(s.TransposeTileOp(buf(["N", "D"], "f32"), [i, i], buf(["16", "16"], "f32", role), n, n),
                r"into a 2-D stage buffer")
    rows = buf(["N"], "i64", "temp")
    rejects(s.SegmentsOp(buf(["N"], "i32", "temp"), buf(["segs(V,N)"], "i64", "temp"), rows, i),
            r"sched.segments: idx must be a 1-D i64 buffer")
    rejects(s.BufferMatmulOp(buf(["N"], "f32"), buf(["N", "K"], "f32"), buf(["N", "K"], "f32", "temp"), i, n, n,
                             False, False), r"sched.matmul: operands must be 2-D buffers")
    rejects(s.BufferMatmulOp(buf(["N", "K"], "f32"), buf(["K", "N"], "f32"), buf(["N", "N"], "f32", "temp"),
                             i, f, n, False, False), r"sched.matmul: n must be a rank-0 i64")
    one_exact = s.BufferMatmulOp(buf(["N", "K"], "f32"), buf(["K", "N"], "f32"), buf(["N", "N"], "f32", "temp"),
                                 i, n, n, False, False)
    one_exact.properties["exact"] = ArrayAttr([StringAttr("bf16")])
    rejects(one_exact, r"sched.matmul: exact must give one dtype per operand \(A, B\)")
    vec = ir.TensorType.make(["N"], "f32")
    (v,) = Block(arg_types=[vec]).args
    rejects(s.StoreOp(v, buf(["N"], "f32", "out"), [i]), r"sched.store: the value must be a rank-0 scalar")
    rejects(s.ForOp(f, n, "parallel"), r"(?s)operand 'lo'.*!opgen.tensor<\[\], i64>")  # (IRDL's type rule)
    rejects(s.AllocOp(s.BufType.make(["N", "D"], "f32", "temp"), [n]), r"sched.alloc: 1 sizes for a rank-2 buffer")
    rejects(ir.DimOp("cdiv(N,32)"), r"opgen.dim: 'cdiv\(N,32\)' is not a dim name")
    rejects(ir.CeilDivOp(f, f), r"opgen.ceil_div: operands of type f32 not allowed")
    assert c.type == ir.TensorType.make([], "bool")


def _size_value(v, dims: dict[str, int]):
    """A size value evaluated for ``dims`` (a segment table's words as ('segs', rows, n))."""
    op = v.owner
    if isinstance(op, ir.DimOp):
        return dims[op.dim.data]
    if isinstance(op, ir.ConstantOp):
        return int(op.number)
    if isinstance(op, ir.CeilDivOp):
        a, b = _size_value(op.lhs, dims), _size_value(op.rhs, dims)
        return -(-a // b)
    if isinstance(op, ir.AddOp):
        return _size_value(op.lhs, dims) + _size_value(op.rhs, dims)
    if isinstance(op, ir.SizeMulOp):
        return _size_value(op.lhs, dims) * _size_value(op.rhs, dims)
    if isinstance(op, ir.SizeDivOp):
        return _size_value(op.lhs, dims) // _size_value(op.rhs, dims)
    if isinstance(op, ir.SizeSubOp):
        return max(_size_value(op.lhs, dims) - _size_value(op.rhs, dims), 0)
    assert isinstance(op, s.SegWordsOp), op
    return ("segs", _size_value(op.rows, dims), _size_value(op.n, dims))


def _spelled_value(d: str, dims: dict[str, int]):
    """The same, read off the type's spelling (independently of the lowering's parser):
    ``cdiv``/``mul``/``div``/``sub`` nest, ``+ k`` at the end (the one-pass chain's
    ``mul(cdiv(cdiv(V,256),div(sub(cdiv(V,256),1),4)+1),BT)``)."""
    import re

    if d.isdigit():
        return int(d)
    if m := re.fullmatch(r"segs\((\w+),(\w+)\)", d):
        return ("segs", dims[m[1]], dims[m[2]])
    depth = 0
    for i, ch in enumerate(d):
        depth += (ch == "(") - (ch == ")")
        if ch == "+" and depth == 0:
            return _spelled_value(d[:i], dims) + int(d[i + 1:])
    if m := re.fullmatch(r"(cdiv|mul|div|sub)\((.*)\)", d):
        depth, cut = 0, None
        for i, ch in enumerate(m[2]):
            depth += (ch == "(") - (ch == ")")
            if ch == "," and depth == 0:
                cut = i
        assert cut is not None, d
        a, b = _spelled_value(m[2][:cut], dims), _spelled_value(m[2][cut + 1:], dims)
        return {"cdiv": -(-a // b), "mul": a * b, "div": a // b, "sub": max(a - b, 0)}[m[1]]
    return dims[d]


@pytest.mark.parametrize("name", SEED_OPS)
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_sizes_are_values(ops, name, target):
    """Every allocation carries its sizes as values computed from the caller's dims (what the
    printers print), equal to what its type spells; opgen.dim only names a caller's dim."""
    m = ops[name].module()
    pipeline.run(m, target)
    dims = {d: 1000 + 7 * i for i, d in enumerate(sorted({o.dim.data for o in m.walk() if isinstance(o, ir.DimOp)}))}
    allocs = 0
    for op in m.walk():
        if isinstance(op, ir.DimOp):
            assert op.dim.data.isidentifier()
        if isinstance(op, s.AllocOp):
            allocs += 1
            shape = s.buf_type(op.result).shape
            assert len(op.sizes) == len(shape)
            assert [_size_value(v, dims) for v in op.sizes] == [_spelled_value(d, dims) for d in shape]
    assert allocs


def test_ceil_div_folds_constants():
    from xdsl.transforms.canonicalize import CanonicalizePass

    src = ('builtin.module {\n%a = "opgen.constant"() <{value = 100 : i64}> : () -> !opgen.tensor<[], i64>\n'
           '%b = "opgen.constant"() <{value = 32 : i64}> : () -> !opgen.tensor<[], i64>\n'
           "%c = opgen.ceil_div %a, %b : !opgen.tensor<[], i64>\n"
           '"sched.alloc"(%c) <{zero = #builtin.int<0>}> : (!opgen.tensor<[], i64>) -> !sched.buf<[X], f32, temp>\n}')
    mod = Parser(pipeline.context(), src).parse_module()
    CanonicalizePass().apply(pipeline.context(), mod)
    (alloc,) = [o for o in mod.walk() if isinstance(o, s.AllocOp)]
    assert ir.constant_int(alloc.sizes[0]) == 4
    assert not any(isinstance(o, ir.CeilDivOp) for o in mod.walk())


# ---------------------------------------------------------------------- mapping passes
@pytest.mark.parametrize("name", SEED_OPS)
def test_map_gpu_outlines_every_statement(ops, name):
    """map-gpu gives every top-level statement of a CUDA kernel instance a place: host work
    (leading checks, workspace temporaries, segment sorts) or one device kernel; kernels are
    numbered in program order, and a block/flat kernel is one loop over host-known bounds."""
    from opgen.lower import gpu_map

    m = ops[name].module()
    pipeline.run(m, "cuda")
    mappings = set()
    for k in m.body.block.ops:
        facts = gpu_map.KernelFacts(k)
        kids: list[int] = []
        for op in k.body.block.ops:
            where = gpu_map.mapping(op)
            if gpu_map.scalar_value(op):
                assert where is None, op
                continue
            assert where is not None, f"{op.name} not mapped"
            mappings.add(where)
            if where == s.GpuMapping.HOST:
                assert gpu_map.kernel_id(op) is None
                assert isinstance(op, s.RequireOp | s.SegmentsOp) or (
                    isinstance(op, s.AllocOp) and s.buf_type(op.result).role.data == "temp"), op
                continue
            kids.append(gpu_map.kernel_id(op))  # type: ignore[arg-type]
            if where in (s.GpuMapping.BLOCK, s.GpuMapping.FLAT, s.GpuMapping.COLUMNS):
                assert isinstance(op, s.ForOp) and facts.host_ok(op.lo) and facts.host_ok(op.hi)
                assert kids.count(kids[-1]) == 1  # the kernel is this loop alone
            if where == s.GpuMapping.BLOCK:
                assert op.kind.data == "parallel" and facts.needs_block(op)
            if where == s.GpuMapping.COLUMNS:  # its second statement, the summing loop, is sliced
                assert op.kind.data == "parallel" and facts.column_sliced(op)
                marked = [o for o in op.walk() if o is not op and gpu_map.mapping(o) is not None]
                assert marked == [list(op.body.block.ops)[1]]
                assert gpu_map.mapping(marked[0]) == s.GpuMapping.SLICES
                continue
            if where == s.GpuMapping.MATMUL:
                assert isinstance(op, s.BufferMatmulOp)
            for inner in op.walk():  # loops inside a kernel: threads/block_reduce in uniform code only
                w = gpu_map.mapping(inner) if inner is not op else None
                if w is None:
                    continue
                assert where in (s.GpuMapping.BLOCK, s.GpuMapping.SINGLE), (where, w)
                assert w in (s.GpuMapping.THREADS, s.GpuMapping.BLOCK_REDUCE)
                if w == s.GpuMapping.THREADS:
                    chain = gpu_map.thread_chain(inner)
                    assert all(lp.kind.data == "parallel" for lp in chain) and facts.thread_mappable(chain[0])
                else:
                    assert inner.kind.data == "reduce" and facts.block_reducible(inner)
                p = inner.parent_op()
                while p is not op:  # no marked loop inside another one's threads
                    assert gpu_map.mapping(p) is None, p
                    p = p.parent_op()
        assert kids == sorted(kids) and sorted(set(kids)) == list(range(len(set(kids))))
        # plan-gpu-workspace: temporaries, then 3 regions per segments op, then per-block scratch
        regions = [(gpu_map.region_id(o), o) for o in k.walk() if gpu_map.region_id(o) is not None]
        firsts = sorted(r for r, _ in regions)
        ordered = [o for _, o in sorted(regions, key=lambda x: x[0])]
        kinds = [("temp" if isinstance(o, s.AllocOp) and s.buf_type(o.result).role.data == "temp" else
                  "segments" if isinstance(o, s.SegmentsOp) else "scratch") for o in ordered]
        assert kinds == sorted(kinds, key=["temp", "segments", "scratch"].index)
        sizes = [3 if kd == "segments" else 1 for kd in kinds]
        assert firsts == [sum(sizes[:i]) for i in range(len(sizes))]  # consecutive, no gaps
    assert mappings & {s.GpuMapping.BLOCK, s.GpuMapping.FLAT, s.GpuMapping.SINGLE}


def rms_norm_cuda(ops, unit_stride: bool):
    """A copy of rms_norm_backward's CUDA kernel instance IR, and a function printing it as it is
    now (first dtype binding; the unit-stride or general-stride flavour)."""
    from opgen.emit import cpu, cuda

    o = ops["rms_norm_backward"]
    _, dim_ids, _, pidx, info = cpu.op_layout(o)
    (k,) = cpu.kernels(o, "cuda").values()
    k = k.clone()
    b = next(iter(cpu.bindings(k)))

    def source() -> str:
        pr = cuda.CudaPrinter(k, b, "k_test", cpu.kernel_buf_info(k, info), dim_ids, pidx)
        pr.unit_last = unit_stride
        return pr.print_instance()

    return k, source


def test_columns_mapping_needs_a_fresh_register_summed_blindly(ops):
    """map-gpu's columns mapping splits the summing loop over warps: only legal when the register
    starts at zero and the loop never reads the running value (each warp would see its slice's)."""
    from opgen.lower import gpu_map

    k, _ = rms_norm_cuda(ops, unit_stride=True)
    facts = gpu_map.KernelFacts(k)
    (cols,) = [op for op in k.body.block.ops if gpu_map.mapping(op) == s.GpuMapping.COLUMNS]
    assert facts.column_sliced(cols)
    alloc, inner = list(cols.body.block.ops)[:2]
    acc = next(o for o in inner.body.block.ops if isinstance(o, s.AccumOp))
    peek = s.LoadOp(alloc.result, [])
    inner.body.block.insert_op_before(peek, acc)
    assert not facts.column_sliced(cols)
    inner.body.block.erase_op(peek)
    assert facts.column_sliced(cols)
    alloc.zero = None  # (an accumulator that starts from what it held)
    assert not facts.column_sliced(cols)


def test_the_cuda_printer_follows_map_gpu(ops):
    """The printer decides no mapping: a kernel map-gpu maps onto blocks is launched over the
    grid; the same kernel marked ``single`` (always correct) is launched as one block."""
    from opgen.emit import cuda
    from opgen.lower import gpu_map

    k, source = rms_norm_cuda(ops, unit_stride=False)
    blocks = [op for op in k.body.block.ops if gpu_map.mapping(op) == s.GpuMapping.BLOCK]
    assert blocks
    kid = gpu_map.kernel_id(blocks[0])
    assert f"k_test_k{kid}<<<(unsigned)" in source()
    blocks[0].attributes[gpu_map.MAPPING] = s.GpuMappingAttr(s.GpuMapping.SINGLE)
    assert f"k_test_k{kid}<<<1, OPGEN_CUDA_THREADS" in source()
    del blocks[0].attributes[gpu_map.MAPPING]
    with pytest.raises(cuda.CudaUnsupported, match="map-gpu did not run"):
        source()
    blocks[0].attributes[gpu_map.MAPPING] = s.GpuMappingAttr(s.GpuMapping.BLOCK)
    reductions = [o for o in k.walk() if gpu_map.mapping(o) == s.GpuMapping.BLOCK_REDUCE]
    before = source().count("opgen_block_reduce")
    assert reductions and before
    del reductions[0].attributes[gpu_map.MAPPING]  # now a uniform loop every thread walks
    assert source().count("opgen_block_reduce") < before
    reductions[0].attributes[gpu_map.MAPPING] = s.GpuMappingAttr(s.GpuMapping.BLOCK_REDUCE)
    # grad_w's sum of the row groups' partials: a columns kernel, 32 columns per block, the warps'
    # slices combined in a fixed order; re-marked flat, it is one column per thread
    (cols,) = [op for op in k.body.block.ops if gpu_map.mapping(op) == s.GpuMapping.COLUMNS]
    ckid = gpu_map.kernel_id(cols)
    text = source()
    assert "opgen_column_combine<0, " in text and "/ OPGEN_CUDA_COLUMNS, 0);" in text
    cols.attributes[gpu_map.MAPPING] = s.GpuMappingAttr(s.GpuMapping.FLAT)
    text = source()
    assert "opgen_column_combine" not in text and f"k_test_k{ckid}<<<(unsigned)" in text
    cols.attributes[gpu_map.MAPPING] = s.GpuMappingAttr(s.GpuMapping.COLUMNS)
    planned = [o for o in k.walk() if gpu_map.region_id(o) is not None]
    assert planned
    del planned[-1].attributes[gpu_map.REGION]
    with pytest.raises(cuda.CudaUnsupported, match="plan-gpu-workspace"):
        source()


@pytest.mark.parametrize("name", SEED_OPS)
def test_gpu_barriers_and_chunks_are_placed_in_the_ir(ops, name):
    """place-gpu-barriers: barriers only in code a whole block runs (block/single kernels, never
    inside a thread loop, a block reduction, a flat or matmul kernel), none right after another,
    one closing each block iteration, and every store from uniform code, non-owned scratch zero
    fill and block matmul fenced on both sides. chunk-gpu-loops: chunks only on uncollapsed thread
    loops and block reductions whose moving accesses are contiguous (``buf[..., i]``)."""
    from opgen.lower import gpu_map, gpu_sync

    m = ops[name].module()
    pipeline.run(m, "cuda")
    barriers = chunks = 0
    for k in m.body.block.ops:
        for op in k.body.block.ops:
            kernel_mode = gpu_map.mapping(op)
            for x in op.walk():
                if isinstance(x, s.BarrierOp):
                    barriers += 1
                    assert kernel_mode in (s.GpuMapping.BLOCK, s.GpuMapping.SINGLE), kernel_mode
                    p = x.parent_op()
                    while p is not k:
                        assert gpu_map.mapping(p) not in (s.GpuMapping.THREADS, s.GpuMapping.BLOCK_REDUCE)
                        p = p.parent_op()
                    prev = x.prev_op
                    while prev is not None and not isinstance(prev, s.BarrierOp) and gpu_map.scalar_value(prev):
                        prev = prev.prev_op
                    assert not isinstance(prev, s.BarrierOp), "two barriers in a row"
                if isinstance(x, s.ForOp) and gpu_sync.chunk_bytes(x):
                    chunks += 1
                    assert gpu_map.mapping(x) in (s.GpuMapping.THREADS, s.GpuMapping.BLOCK_REDUCE)
                    assert gpu_map.COLLAPSE not in x.attributes and gpu_sync.moving(x)
                    for acc in gpu_sync.moving(x):
                        assert all(not gpu_sync._varies(v, x) for v in list(acc.idx)[:-1])
            if kernel_mode == s.GpuMapping.BLOCK:
                assert isinstance(op.body.block.last_op, s.BarrierOp)  # (the iteration's end)
                fenced = [x for x in op.walk() if isinstance(x, s.StoreOp | s.AccumOp | s.AllocOp | s.BufferMatmulOp)
                          and not gpu_map.register(x.buf if isinstance(x, s.StoreOp | s.AccumOp) else
                                                   x.c if isinstance(x, s.BufferMatmulOp) else x.result)
                          and not any(gpu_map.mapping(p) in (s.GpuMapping.THREADS, s.GpuMapping.BLOCK_REDUCE)
                                      for p in _ancestors(x, op))
                          and not (isinstance(x, s.AllocOp) and (gpu_sync.owned(x) or not (x.zero and x.zero.data)))]
                for x in fenced:
                    assert _next_effect(x, before=True) and _next_effect(x, before=False), x
    assert barriers
    assert bool(chunks) == (name != "fused_linear_cross_entropy_loss_grad")  # (its loops are 2-D tiles)


def _ancestors(x, stop):
    p = x.parent_op()
    while p is not stop and p is not None:
        yield p
        p = p.parent_op()


def _next_effect(x, before: bool) -> bool:
    """A barrier is the nearest op before/after ``x`` in its block that is not a pure scalar."""
    from opgen.lower import gpu_map

    o = x.prev_op if before else x.next_op
    while o is not None and (gpu_map.scalar_value(o) or isinstance(o, s.AllocOp)):
        o = o.prev_op if before else o.next_op
    return isinstance(o, s.BarrierOp)


def test_adjacent_barriers_canonicalize_to_one():
    """A barrier after another with only side-effect-free ops between is dropped; a memory access
    between them keeps both."""
    from xdsl.transforms.canonicalize import CanonicalizePass

    def barriers_left(middle: str) -> int:
        src = ("builtin.module {\n^bb0(%x: !sched.buf<[N], f32, in>, %y: !sched.buf<[N], f32, out>, "
               "%i: !opgen.tensor<[], i64>):\n"
               f"sched.barrier\n{middle}\nsched.barrier\n}}")
        mod = Parser(pipeline.context(), src).parse_module()
        CanonicalizePass().apply(pipeline.context(), mod)
        return sum(isinstance(o, s.BarrierOp) for o in mod.walk())

    assert barriers_left("") == 1
    assert barriers_left('%c = "opgen.constant"() <{value = 1.0 : f64}> : () -> !opgen.tensor<[], f32>\n'
                         "sched.store %c, %y[%i] : !opgen.tensor<[], f32>, !sched.buf<[N], f32, out>") == 2
    assert barriers_left("%v = sched.load %x[%i] : !sched.buf<[N], f32, in> -> !opgen.tensor<[], f32>\n"
                         "sched.store %v, %y[%i] : !opgen.tensor<[], f32>, !sched.buf<[N], f32, out>\n"
                         "sched.barrier\n%w = opgen.add %v, %v : !opgen.tensor<[], f32>\n"
                         "sched.store %w, %y[%i] : !opgen.tensor<[], f32>, !sched.buf<[N], f32, out>") == 3


def test_the_cuda_printer_prints_the_barriers_and_chunks_it_is_given(ops):
    """The printer decides no barrier and no chunking: each ``sched.barrier`` is one
    ``__syncthreads()``, and a loop without ``gpu_chunk`` is strided element by element."""
    from opgen.lower import gpu_sync

    k, source = rms_norm_cuda(ops, unit_stride=True)  # (the unit-stride flavour: chunks are vectors)
    barriers = [x for x in k.walk() if isinstance(x, s.BarrierOp)]
    before = source()
    assert before.count("__syncthreads();") == len(barriers)
    barriers[0].detach()
    barriers[0].erase()
    assert source().count("__syncthreads();") == len(barriers) - 1
    chunked = [x for x in k.walk() if isinstance(x, s.ForOp) and gpu_sync.chunk_bytes(x)]
    assert chunked and "opgen_vec<" in before
    for x in chunked:
        del x.attributes[gpu_sync.CHUNK]
    assert "opgen_vec<" not in source()


@pytest.mark.parametrize("name", SEED_OPS)
def test_map_cpu_marks_openmp_loops_and_lanes(ops, name):
    """map-cpu: OpenMP on the outermost parallel loop of each nest only (never nested), lanes on
    reduce loops over scalar accumulators, staged and nontemporal stores and staged loads in
    stream loops only (a loop is a stream when it prefetches or streams its stores); the printer puts
    its pragmas exactly there."""
    from opgen.emit import cpu
    from opgen.lower import cpu_map

    m = ops[name].module()
    pipeline.run(m, "cpu")
    marked = 0
    for op in m.walk():
        where = cpu_map.cpu_mapping(op)
        enclosing = []
        p = op.parent_op()
        while p is not None:
            if isinstance(p, s.ForOp) and p.kind.data == "parallel":
                enclosing.append(p)
            p = p.parent_op()
        if isinstance(op, s.ForOp) and op.kind.data == "parallel":
            assert (where == s.CpuMapping.OMP_FOR) == (not enclosing), op
            hints = any(isinstance(x, s.PrefetchOp) for x in op.body.block.ops)
            streamed = any(isinstance(x, s.StoreOp) and cpu_map.cpu_mapping(x) == s.CpuMapping.NONTEMPORAL
                           for x in op.body.block.ops)
            assert (where == s.CpuMapping.STREAM) == (hints or streamed), op  # (tests/test_new_op_backends.py)
        elif isinstance(op, s.ForOp) and op.kind.data == "reduce" and cpu_map.lane_split(op):
            assert where == s.CpuMapping.LANES
        elif isinstance(op, s.StoreOp) and where is not None:  # (staged: tests/test_new_op_backends.py)
            loop = op.parent_op()
            assert where in (s.CpuMapping.STAGED, s.CpuMapping.NONTEMPORAL), op
            assert cpu_map.cpu_mapping(loop) == s.CpuMapping.STREAM, op
            assert op in cpu_map.staged_stores(loop)
        elif isinstance(op, s.LoadOp) and where is not None:  # (staged loads: tests/test_interleave.py)
            loop = op.parent_op()
            assert where == s.CpuMapping.STAGED and cpu_map.cpu_mapping(loop) == s.CpuMapping.STREAM, op
            assert op in cpu_map.staged_loads(loop)
        elif not isinstance(op, s.BufferMatmulOp):
            assert where is None, op
        marked += where is not None
    assert marked
    text = cpu.op_source(ops[name])
    regions = text.count("#pragma omp parallel num_threads(opgen_team())")  # (a loop with streaming stores)
    assert text.count("#pragma omp parallel for") + regions > 0
    assert regions == text.count("#pragma omp for schedule(static) nowait") == text.count("opgen_stream_fence();")
