"""A Hydra application's composed config, as Hydra builds it for one launch.

`@hydra.main(config_path="../configs", config_name="train")` names the primary config; the
launch's words (`python train.py trainer=gpu experiment=big trainer.devices=4`) choose config
group options and set values. Read from hydra-core 1.3.2's released code
(`_internal/defaults_list.py`, `core/default_element.py`, `plugins/config_source.py`):

- a config's `defaults:` list is expanded depth first; `_self_` (the config's own keys) is
  merged where it stands, and at the end of the list when it is not written
  (`_validate_self`); entries are expanded last to first (`for d in reversed(defaults_list)`),
  so an `override /group: x` in a config listed later (an `experiment:`) decides a group listed
  earlier, and the first override registered wins: the command line's before any config's;
- `group: option` loads `<group>/<option>.yaml` into the package `<parent package>.<group>`;
  `- name` (no group) loads `<the containing config's group>/name.yaml` into the parent's
  package; `/group` is absolute; `group@pkg` puts it at `pkg`; `optional` skips a missing
  file; `null` selects nothing; a `# @package X` header (lines at the top) is relative to the
  parent's package, `_global_` making it absolute;
- on the command line, `key=value` is a group choice when `key` is a group (a folder of the
  config folder), else a value set after composition; `+` appends, `++` forces, `~` deletes;
- a file name without `.yaml` / `.yml` gets `.yaml`.

What is not read leaves the keys it may decide unknown (`UNKNOWN`): a `$VAR` or a sweep
(`a,b`) on the command line, an interpolated group choice, `--config-dir`, a search path, an
`${...}` value other than a plain absolute reference.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cfgfix.records import dataclass, field

UNKNOWN = object()
_GROUP_KEY = re.compile(r"^(?:(override)\s+)?(?:(optional)\s+)?([\w./-]+?)(?:@([\w.]+))?$")
_REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w]*(?:\.[\w]+)*)\}$")


@dataclass
class HydraMain:
    """`@hydra.main(...)` of a script: the primary config and the names the decorated
    function (and the module functions it hands the config to) hold it under."""

    config_path: str | None
    config_name: str | None
    names: set = field(default_factory=set)


@dataclass(frozen=True)
class Leaf:
    value: object
    origin: str
    span: object = None


@dataclass(frozen=True)
class HydraPath:
    """A key path into the composed config (`cfg.trainer.devices` -> ("trainer", "devices"))."""

    keys: tuple


def read_hydra_main(tree: ast.Module, imports) -> HydraMain | None:
    main = None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and (imports.qualify(decorator.func) or "") == "hydra.main":
                given = {kw.arg: kw.value for kw in decorator.keywords if kw.arg}
                for position, name in enumerate(("config_path", "config_name")):
                    if name not in given and len(decorator.args) > position:
                        given[name] = decorator.args[position]
                path, name = given.get("config_path"), given.get("config_name")
                if not all(v is None or isinstance(v, ast.Constant) and (v.value is None or isinstance(v.value, str))
                           for v in (path, name)):
                    return None  # a computed config path: which configs is not certain
                args = node.args.posonlyargs + node.args.args
                main = HydraMain(path.value if path is not None else None, name.value if name is not None else None,
                                 {args[0].arg} if args else set())
    if main is None:
        return None
    _follow_calls(tree, main.names)
    return main


def _follow_calls(tree: ast.Module, names: set) -> None:
    """`train(cfg)` with `def train(cfg: DictConfig)`: the parameter holds the config too."""
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for _ in range(3):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions):
                continue
            params = functions[node.func.id].args.posonlyargs + functions[node.func.id].args.args
            for position, arg in enumerate(node.args):
                if isinstance(arg, ast.Name) and arg.id in names and position < len(params):
                    names.add(params[position].arg)
            for kw in node.keywords:
                if kw.arg and isinstance(kw.value, ast.Name) and kw.value.id in names:
                    names.add(kw.arg)


def hydra_path(node: ast.expr, names: set) -> HydraPath | None:
    """`cfg.trainer`, `cfg["trainer"]`, `cfg.get("trainer")` -> HydraPath(("trainer",))."""
    keys: list[str] = []
    while True:
        if isinstance(node, ast.Name):
            return HydraPath(tuple(reversed(keys))) if node.id in names else None
        if isinstance(node, ast.Attribute):
            keys.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            keys.append(node.slice.value)
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            keys.append(node.args[0].value)
            node = node.func.value
        else:
            return None


class Composer:
    """One launch's composition. `read(path)` gives a config document (with spans) or None;
    `display(path)` the path as reports show it."""

    def __init__(self, read, display, config_dir: Path, args: list[tuple[str, object]]) -> None:
        self.read = read
        self.display = display
        self.config_dir = config_dir
        self.args = args
        self.choices: dict[str, object] = {}  # group override key -> option (None: null; UNKNOWN)
        self.appended: list[tuple[str, object, str | None]] = []  # +group=option
        self.values: list[tuple[str, str, object, object]] = []  # (mode, dotted key, value, span)
        self.unknown_packages: list[str] = []
        self.broken = False

    # -- the command line ------------------------------------------------------------------
    def read_args(self, config_name: str | None) -> str | None:
        """Sorts the launch's words into group choices and values; returns the primary
        config's name (`--config-name` beats the decorator's), None when it cannot be known."""
        words = self.args
        multirun = any(text in ("-m", "--multirun") for text, _ in words)
        i = 0
        while i < len(words):
            text, span = words[i]
            i += 1
            if text in ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir"):
                value = words[i][0] if i < len(words) else None
                i += 1
                if text in ("-cn", "--config-name") and value and "$" not in value:
                    config_name = value
                else:
                    return None
                continue
            if text.startswith(("--config-name=", "--config-path=", "--config-dir=")):
                option, value = text.split("=", 1)
                if option != "--config-name" or "$" in value:
                    return None
                config_name = value
                continue
            if text.startswith("-") or "=" not in text.lstrip("~"):
                if text.startswith(("$", '"$')):
                    return None  # `$OVERRIDES` / "$@": choices we cannot see
                continue
            self._override(text, span, multirun)
        return config_name

    def _override(self, text: str, span, multirun: bool) -> None:
        mode = "++" if text.startswith("++") else "+" if text.startswith("+") else "~" if text.startswith("~") else ""
        body = text[len(mode):]
        key, _, raw = body.partition("=")
        value = _parse_value(raw) if ("$" not in raw and not (multirun and _is_sweep(raw))) else UNKNOWN
        if key.startswith(("hydra.", "hydra/")) or key == "hydra":
            return
        group = key.split("@", 1)[0]
        if (self.config_dir / group).is_dir():
            if mode == "~":
                self.choices[key] = None
            elif mode == "+":
                self.appended.append((group, value, key.split("@", 1)[1] if "@" in key else None))
            else:
                self.choices[key] = value
            return
        self.values.append((mode, key, value, span))

    # -- the defaults tree -----------------------------------------------------------------
    def compose(self, config_name: str) -> dict | None:
        merged: dict = {}
        order = self._expand(config_name, "", None, "", optional=False, root=True)
        if order is None or self.broken:
            return None
        for path, package, doc in order:
            target = _at(merged, package)
            if target is None:
                continue
            _merge(target, _content(doc, doc.root, self.display(path), package))
        for package in self.unknown_packages:
            _mark_unknown(merged, package)
        for mode, dotted, value, span in self.values:
            keys = dotted.split(".")
            parent = _at(merged, ".".join(keys[:-1]))
            if parent is None:
                continue
            if mode == "~":
                parent.pop(keys[-1], None)
            elif keys[-1] in parent or mode in ("+", "++"):
                parent[keys[-1]] = Leaf(value, f"{dotted}= on the command line", span)
            else:
                parent[keys[-1]] = Leaf(UNKNOWN, f"{dotted}= on the command line (not in the config: Hydra refuses it)")
        return merged

    def _file(self, config_path: str) -> Path | None:
        name = config_path if config_path.endswith((".yaml", ".yml")) else config_path + ".yaml"
        path = (self.config_dir / name)
        return path if path.is_file() else None

    def _expand(self, config_path: str, parent_package: str, package: str | None, default: str, optional: bool,
                root: bool = False) -> list | None:
        """The (file, package, document) list of `config_path` and its defaults, in merge
        order. `package`: an explicit `@pkg`; else the file's header; else `default`."""
        path = self._file(config_path)
        doc = self.read(path) if path is not None else None
        if doc is None:
            if path is None and optional:
                return []
            if config_path.startswith("hydra/"):
                return []  # Hydra's own bundled options (hydra/job_logging: colorlog)
            self.broken = True  # Hydra stops: "Could not find '...'"
            return None
        header = _package_header(doc)
        own = package if package is not None else header if header is not None else default
        final = _final_package(parent_package, own)
        entries = _defaults(doc)
        if entries is None:
            self.broken = True
            return None
        if not entries and not (root and self.appended):
            return [(path, final, doc)]  # a leaf: its own keys only
        if not any(e[0] == "self" for e in entries):
            entries.append(("self",))
        if root:
            entries.extend(("group", group, value, pkg, False, False) for group, value, pkg in self.appended)
        base = config_path.rsplit("/", 1)[0] if "/" in config_path else ""
        for entry in entries:
            if entry[0] == "group" and entry[5]:  # override: first registered wins
                key = _group_path(entry[1], base) + (f"@{entry[3]}" if entry[3] else "")
                self.choices.setdefault(key, entry[2])
        children: list = []
        for entry in reversed(entries):
            if entry[0] == "self":
                children.append([(path, final, doc)])
                continue
            if entry[0] == "config":
                name = entry[1]
                child_path = name[1:] if name.startswith("/") else f"{base}/{name}" if base else name
                found = self._expand(child_path, final, None, _relative_group(name.lstrip("/")), optional=False)
                children.append(found or [])
                continue
            _, group, value, pkg, optional_entry, override = entry
            if override:
                continue
            group_path = _group_path(group, base)
            key = group_path + (f"@{pkg}" if pkg else "")
            if key in self.choices:
                value = self.choices[key]
            relative = group.lstrip("/").replace("/", ".")
            if value is UNKNOWN or isinstance(value, str) and "${" in value:
                self.unknown_packages.append(_final_package(final, pkg if pkg is not None else relative))
                children.append([])
                continue
            options = value if isinstance(value, list) else [value]
            found_all: list = []
            for option in options:
                if option is None:
                    continue
                found = self._expand(f"{group_path}/{option}", final, pkg, relative, optional=optional_entry)
                if found is None:
                    return None
                found_all.extend(found)
            children.append(found_all)
        order: list = []
        for child in reversed(children):
            order.extend(child)
        return order


def compose(read, display, config_dir: Path, config_name: str | None, args) -> dict | None:
    """The composed config of a launch (nested dicts of `Leaf`), or None when Hydra would
    stop (a missing config) or the primary config cannot be known."""
    composer = Composer(read, display, config_dir, list(args))
    name = composer.read_args(config_name)
    if not name or "$" in name:
        return None
    return composer.compose(name.removesuffix(".yaml"))


def lookup(composed: dict, keys: tuple):
    """The composed value at `keys`: a dict (a config node), a Leaf, UNKNOWN or None."""
    node = composed
    for key in keys:
        if node is UNKNOWN:
            return UNKNOWN
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def reference(value) -> tuple | None:
    """The key path of a whole-value `${a.b}` interpolation, else None."""
    match = _REFERENCE.match(value.strip()) if isinstance(value, str) else None
    return tuple(match.group(1).split(".")) if match is not None else None


def resolve_leaf(composed: dict, leaf: Leaf, depth: int = 0):
    """A leaf's value, a plain `${a.b}` reference followed; UNKNOWN for other interpolations."""
    value = leaf.value
    if isinstance(value, str) and "${" in value:
        match = _REFERENCE.match(value.strip())
        if match is None or depth > 5:
            return UNKNOWN
        target = lookup(composed, tuple(match.group(1).split(".")))
        return resolve_leaf(composed, target, depth + 1) if isinstance(target, Leaf) else UNKNOWN
    return value


# -- helpers -----------------------------------------------------------------------------------
def _defaults(doc) -> list | None:
    node = doc.root.get("defaults")
    if node is None:
        return []
    if node.kind != "sequence":
        return None
    entries: list = []
    for item in node.children:
        if item.kind == "scalar" and isinstance(item.value, str):
            entries.append(("self",) if item.value == "_self_" else ("config", item.value))
        elif item.kind == "mapping" and len(item.entries) == 1:
            key, value = item.entries[0]
            match = _GROUP_KEY.match(str(key.value).strip())
            if match is None:
                return None
            chosen = value.to_python()
            if not (chosen is None or isinstance(chosen, (str, list))):
                chosen = str(chosen)
            entries.append(("group", match.group(3), chosen, match.group(4), bool(match.group(2)), bool(match.group(1))))
        else:
            return None
    return entries


def _package_header(doc) -> str | None:
    for line in doc.source.text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not re.match(r"^#\s*@", line):
            break
        parts = line.lstrip("#").strip().split()
        if len(parts) == 2 and parts[0] == "@package":
            return parts[1]
    return None


def _relative_group(config_path: str) -> str:
    return config_path.rsplit("/", 1)[0].replace("/", ".") if "/" in config_path else ""


def _group_path(group: str, base: str) -> str:
    if group.startswith("/"):
        return group[1:]
    return f"{base}/{group}" if base else group


def _final_package(parent: str, package: str) -> str:
    found = package if parent == "" else parent if package == "" else f"{parent}.{package}"
    at = found.rfind("_global_")
    return found if at == -1 else found[at + len("_global_") + 1:]


def _content(doc, node, where: str, package: str) -> dict:
    out: dict = {}
    for key, value in node.entries:
        name = str(key.value)
        if node is doc.root and name == "defaults":
            continue
        dotted = f"{package}.{name}" if package else name
        out[name] = _content(doc, value, where, dotted) if value.kind == "mapping" else \
            Leaf(value.to_python(), f"{dotted} in {where}", doc.span(value))
    return out


def _merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _at(merged: dict, package: str) -> dict | None:
    node = merged
    for key in [k for k in package.split(".") if k]:
        child = node.get(key)
        if child is UNKNOWN:
            return None
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    return node


def _mark_unknown(merged: dict, package: str) -> None:
    keys = [k for k in package.split(".") if k]
    if not keys:
        merged.clear()
        merged["__unknown__"] = UNKNOWN
        return
    parent = _at(merged, ".".join(keys[:-1]))
    if parent is not None:
        parent[keys[-1]] = UNKNOWN


def _is_sweep(raw: str) -> bool:
    depth, quote = 0, None
    for char in raw:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return raw.startswith(("range(", "choice(", "interval(", "glob("))


def _parse_value(raw: str):
    """Hydra's override grammar for the primitives that matter here: null, booleans, numbers,
    quoted strings, lists; anything else is the string as written."""
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    if text.startswith("[") and text.endswith("]"):
        items = [part.strip() for part in text[1:-1].split(",") if part.strip()]
        return [_parse_value(part) for part in items]
    if text.startswith(("choice(", "range(", "interval(", "glob(", "shuffle(", "sort(", "tag(")):
        return UNKNOWN
    return text
