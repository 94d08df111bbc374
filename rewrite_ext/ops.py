"""The op ``relax.vm.copy_tensor``: copy one tensor into another, in place.

No PyPI release of TVM has this op (the TVM forum thread "Use relax
builtin_with_ctx operator in rewrite_call" uses it as its seed), so importing
this module registers it when TVM lacks it:

- ``FInferType`` (``FInferStructInfo`` in TVM 0.25): ``R.Tuple()`` (void), after checking two tensor arguments;
- ``FPurity``: ``False``, since it writes into ``dst``;
- ``FLowerBuiltin``: ``R.call_packed("runtime.TVMTensorCopyFromTo", src, dst)``,
  a copy TVM's C++ runtime already provides, so built modules run with
  ``relax.build(mod, target="llvm")`` in both exec modes and need no Python
  at run time;
- TVMScript: the printer already prints any ``relax.vm.NAME`` op as
  ``R.vm.NAME(...)``, and ``R.vm`` is the module ``tvm.relax.op.vm``, so
  :func:`copy_tensor` is attached there for the parser to resolve.

When TVM already defines the op, TVM's definition is used and nothing is
registered.  Importing or reloading this module again is a no-op.
"""

from __future__ import annotations

import tvm
import tvm.relax.op.vm as _relax_vm
from tvm import relax
from tvm.ir import Op

from ._ir import static_nbytes
from .compat import INFER_TYPE_ATTR, ObjectType, TensorType, TupleType, ty

__all__ = ["COPY_TENSOR_OP", "copy_tensor"]

#: The op's registered name.
COPY_TENSOR_OP = "relax.vm.copy_tensor"

# Runtime function the op lowers to.  It is C++ (src/runtime/tensor.cc):
# it checks that both tensors hold the same number of bytes and copies through
# the device API, which honours each tensor's byte_offset, so a dst allocated by
# R.vm.alloc_tensor at a non-zero offset inside its storage is written in place.
_RUNTIME_COPY = "runtime.TVMTensorCopyFromTo"

# Set on the op when this module registered it, to tell our registration (on a
# re-import or reload) from a future TVM's own op.
_OWNER_ATTR = "rewrite_ext.registered"

_VOID = TupleType([])


def copy_tensor(src: relax.Expr, dst: relax.Expr) -> relax.Call:
    """Copy ``src`` into ``dst``: a Call of the op ``relax.vm.copy_tensor``.

    The call writes into ``dst`` (it is impure, so it belongs in a function
    declared ``pure=False``, outside dataflow blocks) and returns nothing
    (its type is ``R.Tuple()``).  Both tensors must hold the same number of
    bytes; shapes and dtypes may differ.

    Parameters
    ----------
    src : relax.Expr
        The tensor to read.
    dst : relax.Expr
        The tensor to write, typically ``R.vm.alloc_tensor(storage, offset,
        shape, dtype)``; a non-zero offset inside its storage is fine.

    Returns
    -------
    call : relax.Call
        The call, untyped until normalized (as for TVM's own op
        constructors); a BlockBuilder or the TVMScript parser types it
        ``R.Tuple()``.

    Examples
    --------
    In TVMScript, once ``rewrite_ext.ops`` is imported:

    .. code-block:: python

        @R.function(pure=False)
        def main(x: R.Tensor((4,), "float32")):
            s = R.vm.alloc_storage(R.shape([16]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
            a = R.vm.alloc_tensor(s, R.prim_value(0), R.shape([4]), R.dtype("float32"))
            R.vm.copy_tensor(x, a)
            return a

    From Python::

        bb.emit(copy_tensor(x, a))
    """
    return relax.Call(Op.get(COPY_TENSOR_OP), [src, dst])


def _infer_type(call: relax.Call, _builder: relax.BlockBuilder) -> relax.Type:
    # Reject at IR construction what the runtime copy would reject anyway, so a
    # wrong module fails where it is built, not when it runs.
    if len(call.args) != 2:
        raise ValueError(f"{COPY_TENSOR_OP} takes 2 arguments (src, dst), got {len(call.args)}")
    types = [ty(arg) for arg in call.args]
    for name, arg_type in zip(("src", "dst"), types):
        # R.Object: an opaque object may still be a tensor at run time.
        if not isinstance(arg_type, (TensorType, ObjectType)):
            raise TypeError(f"{COPY_TENSOR_OP}: {name} must be a tensor, got {arg_type}")
    if all(isinstance(arg_type, TensorType) for arg_type in types):
        src_bytes, dst_bytes = (static_nbytes(arg_type) for arg_type in types)
        if src_bytes is not None and dst_bytes is not None and src_bytes != dst_bytes:
            raise ValueError(
                f"{COPY_TENSOR_OP}: src holds {src_bytes} bytes ({types[0]}) but dst holds "
                f"{dst_bytes} bytes ({types[1]})"
            )
    return _VOID


def _lower(_builder: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    # Called by relax.transform.VMBuiltinLower (part of relax.build); a call of an
    # ExternFunc is a packed call, which both VM exec modes emit.
    return relax.Call(relax.ExternFunc(_RUNTIME_COPY), list(call.args), None, [_VOID], call.span)


def _register() -> None:
    """Register the op unless it exists; attach :func:`copy_tensor` as ``R.vm.copy_tensor``."""
    exists = COPY_TENSOR_OP in Op.list_op_names()
    ours = exists and Op.get(COPY_TENSOR_OP).has_attr(_OWNER_ATTR)
    if not exists:
        # register_op_attr creates the op on first use.  Attributes can be set
        # only once per level, hence the check above rather than re-setting them.
        tvm.ir.register_op_attr(COPY_TENSOR_OP, INFER_TYPE_ATTR, _infer_type)
        tvm.ir.register_op_attr(COPY_TENSOR_OP, "FPurity", False)
        tvm.ir.register_op_attr(COPY_TENSOR_OP, "FLowerBuiltin", _lower)
        op = Op.get(COPY_TENSOR_OP)
        op.set_num_inputs(2)
        op.add_argument("src", "Tensor", "The tensor to read.")
        op.add_argument("dst", "Tensor", "The tensor to write.")
        tvm.ir.register_op_attr(COPY_TENSOR_OP, _OWNER_ATTR, True)
        ours = True
    # TVMScript resolves R.vm.NAME on the module tvm.relax.op.vm.  Keep TVM's own
    # function if it has one; (re)attach ours otherwise, e.g. after a reload.
    if ours or not hasattr(_relax_vm, "copy_tensor"):
        _relax_vm.copy_tensor = copy_tensor


_register()
