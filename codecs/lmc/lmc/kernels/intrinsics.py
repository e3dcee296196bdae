"""Unaligned little-endian loads/stores on uint8 arrays for Numba kernels.

Under ``NUMBA_DISABLE_JIT=1`` pure-Python equivalents are used instead.
``ld``/``st`` index any 1-D array by element without Numba's
negative-index wraparound.  These helpers do NO bounds checking: callers must guarantee that
``idx .. idx + width`` lies inside the array.

Checked build (for the fuzzer, ``tests/fuzz_decoder.py``): with the environment variable
``LMC_CHECKED=1`` (read at import) every helper raises ``IndexError`` for an index that is
negative or whose ``width`` bytes do not lie inside the array, instead of truncating (no JIT) or
reading past the buffer (JIT).  Under JIT the checked helpers are used automatically when
``NUMBA_BOUNDSCHECK=1`` (which makes Numba check the kernels' plain indexing too); the checked
kernels are then cached apart from the normal ones (``boundscheck``, or ``checked`` for
``LMC_CHECKED=1`` alone, below Numba's cache directory), so no build ever loads another's.  Without either variable nothing changes: the
normal build is the unchecked one below.
"""
import os

import numba
import numpy as np

CHECKED = os.environ.get("LMC_CHECKED", "") not in ("", "0") or bool(numba.config.BOUNDSCHECK)

if numba.config.DISABLE_JIT:  # pragma: no cover - exercised in a subprocess test

    def _mk_load(nbytes, typ):
        def _load(arr, idx):
            idx = int(idx)
            return typ(int.from_bytes(bytes(arr[idx:idx + nbytes]), "little"))
        return _load

    def _mk_store(nbytes):
        def _store(arr, idx, val):
            idx = int(idx)
            arr[idx:idx + nbytes] = np.frombuffer(
                int(val).to_bytes(nbytes, "little"), dtype=np.uint8)
        return _store

    def ld(arr, idx):
        return arr[int(idx)]

    def clz64(x):
        return 64 - int(x).bit_length()

    def ctz64(x):
        x = int(x)
        return (x & -x).bit_length() - 1 if x else 64

    def popcnt64(x):
        return bin(int(x)).count("1")

    def mulhi64(a, b):
        return np.uint64((int(a) * int(b)) >> 64)

    def f64_bits(x):
        return np.int64(np.float64(x).view(np.int64))

    def st(arr, idx, val):
        arr[int(idx)] = val

    def _widths(mk_load, mk_store):
        """(load_u16, load_u32, load_u64, store_u16, store_u32, store_u64) from mk_load(nbytes, type) and
        mk_store(nbytes)."""
        return (mk_load(2, np.uint16), mk_load(4, np.uint32), mk_load(8, np.uint64),
                mk_store(2), mk_store(4), mk_store(8))

    load_u16, load_u32, load_u64, store_u16, store_u32, store_u64 = _widths(_mk_load, _mk_store)

    if CHECKED:
        def _check(arr, idx, width, what):
            idx = int(idx)
            if arr.ndim != 1 or idx < 0 or idx + width > arr.shape[0]:
                raise IndexError(f"lmc checked build: {what} at index {idx} (width {width}) "
                                 f"outside an array of shape {arr.shape}")
            return idx

        def _mk_cload(nbytes, typ):
            def _load(arr, idx):
                idx = _check(arr, idx, nbytes, f"load_u{8 * nbytes}")
                return typ(int.from_bytes(arr[idx:idx + nbytes].tobytes(), "little"))
            return _load

        def _mk_cstore(nbytes):
            def _store(arr, idx, val):
                idx = _check(arr, idx, nbytes, f"store_u{8 * nbytes}")
                arr[idx:idx + nbytes] = np.frombuffer(
                    (int(val) & ((1 << (8 * nbytes)) - 1)).to_bytes(nbytes, "little"), dtype=np.uint8)
            return _store

        def ld(arr, idx):
            return arr[_check(arr, idx, 1, "ld")]

        def st(arr, idx, val):
            arr[_check(arr, idx, 1, "st")] = val

        load_u16, load_u32, load_u64, store_u16, store_u32, store_u64 = _widths(_mk_cload, _mk_cstore)

        class CheckedArray(np.ndarray):
            """An ndarray whose integer indexes must be in range (no negative
            wraparound) and whose slices must lie inside it (no silent
            truncation): the kernels' plain indexing, checked."""

            @staticmethod
            def _key(self, key):
                keys = key if isinstance(key, tuple) else (key,)
                for ax, k in enumerate(keys):
                    size = self.shape[ax] if ax < self.ndim else 0
                    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                        if not 0 <= k < size:
                            raise IndexError(f"lmc checked build: index {k} outside axis of {size}")
                    elif isinstance(k, slice):
                        for v in (k.start, k.stop):
                            if v is not None and not 0 <= v <= size:
                                raise IndexError(f"lmc checked build: slice {k} outside axis of {size}")

            def __getitem__(self, key):
                if type(key) is int and self.ndim == 1:  # the common case, fast
                    if not 0 <= key < self.shape[0]:
                        raise IndexError(f"lmc checked build: index {key} outside axis of {self.shape[0]}")
                else:
                    CheckedArray._key(self, key)
                return np.ndarray.__getitem__(self, key)

            def __setitem__(self, key, val):
                if type(key) is int and self.ndim == 1:
                    if not 0 <= key < self.shape[0]:
                        raise IndexError(f"lmc checked build: index {key} outside axis of {self.shape[0]}")
                else:
                    CheckedArray._key(self, key)
                np.ndarray.__setitem__(self, key, val)

        def checked(a):
            return a.view(CheckedArray)

        class _CheckedNumpy:
            """numpy for the kernels of the checked pure-Python build: the
            arrays they allocate are CheckedArray too."""

            def __getattr__(self, name):
                return getattr(np, name)

            @staticmethod
            def empty(*a, **k):
                return np.empty(*a, **k).view(CheckedArray)

            @staticmethod
            def zeros(*a, **k):
                return np.zeros(*a, **k).view(CheckedArray)

        checked_numpy = _CheckedNumpy()

else:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    _RT = {16: types.uint16, 32: types.uint32, 64: types.uint64}

    def _mk_load(bits):
        @intrinsic
        def _load(typingctx, arr, idx):
            if not (isinstance(arr, types.Array) and arr.dtype == types.uint8
                    and isinstance(idx, types.Integer)):
                return None
            sig = _RT[bits](arr, types.intp)

            def codegen(context, builder, signature, args):
                ary = context.make_array(signature.args[0])(context, builder, args[0])
                ptr = builder.gep(ary.data, [args[1]])
                p = builder.bitcast(ptr, ir.IntType(bits).as_pointer())
                return builder.load(p, align=1)
            return sig, codegen
        return _load

    def _mk_store(bits):
        @intrinsic
        def _store(typingctx, arr, idx, val):
            if not (isinstance(arr, types.Array) and arr.dtype == types.uint8
                    and isinstance(idx, types.Integer)):
                return None
            sig = types.void(arr, types.intp, _RT[bits])

            def codegen(context, builder, signature, args):
                ary = context.make_array(signature.args[0])(context, builder, args[0])
                ptr = builder.gep(ary.data, [args[1]])
                p = builder.bitcast(ptr, ir.IntType(bits).as_pointer())
                builder.store(args[2], p, align=1)
                return context.get_dummy_value()
            return sig, codegen
        return _store

    @intrinsic
    def ld(typingctx, arr, idx):
        """arr[idx] without negative-index wraparound (idx must be in range)."""
        if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)):
            return None
        sig = arr.dtype(arr, types.intp)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            return builder.load(builder.gep(ary.data, [args[1]]))
        return sig, codegen

    @intrinsic
    def st(typingctx, arr, idx, val):
        """arr[idx] = val (cast to the array dtype) without wraparound."""
        if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)
                and isinstance(val, types.Integer)):
            return None
        sig = types.void(arr, types.intp, val)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            v = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
            builder.store(v, builder.gep(ary.data, [args[1]]))
            return context.get_dummy_value()
        return sig, codegen

    def _bit_count(emit, doc):
        """An intrinsic of one uint64 argument returning int64, its value emit(builder, x)."""
        @intrinsic
        def _count(typingctx, x):
            if not (isinstance(x, types.Integer) and x.bitwidth == 64):
                return None
            sig = types.int64(x)

            def codegen(context, builder, signature, args):
                return emit(builder, args[0])
            return sig, codegen
        _count.__doc__ = doc
        return _count

    _NOT_POISON = ir.Constant(ir.IntType(1), 0)   # (a zero argument is defined: 64)
    clz64 = _bit_count(lambda b, x: b.ctlz(x, _NOT_POISON), "Count of leading zero bits of a uint64 (64 for 0).")
    ctz64 = _bit_count(lambda b, x: b.cttz(x, _NOT_POISON), "Count of trailing zero bits of a uint64 (64 for 0).")
    popcnt64 = _bit_count(lambda b, x: b.ctpop(x), "Count of set bits of a uint64.")

    @intrinsic
    def mulhi64(typingctx, a, b):
        """High 64 bits of the 128-bit product of two uint64 (one mul)."""
        if not (isinstance(a, types.Integer) and a.bitwidth == 64
                and isinstance(b, types.Integer) and b.bitwidth == 64):
            return None
        sig = types.uint64(a, b)

        def codegen(context, builder, signature, args):
            i128 = ir.IntType(128)
            p = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
            return builder.trunc(builder.lshr(p, ir.Constant(i128, 64)), ir.IntType(64))
        return sig, codegen

    @intrinsic
    def f64_bits(typingctx, x):
        """The IEEE bits of a float64, as int64 (a bitcast)."""
        if not isinstance(x, types.Float) or x.bitwidth != 64:
            return None
        sig = types.int64(x)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return sig, codegen

    load_u16 = _mk_load(16)
    load_u32 = _mk_load(32)
    load_u64 = _mk_load(64)
    store_u16 = _mk_store(16)
    store_u32 = _mk_store(32)
    store_u64 = _mk_store(64)

    if CHECKED:
        # the same helpers behind a bounds check that raises IndexError (Numba raises from nopython
        # code); compiled and cached apart from the normal kernels
        from numba import njit

        _base = numba.config.CACHE_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "__pycache__")
        # (Numba's cache index does not record NUMBA_BOUNDSCHECK: one directory per variant)
        numba.config.CACHE_DIR = os.path.join(_base, "boundscheck" if numba.config.BOUNDSCHECK else "checked")

        def _mk_checked(raw, width, store):
            if store:
                @njit(nogil=True, inline="always")
                def _cst(arr, idx, val):
                    if idx < 0 or idx + width > arr.shape[0]:
                        raise IndexError("lmc checked build: store outside the array")
                    raw(arr, idx, val)
                return _cst

            @njit(nogil=True, inline="always")
            def _cld(arr, idx):
                if idx < 0 or idx + width > arr.shape[0]:
                    raise IndexError("lmc checked build: load outside the array")
                return raw(arr, idx)
            return _cld

        ld = _mk_checked(ld, 1, False)
        st = _mk_checked(st, 1, True)
        load_u16 = _mk_checked(load_u16, 2, False)
        load_u32 = _mk_checked(load_u32, 4, False)
        load_u64 = _mk_checked(load_u64, 8, False)
        store_u16 = _mk_checked(store_u16, 2, True)
        store_u32 = _mk_checked(store_u32, 4, True)
        store_u64 = _mk_checked(store_u64, 8, True)
