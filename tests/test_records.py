"""cfgfix.records builds the classes the standard library's `dataclasses` builds, for the
features cfgfix uses: each test defines one class body under both decorators and checks
that the two behave alike."""

from __future__ import annotations

import dataclasses
import pickle
from typing import ClassVar

import pytest

from cfgfix import records


def both(body, **options):
    """The class `body(decorator, field)` defines, once per implementation."""
    return [body(lib.dataclass(**options), lib.field) for lib in (dataclasses, records)]


def point(decorate, field):
    @decorate
    class Point:
        """A point."""

        x: int
        y: int = 0
        tags: list = field(default_factory=list)
        note: str = field(default="", compare=False)
        secret: str = field(default="s", repr=False)
        kind: ClassVar[str] = "point"

    return Point


@pytest.mark.parametrize("options", [{}, {"frozen": True}, {"frozen": True, "order": True}])
def test_init_repr_and_equality_match_dataclasses(options):
    std, own = both(point, **options)
    for cls in (std, own):
        a, b = cls(1, 2), cls(1, y=2, note="other")
        assert a == b and not (a != b)
        assert a != cls(2, 2) and a != (1, 2)
        assert a.tags == [] and a.tags is not cls(1).tags  # a new list per instance
        assert cls.kind == "point" and cls.y == 0
        with pytest.raises(TypeError):
            cls()
    assert repr(std(1, 2, ["a"])).replace(std.__qualname__, "P") == repr(own(1, 2, ["a"])).replace(own.__qualname__, "P")
    assert std.__match_args__ == own.__match_args__ == ("x", "y", "tags", "note", "secret")
    assert own.__doc__ == "A point."


def test_frozen_records_hash_their_compared_fields_and_refuse_assignment():
    std, own = both(lambda d, f: d(type("Key", (), {"__annotations__": {"a": "int", "b": "str"},
                                                    "b": f(default="x", compare=False)})), frozen=True)
    for cls in (std, own):
        key = cls(1)
        assert hash(key) == hash(cls(1, "other")) == hash((1,))
        assert {key: 1}[cls(1, "y")] == 1
        with pytest.raises(AttributeError):
            key.a = 2
        with pytest.raises(AttributeError):
            del key.a
    with pytest.raises(records.FrozenInstanceError):
        own(1).a = 2


def test_mutable_records_are_unhashable():
    std, own = both(point)
    for cls in (std, own):
        with pytest.raises(TypeError):
            hash(cls(1))
        p = cls(1)
        p.x = 5
        assert p.x == 5


def test_order_compares_fields_in_order():
    std, own = both(point, frozen=True, order=True)
    for cls in (std, own):
        assert sorted([cls(2, 1), cls(1, 5), cls(1, 2)]) == [cls(1, 2), cls(1, 5), cls(2, 1)]
        with pytest.raises(TypeError):
            _ = cls(1) < (1,)


def test_replace_runs_init_again():
    @records.dataclass
    class Text:
        text: str
        lines: int = records.field(default=0, init=False)

        def __post_init__(self):
            self.lines = self.text.count("\n")

    t = records.replace(Text("a\nb\n"), text="a\n")
    assert (t.text, t.lines) == ("a\n", 1)
    with pytest.raises(ValueError):
        records.replace(t, lines=3)
    assert [f.name for f in records.fields(t)] == ["text", "lines"]
    with pytest.raises(TypeError):
        records.fields(object())


def test_what_the_class_defines_itself_wins():
    @records.dataclass(frozen=True)
    class Named:
        name: str

        def __repr__(self):
            return f"<{self.name}>"

    assert repr(Named("a")) == "<a>"
    assert Named("a") == Named("a") and hash(Named("a")) == hash(("a",))


def test_refuses_what_dataclasses_refuses():
    with pytest.raises(ValueError):
        records.dataclass(type("A", (), {"__annotations__": {"a": "list"}, "a": []}))
    with pytest.raises(TypeError):
        records.dataclass(type("B", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 1}))
    base = records.dataclass(type("C", (), {"__annotations__": {"a": "int"}}))
    with pytest.raises(TypeError):
        records.dataclass(type("D", (base,), {"__annotations__": {"b": "int"}}))


def test_records_pickle_and_convert_to_dicts():
    own = point(records.dataclass(frozen=True), records.field)
    globals()["Point"] = own  # pickle finds the class by its module and name
    own.__qualname__ = "Point"
    try:
        p = own(1, 2, ["t"])
        assert pickle.loads(pickle.dumps(p)) == p
    finally:
        del globals()["Point"]
    assert records.asdict(p) == {"x": 1, "y": 2, "tags": ["t"], "note": "", "secret": "s"}


def test_the_check_path_does_not_import_dataclasses(tmp_path):
    """The point of the module (issue 15): a pre-commit run on named training files
    defines its records without the standard library's dataclasses (and the `inspect` it
    imports). (pathspec, which reads a project's .gitignore, imports them itself.)"""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "flan-t5-xl-trainer" / "project"
    shutil.copy(fixture / "train.py", tmp_path / "train.py")
    script = ("import sys\nfrom cfgfix.cli import main\ntry:\n    main(['check', '--no-cache', 'train.py'])\n"
              "finally:\n    print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert "CFX" in done.stdout, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
