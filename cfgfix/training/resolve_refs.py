"""A launch's values for the references its script makes (training/references.py): the
launch's own flag, else the argparse default; a key path in the config file that flag (or a
literal path) names. Every value keeps where it came from.
"""

from __future__ import annotations

import ast

from cfgfix.records import dataclass
from cfgfix.training.references import Ref, ScriptRefs

UNKNOWN = object()  # the launch sets it to something we cannot read (`--model $MODEL`)


@dataclass(frozen=True)
class Resolved:
    value: object  # a scalar, or a config `Node` for a mapping (`**cfg["training"]`)
    span: object  # Span | None
    origin: str
    doc: object = None  # the ConfigDocument holding a config value


class RefResolver:
    def __init__(self, project, launch, launch_file, script_path, refs: ScriptRefs) -> None:
        self.project = project
        self.launch = launch
        self.launch_file = launch_file
        self.script_path = script_path
        self.refs = refs

    def flag(self, dest: str):
        """The launch's value of the script's flag `dest` as Resolved, UNKNOWN, or None."""
        options = [o for o, d in self.refs.options.items() if d == dest] or [f"--{dest}"]
        args = list(self.launch.args)
        found = None
        for i, (text, span) in enumerate(args):
            for option in options:
                if text == option:
                    default = self.refs.defaults.get(dest)
                    if default is not None and default.node is None and default.options and isinstance(default.value, bool):
                        found = Resolved(not default.value, span, f"{text} in {self._launch_name()}")
                    elif i + 1 < len(args) and not args[i + 1][0].startswith("-"):
                        value, value_span = args[i + 1]
                        found = Resolved(value, value_span, f"{text} {value} in {self._launch_name()}")
                elif option.startswith("--") and text.startswith(option + "="):
                    found = Resolved(text[len(option) + 1:], span, f"{text} in {self._launch_name()}")
        if found is not None:  # the last occurrence wins, as argparse does
            return UNKNOWN if isinstance(found.value, str) and "$" in found.value else found
        default = self.refs.defaults.get(dest)
        if default is None or default.value is None:
            return None
        where = default.module or self.script_path
        span = self._span(where, default.node) if default.node is not None else None
        option = next((o for o in default.options if o.startswith("--")), default.options[0])
        shown = self.project.display(where) if where is not None else "the script"
        return Resolved(default.value, span, f"the default of {option} in {shown}")

    def unset(self, dest: str) -> bool:
        """The launch does not pass the script's flag `dest` (nor arguments hidden in a
        variable, `$EXTRA_ARGS`) and its argparse default is None: the value the script
        reads is None."""
        default = self.refs.defaults.get(dest)
        if default is None or default.value is not None or dest in self.refs.repeated:
            return False
        if default.node is not None and not (isinstance(default.node, ast.Constant) and default.node.value is None):
            return False  # computed (`default=os.environ.get(...)`): unknown
        if self.flag(dest) is not None:
            return False
        options = {o for o, d in self.refs.options.items() if d == dest} | {f"--{dest}"}
        previous = ""
        for text, _ in self.launch.args:
            if text.split("=", 1)[0] in options:
                return False
            if "$" in text and not text.startswith("-") and not previous.startswith("-"):
                return False  # `$EXTRA_ARGS`, `"$@"`: flags we cannot see
            previous = text
        for path in {self.script_path, default.module} - {None}:
            parsed = self.project.script(path)
            if parsed is None or _namespace_written(parsed[1], dest):
                return False  # `args.mixed_precision = cfg[...]`, `vars(args).update(cfg)`: set after parsing
        return True

    def resolve(self, ref: Ref):
        """Resolved, UNKNOWN or None for one reference."""
        if not ref.is_config:
            return self.flag(ref.flag)
        if ref.path is not None:
            written, how = ref.path, f"opened by {self._script_name()}"
        else:
            chosen = self.flag(ref.flag)
            if chosen is None or chosen is UNKNOWN or not isinstance(chosen.value, str):
                return chosen if chosen is UNKNOWN else None
            written, how = chosen.value, chosen.origin
        doc = self._config(written)
        if doc is None:
            return None
        node = doc.root
        for key in ref.keys:
            node = node.get(key) if node is not None and node.kind == "mapping" else None
        if node is None:
            return None
        where = ".".join(ref.keys) if ref.keys else "the whole file"
        value = node if node.kind != "scalar" else node.value
        return Resolved(value, doc.span(node), f"{where} in {doc.source.path} ({how})", doc)

    # -- helpers ------------------------------------------------------------------------------
    def _config(self, written: str):
        from cfgfix.project import _launch_folders, _resolve_in

        root = self.project.root
        bases = [*_launch_folders(self.launch_file, root), root]
        if self.script_path is not None:
            bases.append(self.script_path.parent)
        path = _resolve_in(written, bases)
        if path is None or path.suffix.lower() not in (".yaml", ".yml", ".json"):
            return None
        return self.project.read(path)

    def _launch_name(self) -> str:
        return self.project.display(self.launch_file)

    def _script_name(self) -> str:
        return self.project.display(self.script_path) if self.script_path is not None else "the script"

    def _span(self, path, node):
        parsed = self.project.script(path) if path is not None else None
        return parsed[0].span_of_node(node) if parsed is not None else None


def _namespace_written(tree: ast.Module, dest: str) -> bool:
    """The parsed namespace may be changed after parsing: `x.dest = ...`, `setattr(x, ...)`,
    `vars(x).update(...)`, `x.__dict__.update(...)` anywhere in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == dest:
            return True
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "setattr":
                return True
            if isinstance(func, ast.Attribute) and func.attr == "update":
                inner = func.value
                if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "vars") or (
                        isinstance(inner, ast.Attribute) and inner.attr == "__dict__"):
                    return True
    return False
