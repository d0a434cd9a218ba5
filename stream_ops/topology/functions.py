"""References to user functions that worker processes can import.

Workers never receive pickled code: the plan names every function as ``module:qualname`` and
the worker imports it from the submitted code archive. A function that cannot be found that
way (a lambda, a closure, something defined in ``__main__``) is rejected at definition time.

At definition time references resolve as plain imports. In a worker they are bound to the
verified archive of their submission (a :class:`~stream_ops.topology.code_scope.CodeScope`):
they may name only a module of that archive or stream_ops, no dunder attribute on the way,
and the object found must be defined there too; the module is imported from that archive
alone (:mod:`stream_ops.topology.isolation`). ``subprocess:Popen``, ``os:system`` or
``userpkg.ops:os.system`` are refused with a :class:`~stream_ops.errors.TopologyLoadError`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable
from typing import Any

from stream_ops.errors import TopologyDefinitionError, TopologyLoadError
from stream_ops.topology.code_scope import CODE_KEY, CodeScope
from stream_ops.topology.isolation import import_in_scope


def function_ref(fn: Callable[..., Any], *, what: str) -> str:
    """The ``module:qualname`` of ``fn``, after checking a worker could import it.

    Args:
        fn: the user function.
        what: how the caller names it in error messages (e.g. "each() on stream 'sentences'").

    Raises:
        TopologyDefinitionError: ``fn`` is not a module-level function importable by workers.
    """
    if not callable(fn):
        raise TopologyDefinitionError(f"{what}: expected a function, got {type(fn).__name__}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module is None or qualname is None:
        raise TopologyDefinitionError(f"{what}: {fn!r} has no module/qualname; define it with 'def' at module level")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TopologyDefinitionError(
            f"{what}: {module}.{qualname} is a lambda or nested function, which worker processes cannot "
            "import; define it with 'def' at the top level of a module in your package"
        )
    if module == "__main__":
        raise TopologyDefinitionError(
            f"{what}: {qualname} is defined in __main__, which worker processes cannot import; "
            "move it into a module of your package"
        )
    ref = f"{module}:{qualname}"
    try:
        found = resolve_function(ref)
    except TopologyLoadError as e:
        raise TopologyDefinitionError(f"{what}: {e}") from e
    if found is not fn and getattr(found, "__wrapped__", None) is not fn:
        raise TopologyDefinitionError(
            f"{what}: importing {ref} gives a different object than the function passed; pass the module-level function itself"
        )
    return ref


def resolve_function(ref: str, *, scope: CodeScope | None = None) -> Callable[..., Any]:
    """Import ``module:qualname`` and return the object.

    Args:
        ref: the reference.
        scope: the verified code archive a plan's reference is bound to; None at definition
            time (a plain import).

    Raises:
        TopologyLoadError: the module or attribute does not exist, or (with ``scope``) the
            reference leaves the archive and stream_ops.

    Example:
        >>> resolve_function("stream_ops.examples.wordcount:split").__name__
        'split'
    """
    module_name, sep, qualname = ref.partition(":")
    if not sep or not module_name or not qualname:
        raise TopologyLoadError(f"{ref!r} is not an import string of the form 'pkg.module:name'")
    if scope is not None:
        _check_in_scope(ref, module_name, qualname, scope)
    try:
        obj: Any = importlib.import_module(module_name) if scope is None else import_in_scope(module_name, scope)
    except ImportError as e:
        raise TopologyLoadError(f"cannot import module {module_name!r} for {ref!r}: {e}") from e
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise TopologyLoadError(f"module {module_name!r} has no attribute {qualname!r}") from e
    if scope is not None:
        defined_in = getattr(obj, "__module__", None)
        if not isinstance(defined_in, str) or not scope.allows(defined_in):
            raise TopologyLoadError(
                f"{ref!r} is {obj!r}, defined in {defined_in!r}, outside the submitted code archive and stream_ops; "
                "workers run only submitted code: reference a function defined in your own package"
            )
    return obj


def _check_in_scope(ref: str, module_name: str, qualname: str, scope: CodeScope) -> None:
    if not scope.allows(module_name):
        raise TopologyLoadError(
            f"{ref!r} names module {module_name!r}, which is neither in the submitted code archive "
            f"(modules {list(scope.modules)}) nor stream_ops; workers run only submitted code: reference a function "
            "of your own package"
        )
    if any(part.startswith("__") for part in qualname.split(".")):
        raise TopologyLoadError(f"{ref!r} goes through a dunder attribute; reference a module-level function or class")


def object_ref(obj: Any, *, what: str) -> dict[str, Any]:
    """A plan reference to a class, a stateless instance or a module-level dataclass instance.

    Returns ``{"class": "module:qualname", "args": {...} | None}``; workers rebuild it with
    :func:`resolve_object`.

    Raises:
        TopologyDefinitionError: ``obj`` cannot be rebuilt by a worker process.
    """
    if isinstance(obj, type):
        return {"class": function_ref(obj, what=what), "args": None}
    cls = type(obj)
    if not dataclasses.is_dataclass(obj):
        if not getattr(obj, "__dict__", None):  # a stateless instance: rebuilt as cls()
            return {"class": function_ref(cls, what=what), "args": None}
        raise TopologyDefinitionError(
            f"{what}: {cls.__name__} instance has attributes {sorted(vars(obj))}; pass a class, a stateless "
            "instance or an instance of a dataclass (its fields travel as JSON)"
        )
    args = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    try:
        json.dumps(args)
    except TypeError as e:
        raise TopologyDefinitionError(f"{what}: the fields of {cls.__name__} must be JSON values: {e}") from e
    return {"class": function_ref(cls, what=what), "args": args}


def resolve_object(ref: dict[str, Any]) -> Any:
    """Rebuild the object of :func:`object_ref`: a new instance of the class.

    A reference bound by a worker (it carries ``"code"``) resolves in that archive only and
    must name a class.

    Raises:
        TopologyLoadError: the class cannot be resolved (see :func:`resolve_function`).
    """
    bound = ref.get(CODE_KEY)
    scope = CodeScope.model_validate(bound) if bound is not None else None
    cls = resolve_function(ref["class"], scope=scope)
    if scope is not None and not isinstance(cls, type):
        raise TopologyLoadError(f"{ref['class']!r} is not a class; a plan's object references name classes")
    args = ref.get("args")
    return cls(**args) if args else cls()
