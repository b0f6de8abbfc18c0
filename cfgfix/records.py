"""`@dataclass` for cfgfix's own records: the same class as the standard library's
decorator makes, for the features cfgfix uses, built with one `exec` per class.

Why not `dataclasses`: on Python 3.11 it compiles every generated method on its own (six
`exec`s for a frozen class, ten with `order=True`) and imports `inspect`. A `cfgfix check`
defines 33 record classes before it reads a file: 18 ms of a 190 ms pre-commit run on five
trainer files (issue 15). Here only `__init__` is compiled (one `exec` per class); the other
methods are closures over the field names (`operator.attrgetter` builds the tuple that
dataclasses' generated methods compare and hash).

What it supports, with the standard library's behaviour (tests/test_records.py holds the
two side by side): fields from the class's annotations, in order (`ClassVar` ones are not
fields); defaults, `field(default=..., default_factory=..., compare=..., repr=...,
hash=...)`; `__init__` (calling `__post_init__` when the class has one), `__repr__`,
`__eq__`, `__hash__` (frozen classes hash their compared fields; other classes with `eq`
are unhashable), `frozen` (assignment raises `FrozenInstanceError`, an AttributeError),
`order`, `__match_args__`; `replace()`, `fields()` and `asdict()`. It refuses what it does
not support (a record subclassing a record, `InitVar`, keyword-only fields) rather than
build something else.
"""

from __future__ import annotations

import operator

__all__ = ["FrozenInstanceError", "Field", "asdict", "dataclass", "field", "fields", "replace"]

MISSING = type("MISSING", (), {"__repr__": lambda self: "MISSING"})()
_FACTORY = type("_FACTORY", (), {"__repr__": lambda self: "<factory>"})()
_FIELDS = "__record_fields__"


class FrozenInstanceError(AttributeError):
    """Assigning to a field of a frozen record."""


class Field:
    """One field: its name, default (or factory), and whether it is compared, hashed,
    shown in `repr` and taken by `__init__`."""

    __slots__ = ("name", "default", "default_factory", "compare", "repr", "hash", "init")

    def __init__(self, default=MISSING, default_factory=MISSING, compare=True, repr=True, hash=None, init=True):
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr
        self.hash = hash
        self.init = init

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, default_factory={self.default_factory!r})"


def field(*, default=MISSING, default_factory=MISSING, compare=True, repr=True, hash=None, init=True):
    """A field with options, as `dataclasses.field`."""
    return Field(default, default_factory, compare, repr, hash, init)


def dataclass(cls=None, /, *, frozen=False, order=False, eq=True, repr=True):
    """Make `cls` a record class (see the module's docstring)."""
    def wrap(cls):
        return _process(cls, frozen, order, eq, repr)

    return wrap if cls is None else wrap(cls)


def fields(obj) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order."""
    try:
        return getattr(obj, _FIELDS)
    except AttributeError:
        raise TypeError("must be called with a record class or instance") from None


def replace(obj, /, **changes):
    """A new record with `changes` applied, through `__init__` (so `__post_init__` runs)."""
    for f in fields(obj):
        if f.init and f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
        elif not f.init and f.name in changes:
            raise ValueError(f"field {f.name} is declared with init=False, it cannot be specified with replace()")
    return obj.__class__(**changes)


def asdict(obj):
    """The record as a dict, records, lists, tuples and dicts inside it converted too."""
    if hasattr(type(obj), _FIELDS):
        return {f.name: asdict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple keeps its type
        return type(obj)(*[asdict(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(asdict(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((asdict(k), asdict(v)) for k, v in obj.items())
    return obj


def _is_classvar(annotation) -> bool:
    if isinstance(annotation, str):  # `from __future__ import annotations`
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    import typing

    return annotation is typing.ClassVar or typing.get_origin(annotation) is typing.ClassVar


def _collect(cls) -> list[Field]:
    for base in cls.__mro__[1:]:
        if _FIELDS in base.__dict__:
            raise TypeError(f"{cls.__name__}: a record cannot subclass the record {base.__name__}")
    found = []
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        if isinstance(annotation, str) and annotation.startswith(("InitVar", "KW_ONLY", "dataclasses.")):
            raise TypeError(f"{cls.__name__}.{name}: {annotation} is not supported by cfgfix.records")
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name = name
        if isinstance(f.default, (list, dict, set)):
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory")
        if f.default is MISSING:
            if name in cls.__dict__:
                delattr(cls, name)  # a `field(default_factory=...)` leaves no class attribute
        else:
            setattr(cls, name, f.default)  # a plain default stays a class attribute, as in dataclasses
        found.append(f)
    return found


def _process(cls, frozen: bool, order: bool, eq: bool, repr_: bool):
    all_fields = _collect(cls)
    setattr(cls, _FIELDS, tuple(all_fields))
    names = {"_FACTORY": _FACTORY, "_setattr": object.__setattr__}  # what the compiled `__init__` reads
    lines = []
    # __init__: defaults are bound names in the generated scope (`_d_x`), factories are
    # called when the argument was left out.
    params, body = ["self"], []
    seen_default = False
    for f in all_fields:
        if not f.init:
            if f.default_factory is not MISSING:
                names[f"_f_{f.name}"] = f.default_factory
                value = f"_f_{f.name}()"
            elif f.default is not MISSING:
                names[f"_d_{f.name}"] = f.default
                value = f"_d_{f.name}"
            else:
                continue
        else:
            if f.default_factory is not MISSING:
                names[f"_f_{f.name}"] = f.default_factory
                params.append(f"{f.name}=_FACTORY")
                value = f"_f_{f.name}() if {f.name} is _FACTORY else {f.name}"
                seen_default = True
            elif f.default is not MISSING:
                names[f"_d_{f.name}"] = f.default
                params.append(f"{f.name}=_d_{f.name}")
                value = f.name
                seen_default = True
            else:
                if seen_default:
                    raise TypeError(f"non-default argument {f.name!r} follows default argument")
                params.append(f.name)
                value = f.name
        body.append(f"_setattr(self, {f.name!r}, {value})" if frozen else f"self.{f.name} = {value}")
    if "__post_init__" in cls.__dict__:
        body.append("self.__post_init__()")
    lines.append(f"def __init__({', '.join(params)}):")
    lines += [f"    {line}" for line in body or ["pass"]]
    namespace: dict = {}
    exec("\n".join(lines), names, namespace)  # noqa: S102 - the text is built above from field names
    # The other methods are closures over the field names: only `__init__` is compiled
    # (each compiled function costs ~0.05 ms; a class's six were most of its cost).
    shown = tuple(f.name for f in all_fields if f.repr)
    compared = tuple(f.name for f in all_fields if f.compare)
    if repr_:
        namespace["__repr__"] = _repr(shown)
    if eq:
        namespace["__eq__"] = _compare(_key(compared), operator.eq)
    if order:
        if not eq:
            raise ValueError("eq must be true if order is true")
        key = _key(compared)
        for method in ("__lt__", "__le__", "__gt__", "__ge__"):
            namespace[method] = _compare(key, getattr(operator, method.strip("_")))
    if eq and frozen:
        hashed = _key(tuple(f.name for f in all_fields if (f.compare if f.hash is None else f.hash)))
        namespace["__hash__"] = lambda self: hash(hashed(self))
    if frozen:
        namespace["__setattr__"], namespace["__delattr__"] = _frozen(cls, frozenset(f.name for f in all_fields))
    # What the class defines itself wins, as in dataclasses; a `__hash__` it defines counts
    # (the `None` that defining `__eq__` leaves in the class does not).
    own_hash = "__hash__" in cls.__dict__ and not (cls.__dict__["__hash__"] is None and "__eq__" in cls.__dict__)
    for name, function in namespace.items():
        if name in cls.__dict__ and (name != "__hash__" or own_hash):
            if name in ("__lt__", "__le__", "__gt__", "__ge__", "__setattr__", "__delattr__"):
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
            continue
        function.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, function)
    if eq and not frozen and not own_hash:
        cls.__hash__ = None  # mutable and compared by value: unhashable, as in dataclasses
    cls.__match_args__ = tuple(f.name for f in all_fields if f.init)
    return cls


def _key(names: tuple[str, ...]):
    """The tuple of a record's `names`, as the generated methods of dataclasses compare
    and hash it (`attrgetter` of one name returns the value itself, not a 1-tuple)."""
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda obj: (one(obj),)
    if not names:
        return lambda obj: ()
    return operator.attrgetter(*names)


def _compare(key, op):
    def method(self, other):
        if other.__class__ is self.__class__:
            return op(key(self), key(other))
        return NotImplemented

    return method


def _repr(names: tuple[str, ...]):
    def __repr__(self):
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _frozen(cls, names: frozenset):
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__
