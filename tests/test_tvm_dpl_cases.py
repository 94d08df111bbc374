"""TVM's ``rewrite_call`` tests, with TVM's expected IR, run through ``rewrite_call(..., cleanup=True)``.

The fourteen cases (parametrized cases counted one by one) of every test in
TVM's tests/python/relax/test_dataflow_pattern.py that calls
``relax.dpl.rewrite_call``, written as our own tests.  Each checks the result
against the expected function of TVM's test and against what TVM's own
``rewrite_call`` gives on the installed TVM, so a drift in either shows.
Without ``cleanup=True`` some results differ from TVM's by leftover trivial
bindings or a duplicate computation; that is checked too, where it happens.
"""

from __future__ import annotations

import functools
import math

import pytest
import tvm
import tvm_ffi
from tvm import relax as rx
from tvm import tirx
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.script import relax as R
from tvm.script import tirx as T

from rewrite_ext import rewrite_call
from rewrite_ext.compat import has_ty, imm_value, ty


def _const_data(const):
    """A relax.Constant's array: ``.value`` in TVM 0.27, ``.data`` before."""
    data = getattr(const, "value", None)
    return (data if data is not None else const.data).numpy()


def check(pattern, rewriter, before, expected):
    """Ours with cleanup=True, and TVM's, both equal ``expected``; the input is unchanged."""
    text = before.script()
    ours = rewrite_call(pattern, rewriter, before, cleanup=True)
    tvm.ir.assert_structural_equal(ours, expected)
    tvm.ir.assert_structural_equal(rx.dpl.rewrite_call(pattern, rewriter, before), expected)
    rx.analysis.well_formed(ours)
    assert before.script() == text
    return ours


# -- test_rewrite_simple ---------------------------------------------------------------------


def test_rewrite_simple():
    @R.function
    def main(x: R.Tensor((16, 16), "float32")) -> R.Tensor((16, 16), "float32"):
        with R.dataflow():
            x2 = R.add(x, x)
            x4 = R.add(x2, x2)
            R.output(x4)
        return x4

    @R.function
    def expected1(x: R.Tensor((16, 16), dtype="float32")) -> R.Tensor((16, 16), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((16, 16), dtype="float32") = R.multiply(x, R.const(2, "float32"))
            x4: R.Tensor((16, 16), dtype="float32") = R.multiply(lv, R.const(2, "float32"))
            R.output(x4)
        return x4

    @R.function
    def expected2(x: R.Tensor((16, 16), dtype="float32")) -> R.Tensor((16, 16), dtype="float32"):
        with R.dataflow():
            x4: R.Tensor((16, 16), dtype="float32") = R.multiply(x, R.const(4, "float32"))
            R.output(x4)
        return x4

    x = wildcard()
    pattern = is_op("relax.add")(x, x)

    def times_two(_, matchings):
        return R.multiply(matchings[x], R.const(2, "float32"))

    check(pattern, times_two, main, expected1.with_attr("global_symbol", "main"))

    add1 = is_op("relax.add")(x, x)
    pattern = is_op("relax.add")(add1, add1)

    def times_four(_, matchings):
        return R.multiply(matchings[x], R.const(4, "float32"))

    check(pattern, times_four, main, expected2.with_attr("global_symbol", "main"))

    def unchanged(orig, _):
        return orig

    assert rewrite_call(pattern, unchanged, main, cleanup=True).same_as(main)


def test_rewrite_attention():
    @R.function
    def main(
        Q: R.Tensor((2, 4096, 8, 40), "float32"),
        K: R.Tensor((2, 4096, 8, 40), "float32"),
        V: R.Tensor((2, 4096, 8, 40), "float32"),
    ) -> R.Tensor((2, 4096, 8, 40), "float32"):
        with R.dataflow():
            lv58 = R.permute_dims(Q, axes=[0, 2, 1, 3])
            lv59 = R.reshape(lv58, R.shape([16, 4096, 40]))
            lv61 = R.permute_dims(K, axes=[0, 2, 1, 3])
            lv62 = R.reshape(lv61, R.shape([16, 4096, 40]))
            lv64 = R.permute_dims(V, axes=[0, 2, 1, 3])
            lv65 = R.reshape(lv64, R.shape([16, 4096, 40]))
            lv62_transposed = R.permute_dims(lv62, axes=[0, 2, 1])
            lv3_1 = R.matmul(lv59, lv62_transposed)
            lv68 = R.multiply(lv3_1, R.const(0.15811388194561005, "float32"))
            lv69 = R.nn.softmax(lv68, axis=-1)
            lv_3 = R.matmul(lv69, lv65)
            lv71 = R.reshape(lv_3, R.shape([2, 8, 4096, 40]))
            lv72 = R.permute_dims(lv71, axes=[0, 2, 1, 3])
            R.output(lv72)
        return lv72

    @R.function
    def expected(
        Q: R.Tensor((2, 4096, 8, 40), dtype="float32"),
        K: R.Tensor((2, 4096, 8, 40), dtype="float32"),
        V: R.Tensor((2, 4096, 8, 40), dtype="float32"),
    ) -> R.Tensor((2, 4096, 8, 40), dtype="float32"):
        with R.dataflow():
            lv72: R.Tensor((2, 4096, 8, 40), dtype="float32") = R.nn.attention(Q, V, K)
            R.output(lv72)
        return lv72

    def bsnh_to_bsh(tensor):
        return is_op("relax.reshape")(is_op("relax.permute_dims")(tensor), wildcard())

    def bsh_to_bsnh(tensor):
        return is_op("relax.permute_dims")(is_op("relax.reshape")(tensor, wildcard()))

    q, k, v = wildcard(), wildcard(), wildcard()
    matmul1 = is_op("relax.matmul")(bsnh_to_bsh(q), is_op("relax.permute_dims")(bsnh_to_bsh(v)))
    multiply = is_op("relax.multiply")(matmul1, is_const())
    softmax = is_op("relax.nn.softmax")(multiply)
    matmul2 = is_op("relax.matmul")(softmax, bsnh_to_bsh(k))
    pattern = bsh_to_bsnh(matmul2)

    def rewriter(_, matchings):
        return R.nn.attention(matchings[q], matchings[k], matchings[v])

    check(pattern, rewriter, main, expected.with_attr("global_symbol", "main"))


def test_commutative_pattern_match():
    @R.function(private=True)
    def before(x: R.Tensor((1024,))):
        with R.dataflow():
            y = R.add(x, x)
            out = R.add(R.const(1.0), y)
            R.output(out)
        return out

    @R.function(private=True)
    def expected(x: R.Tensor((1024,))):
        with R.dataflow():
            y = R.add(x, x)
            out = R.add(y, R.const(2.0))
            R.output(out)
        return out

    pattern_op = is_op("relax.add") | is_op("relax.multiply")
    pattern_arg = wildcard()
    pattern_const = is_const()
    pattern = pattern_op(pattern_arg, pattern_const)

    def rewriter(expr, matches):
        const = _const_data(matches[pattern_const])
        if const.shape == () and const[()] == 1.0:
            return rx.Call(matches[pattern_op], [matches[pattern_arg], rx.const(2.0)])
        return expr

    check(pattern, rewriter, before, expected)


def test_repeated_pattern_match():
    @R.function(private=True)
    def before(x: R.Tensor((1024,)), y: R.Tensor((1024,)), z: R.Tensor((1024,))):
        with R.dataflow():
            a = R.add(x, y)
            b = R.add(a, z)
            out = R.multiply(b, R.const(5.0))
            R.output(out)
        return out

    @R.function(private=True)
    def expected(x: R.Tensor((1024,)), y: R.Tensor((1024,)), z: R.Tensor((1024,))):
        with R.dataflow():
            x = R.multiply(x, R.const(5.0))
            y = R.multiply(y, R.const(5.0))
            a = R.add(x, y)
            z = R.multiply(z, R.const(5.0))
            b = R.add(a, z)
            R.output(b)
        return b

    lhs, rhs = wildcard(), wildcard()
    pattern_add = is_op("relax.add")(lhs, rhs)
    mul_const = is_const()
    pattern = is_op("relax.multiply")(pattern_add, mul_const)

    def rewriter(_expr, matches):
        const = matches[mul_const]
        return (matches[lhs] * const) + (matches[rhs] * const)

    check(pattern, rewriter, before, expected)


@pytest.mark.parametrize("bind_to_dataflow_var", [False, True], ids=["var-to-var", "var-to-dataflow-var"])
def test_rewrite_without_trivial_binding(bind_to_dataflow_var):
    if bind_to_dataflow_var:

        @R.function(private=True)
        def before(x: R.Tensor((1024,))):
            with R.dataflow():
                a = R.add(x, x)
                b = R.reshape(a, (1024,))
                R.output(b)
            return b

        @R.function(private=True)
        def expected(x: R.Tensor((1024,))):
            with R.dataflow():
                b = R.add(x, x)
                R.output(b)
            return b

    else:

        @R.function(private=True)
        def before(x: R.Tensor((1024,))):
            a = R.add(x, x)
            b = R.reshape(a, (1024,))
            return b

        @R.function(private=True)
        def expected(x: R.Tensor((1024,))):
            a = R.add(x, x)
            return a

    pattern_arg = wildcard()
    pattern_shape_expr = wildcard()
    pattern = is_op("relax.reshape")(pattern_arg, pattern_shape_expr)

    def rewriter(expr, matches):
        arg = matches[pattern_arg]
        if tvm_ffi.structural_equal(ty(arg).shape, matches[pattern_shape_expr]):
            return arg
        return expr

    check(pattern, rewriter, before, expected)
    # Without cleanup the reshape's binding stays, as a trivial binding `b = a`.
    plain = rewrite_call(pattern, rewriter, before)
    assert not tvm_ffi.structural_equal(plain, expected)
    assert any(isinstance(b.value, rx.Var) for block in plain.body.blocks for b in block.bindings)


def test_iterative_rewrite_without_trivial_binding():
    @R.function(private=True)
    def before(x: R.Tensor((1024,))):
        with R.dataflow():
            a = R.strided_slice(x, [0], [0], [512], [1])
            b = R.strided_slice(x, [0], [512], [1024], [1])
            c = R.add(a, b)
            R.output(c)
        return c

    @R.function(private=True)
    def expected(x: R.Tensor((1024,))):
        with R.dataflow():
            x_split = R.split(x, 2)
            a = x_split[0]
            b = x_split[1]
            c = R.add(a, b)
            R.output(c)
        return c

    pattern_arg, pattern_axes = wildcard(), wildcard()
    pattern_begin, pattern_end, pattern_strides = wildcard(), wildcard(), wildcard()
    pattern = is_op("relax.strided_slice")(
        pattern_arg, pattern_axes, pattern_begin, pattern_end, pattern_strides
    )

    def rewriter(expr, matches):
        arg = matches[pattern_arg]
        axes = matches[pattern_axes]
        begin = matches[pattern_begin][0]
        end = matches[pattern_end][0]
        stride = matches[pattern_strides][0]
        if ty(arg).shape is None or len(axes) != 1:
            return expr
        # immediates: IntImm in TVM 0.26+, R.prim_value in 0.25
        axis, stride = imm_value(axes[0]), imm_value(stride)
        if axis != 0 or stride != 1:
            return expr
        size, begin, end = (imm_value(v) for v in (ty(arg).shape[0], begin, end))
        if None in (size, begin, end):
            return expr
        gcd = functools.reduce(math.gcd, [begin, end, size])
        if (end - begin) // gcd == 1:
            return rx.op.split(arg, size // gcd)[begin // gcd]
        return expr

    check(pattern, rewriter, before, expected)
    # Without cleanup each slice computes its own split: a duplicate computation.
    plain = rewrite_call(pattern, rewriter, before)
    splits = [b for b in plain.body.blocks[0].bindings if "R.split" in str(b.value)]
    assert len(splits) == 2


def test_iterative_rewrite_with_removed_intermediates():
    @R.function(private=True)
    def before(a: R.Tensor((1024,)), b: R.Tensor((1024,))):
        with R.dataflow():
            c = R.concat([a, b])
            d = R.split(c, 2)
            e = d[0]
            f = d[1]
            g = R.add(a, e)
            h = R.add(f, g)
            R.output(h)
        return h

    @R.function(private=True)
    def expected(a: R.Tensor((1024,)), b: R.Tensor((1024,))):
        with R.dataflow():
            g = R.multiply(a, R.const(2))
            h = R.add(b, g)
            R.output(h)
        return h

    pat_args = wildcard()
    pat_concat = is_op("relax.concat")(pat_args).has_attr({"axis": 0})
    pat_unwrap_concat_split = is_op("relax.split")(pat_concat).has_attr(
        {"axis": 0, "indices_or_sections": T.int64(2)}
    )
    pat_arg = wildcard()
    pat_add_self = is_op("relax.add")(pat_arg, pat_arg)
    pattern = pat_unwrap_concat_split | pat_add_self

    def rewriter(expr, matches):
        if pat_unwrap_concat_split in matches:
            args = matches[pat_args]
            if len(args) == 2 and tvm_ffi.structural_equal(ty(args[0]), ty(args[1])):
                return args
        elif pat_add_self in matches:
            return matches[pat_arg] * rx.const(2)
        return expr

    check(pattern, rewriter, before, expected)
    # Without cleanup `g = R.add(a, e)` never becomes `R.add(a, a)`: that match needs the
    # canonicalization between passes.
    plain = rewrite_call(pattern, rewriter, before)
    assert not any("R.multiply" in str(b.value) for b in plain.body.blocks[0].bindings)


def _ty_pattern(shape):
    lhs = has_ty(wildcard(), R.Tensor(shape))
    rhs = has_ty(wildcard(), R.Tensor(shape))

    def rewriter(expr, matches):
        return rx.op.multiply(matches[lhs], matches[rhs])

    return is_op("relax.add")(lhs, rhs), rewriter


def test_wildcard_with_ty_updates_when_matching():
    @R.function(private=True)
    def before():
        with R.dataflow():
            A = R.zeros([2, 3], "int32")
            B = R.ones([2, 3], "int32")
            C = R.add(A, B)
            R.output(C)
        return C

    @R.function(private=True)
    def expected():
        with R.dataflow():
            A = R.zeros([2, 3], "int32")
            B = R.ones([2, 3], "int32")
            C = R.multiply(A, B)
            R.output(C)
        return C

    check(*_ty_pattern([2, 3]), before, expected)


def test_wildcard_with_ty_is_no_op_when_not_matching():
    @R.function(private=True)
    def before():
        with R.dataflow():
            A = R.zeros([16, 32], "int32")
            B = R.ones([16, 32], "int32")
            C = R.add(A, B)
            R.output(C)
        return C

    ours = check(*_ty_pattern([2, 3]), before, before)
    assert ours.same_as(before)


def test_wildcard_ty_for_unknown_dtype():
    @R.function(private=True)
    def before():
        with R.dataflow():
            A = R.zeros([2, 3], "int32")
            B = R.ones([2, 3], "int32")
            C = R.add(A, B)
            D = R.zeros([2, 3], "float32")
            E = R.ones([2, 3], "float32")
            F = R.add(D, E)
            output = (C, F)
            R.output(output)
        return output

    @R.function(private=True)
    def expected():
        with R.dataflow():
            A = R.zeros([2, 3], "int32")
            B = R.ones([2, 3], "int32")
            C = R.multiply(A, B)
            D = R.zeros([2, 3], "float32")
            E = R.ones([2, 3], "float32")
            F = R.multiply(D, E)
            output = (C, F)
            R.output(output)
        return output

    check(*_ty_pattern([2, 3]), before, expected)


def test_wildcard_ty_with_symbolic_vars():
    m = tirx.Var("m", "int64")
    n = tirx.Var("n", "int64")

    @R.function(private=True)
    def before():
        with R.dataflow():
            A = R.zeros([64, 128], "int32")
            B = R.ones([64, 128], "int32")
            C = R.add(A, B)
            D = R.zeros([64, 128], "float32")
            E = R.ones([1, 128], "float32")
            F = R.add(D, E)
            output = (C, F)
            R.output(output)
        return output

    @R.function(private=True)
    def expected():
        with R.dataflow():
            A = R.zeros([64, 128], "int32")
            B = R.ones([64, 128], "int32")
            C = R.multiply(A, B)
            D = R.zeros([64, 128], "float32")
            E = R.ones([1, 128], "float32")
            F = R.add(D, E)
            output = (C, F)
            R.output(output)
        return output

    check(*_ty_pattern([m, n]), before, expected)


def test_backtrack_if_rewriter_returns_no_op():
    pat_match_no_rewrite = is_op("relax.add")(wildcard(), wildcard())
    pat_arg = wildcard()
    pat_add = is_op("relax.add")(pat_arg, is_op("relax.zeros")(wildcard()))
    pat = pat_match_no_rewrite | pat_add

    def rewriter(expr, matches):
        if pat_match_no_rewrite in matches:
            return expr
        if pat_add in matches:
            return matches[pat_arg]
        raise RuntimeError("Pattern matched, but neither branch matched")

    @R.function(private=True)
    def before():
        with R.dataflow():
            A = R.ones([64, 128], "int32")
            B = R.zeros([64, 128], "int32")
            C = R.add(A, B)
            R.output(C)
        return C

    @R.function(private=True)
    def expected():
        with R.dataflow():
            C = R.ones([64, 128], "int32")
            R.output(C)
        return C

    check(pat, rewriter, before, expected)


def test_backtrack_for_no_op_rewriter_does_not_match_on_var():
    pat_a = is_op("relax.add")(wildcard(), wildcard())
    pat_b = is_op("relax.add")(wildcard(), wildcard())
    pat = pat_a | pat_b
    seen = []

    def rewriter(expr, matches):
        seen.append(matches[pat])
        return expr

    @R.function(private=True)
    def before():
        with R.dataflow():
            A = R.ones([64, 128], "int32")
            B = R.zeros([64, 128], "int32")
            C = R.add(A, B)
            R.output(C)
        return C

    assert check(pat, rewriter, before, before).same_as(before)
    assert seen and all(isinstance(value, rx.Call) for value in seen)
