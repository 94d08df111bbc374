"""The exception type rewrite_ext raises, and how exceptions cross TVM's C++."""

from __future__ import annotations

import threading

import tvm_ffi

__all__ = ["RewriteError"]


@tvm_ffi.register_error("rewrite_ext.RewriteError")
class RewriteError(Exception):
    """A rewrite could not be carried out.

    Raised when a rewriter raises, returns something that is not a
    ``relax.Expr``, emits bindings and then returns None, opens or closes a
    frame of the builder, returns a void value for a binding whose var is
    used later, puts an impure call where only pure ones may stand, or
    keeps matching after ``max_iterations``; and when the rewritten IR is
    not well formed.  The message names the function, the binding var and
    the pattern.

    The class is registered with TVM's FFI error registry, so it keeps its
    type and message when it crosses TVM's C++ (a Pass run by
    ``tvm.transform.Sequential``, a callback invoked from C++).
    """


# A KeyboardInterrupt or SystemExit raised in a rewriter leaves through TVM's C++ (from an If
# branch, from a pass run by Sequential), and tvm_ffi turns any exception type it does not
# know into RuntimeError.  Registered, each keeps its type; the object itself, remembered on
# its way into C++, is what comes back out (SystemExit's code would otherwise come back as text).
_in_flight = threading.local()


def remember(exc: BaseException) -> None:
    """Note ``exc``, about to cross TVM's C++, so that the very object comes back out."""
    if not isinstance(exc, Exception):
        _in_flight.exc = exc


def _restorer(base: type[BaseException]) -> type[BaseException]:
    class Restored(base):  # type: ignore[misc, valid-type]
        def __new__(cls, *args: object) -> BaseException:  # type: ignore[misc]
            exc = getattr(_in_flight, "exc", None)
            if isinstance(exc, base):
                _in_flight.exc = None
                return exc
            return base(*args)

    Restored.__name__ = Restored.__qualname__ = base.__name__
    return Restored


for _base in (KeyboardInterrupt, SystemExit):
    tvm_ffi.register_error(_base.__name__, _base)  # the type's name on the way into C++ ...
    tvm_ffi.register_error(_base.__name__, _restorer(_base))  # ... the object on the way out
