"""Reading and writing IRModules as files: TVMScript read as text, and TVM's JSON.

A TVMScript file is never run.  Python's ``ast`` finds its top-level
``@I.ir_module`` classes (and ``@R.function`` / ``@T.prim_func`` functions)
without executing anything, and TVM's TVMScript parser reads the source of
the one asked for.  Of the module-level statements only three forms are
understood, and none is executed: ``from tvm.script import relax as R`` style
imports (they name the aliases), ``n = TypeVar("n")`` (a symbolic shape var,
as ``IRModule.script()`` prints them) and ``metadata = tvm.ir.load_json("...")``
with a string literal (constants, as ``script(show_meta=True)`` prints them).

TVM's parser still evaluates the expressions *inside* the decorated class:
annotations, call arguments and decorator arguments go through Python's
``eval`` against a namespace holding only the TVMScript modules (``I``, ``R``,
``T``, ...).  Python's builtins are removed from that namespace, so
``__import__`` or ``open`` fail to parse; it is not a sandbox (attribute
access on TVM objects is still Python), so do not feed it untrusted files.

JSON is ``tvm.ir.save_json`` / ``tvm.ir.load_json``: no parser, no
evaluation, and far faster on large modules (TVM's TVMScript parser takes
minutes from ~10k bindings on).
"""

from __future__ import annotations

import ast
import enum
import gc
import importlib.metadata
import os
import re
import sys
import traceback
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tvm

from . import ops  # noqa: F401 - registers relax.vm.copy_tensor, which files may hold

__all__ = [
    "FileFormat",
    "ModuleFileError",
    "ModuleSource",
    "format_of",
    "module_text",
    "parse_tvmscript",
    "read_module",
    "tvmscript_modules",
    "write_module",
]


class ModuleFileError(Exception):
    """A module file that cannot be read or written; the message is one line."""


class FileFormat(enum.Enum):
    """How an IRModule is stored in a file."""

    TVMSCRIPT = "tvmscript"
    """TVMScript text, as ``IRModule.script()`` prints it (imports optional)."""
    JSON = "json"
    """``tvm.ir.save_json`` output."""


def format_of(path: str | os.PathLike[str], given: FileFormat | None = None) -> FileFormat:
    """The format of ``path``: ``given`` if set, else JSON for ``.json`` and TVMScript otherwise."""
    if given is not None:
        return given
    return FileFormat.JSON if Path(path).suffix.lower() == ".json" else FileFormat.TVMSCRIPT


# -- TVMScript read as text ----------------------------------------------------------------

# What `from tvm.script import X as Y` binds Y to; these are the modules whose names printed
# TVMScript uses, and the only ones a file can bring into the parser's namespace.
_SCRIPT_MODULES = {"ir": "ir", "relax": "relax", "tir": "tirx", "tirx": "tirx"}
_MODULE_DECORATORS = {"ir_module"}
_FUNCTION_DECORATORS = {"function", "prim_func"}


@dataclass(frozen=True)
class ModuleSource:
    """One module a TVMScript file defines, found without running the file."""

    name: str
    """The class (or function) name."""
    line: int
    """The line of its first decorator, 1-based."""
    text: str
    """The file's text with every line outside the definition blanked, so TVM's parser
    reports errors at the file's own line numbers."""
    is_function: bool
    """A top-level ``@R.function`` / ``@T.prim_func``: it becomes a module holding just it."""


def _decorator_name(node: ast.expr) -> str | None:
    """``ir_module`` for ``@I.ir_module``, ``@I.ir_module(...)`` or ``@ir_module``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _parse_python(text: str, path: str) -> ast.Module:
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise ModuleFileError(f"{path}:{exc.lineno}: does not parse as TVMScript: {exc.msg}") from None


def tvmscript_modules(text: str, path: str) -> list[ModuleSource]:
    """The modules a TVMScript file defines, in file order, found by reading it with ``ast``.

    Parameters
    ----------
    text : str
        The file's contents.
    path : str
        The file's name, for messages.

    Returns
    -------
    modules : list[ModuleSource]
        Each top-level class whose last decorator is ``ir_module``; if there is none,
        each top-level function decorated ``function`` or ``prim_func``.

    Raises
    ------
    ModuleFileError
        The file is not Python syntax.
    """
    return _definitions(_parse_python(text, path), text)


def _definitions(tree: ast.Module, text: str) -> list[ModuleSource]:
    lines = text.splitlines(keepends=True)
    classes, functions = [], []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef | ast.FunctionDef) or not node.decorator_list:
            continue
        decorator = _decorator_name(node.decorator_list[-1])
        is_function = isinstance(node, ast.FunctionDef)
        if decorator not in (_FUNCTION_DECORATORS if is_function else _MODULE_DECORATORS):
            continue
        start = node.decorator_list[0].lineno
        end = node.end_lineno or node.lineno
        blanked = "\n" * (start - 1) + "".join(lines[start - 1 : end])
        (functions if is_function else classes).append(ModuleSource(node.name, start, blanked, is_function))
    return classes or functions


def _script_namespace(tree: ast.Module, path: str) -> dict[str, typing.Any]:
    """The names TVM's parser evaluates the definitions against; the file's imports rename them."""
    import tvm.script

    namespace: dict[str, typing.Any] = {}
    try:
        # TVM's own default namespace (I, R, T, Axis, TypeVar, ...), the one tvm.script uses.
        from tvm.script.parser.core.entry import _default_globals

        namespace.update(_default_globals())
    except ImportError:  # pragma: no cover - another TVM layout
        namespace.update({"I": tvm.script.ir, "R": tvm.script.relax, "T": tvm.script.tirx})
    # `tvm` only when the file imports it: its reach (global functions, the FFI) is wide.
    namespace.pop("tvm", None)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "tvm.script":
            for alias in node.names:
                if alias.name in _SCRIPT_MODULES:
                    namespace[alias.asname or alias.name] = getattr(tvm.script, _SCRIPT_MODULES[alias.name])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tvm":
                    namespace[alias.asname or "tvm"] = tvm
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _declared_value(node.value, path)
            if value is not None:
                namespace[node.targets[0].id] = value
    # Without builtins, eval() inside the parser cannot reach __import__, open, exec, ...
    namespace["__builtins__"] = {}
    return namespace


def _declared_value(node: ast.expr, path: str) -> object | None:
    """``TypeVar("n")`` and ``tvm.ir.load_json("...")`` with a literal, else None."""
    if not (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords):
        return None
    arg = node.args[0]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    callee = ast.unparse(node.func)
    if callee in ("TypeVar", "typing.TypeVar"):
        return typing.TypeVar(arg.value)  # type: ignore[misc] - a name only known at run time
    if callee == "tvm.ir.load_json":
        try:
            return tvm.ir.load_json(arg.value)
        except Exception as exc:  # noqa: BLE001 - a damaged metadata section
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ModuleFileError(f"{path}:{node.lineno}: the metadata is not TVM JSON: {first}") from None
    return None


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: TVM's C++ logs there, bypassing sys.stderr."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 to save
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_LOCATION = re.compile(r"-->\s*<str>:(\d+):(\d+)")


def _parse_error(exc: BaseException, path: str) -> str:
    """``path:line:col: does not parse as TVMScript: <TVM's first complaint>``."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    first = first.removeprefix("error: ")
    where = _LOCATION.search(text)
    place = f"{path}:{where.group(1)}:{where.group(2)}" if where else path
    return f"{place}: does not parse as TVMScript: {first}"


def parse_tvmscript(source: ModuleSource, namespace: dict[str, typing.Any], path: str) -> tvm.IRModule:
    """Parse one definition with TVM's TVMScript parser; a function becomes a one-function module."""
    from tvm.script import from_source

    try:
        parsed = from_source(source.text, extra_vars=dict(namespace))
    except Exception as exc:  # noqa: BLE001 - anything the parser raises is about the input
        message = _parse_error(exc, path)
        # Dropping the parser's frames destroys its BlockBuilder, whose C++ destructor logs
        # "BlockBuilder destroyed with remaining blocks!" to fd 2: not news for the user.
        with _native_stderr_silenced():
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
            del exc
            gc.collect()
        raise ModuleFileError(message) from None
    if isinstance(parsed, tvm.IRModule):
        return parsed
    if isinstance(parsed, tvm.relax.Function | tvm.tirx.PrimFunc):
        return tvm.IRModule({source.name: parsed})
    raise ModuleFileError(f"{path}:{source.line}: {source.name} is a {type(parsed).__name__}, not an IRModule")


def _read_tvmscript(text: str, path: str, name: str | None) -> tuple[str, tvm.IRModule]:
    tree = _parse_python(text, path)
    sources = _definitions(tree, text)
    if not sources:
        raise ModuleFileError(
            f"{path} defines no IRModule in TVMScript (expected `@I.ir_module class Module: ...`;"
            " a module built in Python can be saved with tvm.ir.save_json and read as JSON)"
        )
    names = ", ".join(source.name for source in sources)
    if name is not None:
        chosen = [source for source in sources if source.name == name]
        if not chosen:
            raise ModuleFileError(f"{path} has no module named {name!r}; it holds: {names}")
        source = chosen[0]
    elif len(sources) > 1:
        kind = "functions" if sources[0].is_function else "IRModules"
        raise ModuleFileError(f"{path} holds {len(sources)} {kind} ({names}): choose one with --module NAME")
    else:
        source = sources[0]
    return source.name, parse_tvmscript(source, _script_namespace(tree, path), path)


# tvm.ir.save_json ends its text with the TVM version that wrote it.
_WRITTEN_BY = re.compile(r'"metadata"\s*:\s*\{\s*"tvm_version"\s*:\s*"([^"]+)"\s*\}\s*\}\s*$')


def _load_json(text: str) -> object:
    """``tvm.ir.load_json``, without its upgrade step for JSON this TVM version wrote.

    ``tvm.ir.load_json`` first rewrites the JSON for older schemas in Python
    (``json.loads``, a loop over every node, ``json.dumps(indent=2)``): 20 of the 22 s
    it takes on a 50k-binding module.  JSON written by the running TVM needs none of it.
    """
    written_by = _WRITTEN_BY.search(text[-512:])
    if written_by and written_by.group(1) == tvm.__version__:
        from tvm_ffi.serialization import from_json_graph_str

        return from_json_graph_str(text)
    return tvm.ir.load_json(text)


def _read_json(text: str, path: str, name: str | None) -> tuple[str, tvm.IRModule]:
    if name is not None:
        raise ModuleFileError(f"{path} is JSON, which holds one module: drop --module {name}")
    try:
        loaded = _load_json(text)
    except Exception as exc:  # noqa: BLE001 - a malformed file
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ModuleFileError(f"{path} is not TVM JSON (tvm.ir.save_json output): {first}") from None
    if isinstance(loaded, tvm.relax.Function | tvm.tirx.PrimFunc):
        return "main", tvm.IRModule({"main": loaded})
    if not isinstance(loaded, tvm.IRModule):
        raise ModuleFileError(f"{path} holds a {type(loaded).__name__}, not an IRModule")
    return Path(path).stem, loaded


def read_module(
    path: str, file_format: FileFormat | None = None, name: str | None = None
) -> tuple[str, tvm.IRModule]:
    """The IRModule stored in ``path``, and its name.

    Parameters
    ----------
    path : str
        A TVMScript or JSON file.
    file_format : Optional[FileFormat]
        The format; by default chosen by the extension (``.json`` is JSON).
    name : Optional[str]
        Which module of a TVMScript file holding several; required then.

    Returns
    -------
    name, module : tuple[str, tvm.IRModule]

    Raises
    ------
    ModuleFileError
        A missing or unreadable file, no module or an ambiguous choice, or a parse error
        (``path:line:col: does not parse as TVMScript: ...``).
    """
    file = Path(path)
    if not file.is_file():
        raise ModuleFileError(f"no such file: {path}")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModuleFileError(f"cannot read {path}: {exc}") from None
    if format_of(path, file_format) is FileFormat.JSON:
        return _read_json(text, path, name)
    return _read_tvmscript(text, path, name)


# -- writing -------------------------------------------------------------------------------

# apache-tvm-ffi 0.1.15.post2 segfaults in ToJSONGraph on any Relax module (TVM 0.26 and 0.27);
# 0.1.14.post0 round-trips.  pyproject pins the working pair; this turns the crash of an
# unpinned install into a message.
_BROKEN_FFI_FOR_JSON = ("0.1.15",)


def _check_json_writable() -> None:
    try:
        version = importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source build of TVM
        return
    if version.startswith(_BROKEN_FFI_FOR_JSON):
        raise ModuleFileError(
            f"tvm.ir.save_json crashes with apache-tvm-ffi {version}; "
            "install the pair rewrite_ext pins: pip install 'apache-tvm-ffi<0.1.15'"
        )


def module_text(mod: tvm.IRModule, file_format: FileFormat) -> str:
    """``mod`` as TVMScript (constants included, so it parses back) or as JSON."""
    if file_format is FileFormat.JSON:
        _check_json_writable()
        return tvm.ir.save_json(mod)
    return mod.script(show_meta=True)


def write_module(mod: tvm.IRModule, path: str, file_format: FileFormat | None = None) -> None:
    """Write ``mod`` to ``path`` in ``file_format`` (default: by extension, as for reading)."""
    text = module_text(mod, format_of(path, file_format))
    try:
        Path(path).write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    except OSError as exc:
        raise ModuleFileError(f"cannot write {path}: {exc.strerror or exc}") from None
