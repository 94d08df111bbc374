"""The one exception type rewrite_ext raises."""

from __future__ import annotations

import tvm_ffi

__all__ = ["RewriteError"]


@tvm_ffi.register_error("rewrite_ext.RewriteError")
class RewriteError(Exception):
    """A rewrite could not be carried out.

    Raised when a rewriter raises, returns something that is not a
    ``relax.Expr``, emits bindings and then declines, returns a void value
    for a binding whose var is used later, puts an impure call where only
    pure ones may stand, or keeps matching after ``max_iterations``; and
    when the rewritten IR is not well formed.  The message names the
    function, the binding var and the pattern.

    The class is registered with TVM's FFI error registry, so it keeps its
    type and message when it crosses TVM's C++ (a Pass run by
    ``tvm.transform.Sequential``, a callback invoked from C++).
    """
