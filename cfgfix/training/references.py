"""Values a training script takes from its own command line and its own config file.

Real scripts rarely write `TrainingArguments(bf16=True)`; they write

    parser.add_argument("--model", default="Qwen/Qwen2.5-7B")
    parser.add_argument("--config", default="configs/train.yaml")
    args = parser.parse_args()
    cfg = yaml.safe_load(open(args.config))
    tcfg = cfg["training"]
    model = AutoModelForCausalLM.from_pretrained(cfg["model"]["pretrained"])
    TrainingArguments(bf16=tcfg["bf16"], **cfg["trainer"])

Each such expression is a `Ref`: an argparse flag (`args.model`), or a key path in a config
file the script loads (`cfg["model"]["pretrained"]`, the file being `--config`'s value or its
default, or a literal path). The script is read once (`ScriptRefs`); each launch resolves the
references against its own flags and files (training/resolve.py), so two launches of one
script with different `--config` files get different values, each with its origin.
"""

from __future__ import annotations

import ast

from cfgfix.records import dataclass, field

_LOADERS = {"safe_load", "load", "full_load", "unsafe_load"}  # yaml.* / json.load / OmegaConf.load / toml.load
_LOADER_MODULES = ("yaml", "json", "omegaconf", "OmegaConf", "toml", "tomllib", "ruamel")


@dataclass(frozen=True)
class Ref:
    """`flag`: an argparse destination; `keys`: a key path in the config file that `flag`
    names (when `keys` is not None); `path`: a literal config path instead of a flag."""

    flag: str | None
    keys: tuple[str, ...] | None = None
    path: str | None = None

    @property
    def is_config(self) -> bool:
        return self.keys is not None


@dataclass(frozen=True)
class Default:
    value: object
    node: ast.expr | None  # the `default=` expression (None for store_true's False)
    options: tuple[str, ...]  # the option strings (`--model`, `-m`)
    module: object = None  # the file holding the `add_argument`, when not the script (a Path)


@dataclass
class ScriptRefs:
    defaults: dict[str, Default] = field(default_factory=dict)  # argparse dest -> default
    options: dict[str, str] = field(default_factory=dict)  # option string -> dest
    namespaces: set[str] = field(default_factory=set)  # names holding parse_args() results
    configs: dict[str, Ref] = field(default_factory=dict)  # name -> the config (or part) it holds
    bound: dict[str, ast.expr] = field(default_factory=dict)  # names assigned once in the file
    repeated: set = field(default_factory=set)  # dests added more than once (two parsers): defaults unsure

    def ref(self, node: ast.AST, depth: int = 0) -> Ref | None:
        """The reference `node` is, or None (a literal, or something computed)."""
        if depth > 4:
            return None
        if isinstance(node, ast.Name):
            if node.id in self.configs:
                return self.configs[node.id]
            if node.id in self.bound:
                return self.ref(self.bound[node.id], depth + 1)
            return None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.namespaces:
            return Ref(node.attr)
        key, base = _subscript(node)
        if key is not None:
            parent = self.ref(base, depth + 1)
            if parent is not None and parent.is_config:
                return Ref(parent.flag, parent.keys + (key,), parent.path)
        return None


def read_refs(tree: ast.Module, parsers: frozenset[str] = frozenset()) -> ScriptRefs:
    """The flags, config files and names holding the parsed flags of `tree`. `parsers`:
    names of imported functions whose result is the parsed flags (`from opts import
    parse_args`)."""
    found = ScriptRefs()
    assigned: dict[str, list[ast.expr]] = {}
    opened: dict[str, ast.expr] = {}  # `with open(P) as f`: f -> P
    defs: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    calls: list[ast.Call] = []
    unpacked: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (node.args or node.keywords):
            calls.append(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            _argument(node, found)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                assigned.setdefault(target.id, []).append(node.value)
            elif isinstance(target, (ast.Tuple, ast.List)) and target.elts and isinstance(target.elts[0], ast.Name):
                if _is_parse_args(node.value):  # `args, unknown = parser.parse_known_args()`
                    unpacked.add(target.elts[0].id)
                elif _is_dataclass_parse(node.value):  # `model_args, training_args = parser.parse_args_into_dataclasses()`
                    unpacked.update(e.id for e in target.elts if isinstance(e, ast.Name))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                call = item.context_expr
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "open"
                        and call.args and isinstance(item.optional_vars, ast.Name)):
                    opened[item.optional_vars.id] = call.args[0]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.append(node)
            for arg in node.args.args:  # `def main(args):` called with the parsed namespace
                if arg.arg in ("args", "opt", "opts"):
                    found.namespaces.add(arg.arg)
    found.bound = {name: values[0] for name, values in assigned.items() if len(values) == 1}
    _parsed_names(found, assigned, defs, calls, parsers, unpacked)
    # Configs: `cfg = yaml.safe_load(open(args.config))`, then the parts bound to names.
    for _ in range(3):  # `cfg` before `tcfg = cfg["training"]` before `opt = tcfg["optim"]`
        for name, value in found.bound.items():
            if name in found.configs:
                continue
            path = _loaded_path(value, opened)
            if path is not None:
                ref = _path_ref(path, found)
                if ref is not None:
                    found.configs[name] = ref
                continue
            key, base = _subscript(value)
            if key is not None:
                parent = found.ref(base)
                if parent is not None and parent.is_config:
                    found.configs[name] = Ref(parent.flag, parent.keys + (key,), parent.path)
    return found


def _argument(call: ast.Call, found: ScriptRefs) -> None:
    options = tuple(a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    if not options or not any(o.startswith("-") for o in options):
        return  # a positional argument
    keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    dest_node = keywords.get("dest")
    if isinstance(dest_node, ast.Constant) and isinstance(dest_node.value, str):
        dest = dest_node.value
    else:
        long = next((o for o in options if o.startswith("--")), options[0])
        dest = long.lstrip("-").replace("-", "_")
    if dest in found.options.values():
        found.repeated.add(dest)
    for option in options:
        found.options[option] = dest
    action = keywords.get("action")
    action = action.value if isinstance(action, ast.Constant) else None
    if "default" in keywords:
        try:
            value = ast.literal_eval(keywords["default"])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            found.defaults[dest] = Default(None, keywords["default"], options)  # computed: unknown
            return
        found.defaults[dest] = Default(value, keywords["default"], options)
    elif action in ("store_true", "store_false"):
        found.defaults[dest] = Default(action == "store_false", None, options)
    else:
        found.defaults[dest] = Default(None, None, options)  # argparse's None: not set


def _is_parse_args(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("parse_args", "parse_known_args"))


def _is_dataclass_parse(node: ast.expr) -> bool:
    """`HfArgumentParser(...).parse_args_into_dataclasses()`: a tuple of dataclasses whose
    fields are the command line's flags (`--use_deepspeed true` sets `use_deepspeed`)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "parse_args_into_dataclasses")


def _parsed_names(found: ScriptRefs, assigned: dict[str, list[ast.expr]], defs: list, calls: list[ast.Call],
                  parsers: frozenset[str], unpacked: set[str]) -> None:
    """Add to `found.namespaces` the names that hold the parsed flags: a name bound once to
    `parser.parse_args()`, `parser.parse_known_args()[0]`, one of the dataclasses of
    `HfArgumentParser.parse_args_into_dataclasses()` (their fields are flags too), or a
    call of a function that returns them (the script's own `def parse_args(): ... return
    parser.parse_args()`, or an imported one in `parsers`); and the parameter of the
    script's own function that every
    call passes them to (`main(parse_args())`, `train(args)` with `def train(cfg):`). The
    names are read file-wide, so a parameter counts only where no function has a parameter
    of that name that is passed anything else, and the name is never assigned."""
    functions: dict = {}  # name -> its one def (None: defined twice, as methods of two classes are)
    for func in defs:
        functions[func.name] = None if func.name in functions else func
    producers = set(parsers)
    for _ in range(3):  # `def get_args(): return parse_args()` over `def parse_args():`
        for name, func in functions.items():
            if func is not None and name not in producers and _returns_parsed(func, producers):
                producers.add(name)

    def parsed(node: ast.expr, names: set[str]) -> bool:
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 0
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "parse_known_args"):
            return True  # `parser.parse_known_args()[0]`
        if isinstance(node, ast.Subscript) and _is_dataclass_parse(node.value):
            return True  # `parser.parse_args_into_dataclasses()[0]`: one of the dataclasses
        if isinstance(node, ast.Call):
            return ((isinstance(node.func, ast.Attribute) and node.func.attr == "parse_args")
                    or (isinstance(node.func, ast.Name) and node.func.id in producers))
        return isinstance(node, ast.Name) and node.id in names

    sure = set(unpacked)  # names that surely hold the parsed flags (not only named `args`)
    for name, value in found.bound.items():
        if _is_parse_args(value) or parsed(value, set()):  # (`args = parser.parse_known_args()` as before)
            sure.add(name)
    # Parameters: the largest set where every call passes the flags (or a name of the set)
    # to each, and every function with a parameter of that name is so called; then only
    # those reached from a parse (`def f(x): g(x)` and `def g(x): f(x)` alone hold nothing).
    sites = []  # (function, {parameter: value}) of each call of the script's own functions
    for call in calls:
        func = functions.get(call.func.id)
        if func is None:
            continue
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        if any(isinstance(value, ast.Starred) for value in call.args):
            sites.append((func, dict.fromkeys(params)))  # `f(*xs)`: anything
            continue
        passed = {params[i]: value for i, value in enumerate(call.args) if i < len(params)}
        passed.update((kw.arg, kw.value) for kw in call.keywords if kw.arg in params)
        sites.append((func, passed))
    having: dict[str, set[int]] = {}
    for func in defs:
        for arg in _all_args(func):
            having.setdefault(arg.arg, set()).add(id(func))
    candidates = {param for _, passed in sites for param in passed} - sure - set(assigned)
    while candidates:
        names = sure | candidates
        receives: dict[str, set[int]] = {}
        bad = set()
        for func, passed in sites:
            for param, value in passed.items():
                if value is not None and parsed(value, names):
                    receives.setdefault(param, set()).add(id(func))
                else:
                    bad.add(param)
        bad |= {param for param in candidates if having.get(param, set()) - receives.get(param, set())}
        if not bad & candidates:
            break
        candidates -= bad
    grown = True
    while grown:
        grown = False
        for _, passed in sites:
            for param, value in passed.items():
                if param in candidates and param not in sure and value is not None and parsed(value, sure):
                    sure.add(param)
                    grown = True
    found.namespaces |= sure


def _all_args(func) -> list[ast.arg]:
    a = func.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]


def _own_nodes(func):
    """The nodes of `func`'s body, not those of functions, classes or lambdas nested in it."""
    todo = list(func.body)
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node)
                    if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)))


def _returns_parsed(func, producers: set[str]) -> bool:
    """Every `return` of `func` (at least one) gives the parsed flags: `return
    parser.parse_args()`, or a name that every assignment in it binds to them (`args =
    parser.parse_args(); ...; return args`)."""
    def gives(value) -> bool:
        return isinstance(value, ast.Call) and (
            (isinstance(value.func, ast.Attribute) and value.func.attr == "parse_args")
            or (isinstance(value.func, ast.Name) and value.func.id in producers))

    held: dict[str, bool] = {}
    returns: list[ast.expr | None] = []
    for node in _own_nodes(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        held[name.id] = held.get(name.id, True) and isinstance(target, ast.Name) and gives(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            held[node.target.id] = False
        elif isinstance(node, ast.Return):
            returns.append(node.value)
    return bool(returns) and all(
        value is not None and (gives(value) or (isinstance(value, ast.Name) and held.get(value.id, False)))
        for value in returns)


def _subscript(node: ast.AST) -> tuple[str | None, ast.expr | None]:
    """(`key`, base) of `base["key"]`, `base.get("key")`, `base.get("key", d)`."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value, node.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value, node.func.value
    return None, None


def _loaded_path(node: ast.expr, opened: dict[str, ast.expr]) -> ast.expr | None:
    """The path expression of `yaml.safe_load(open(P))`, `json.load(f)` (with `f` opened on P),
    `OmegaConf.load(P)`; None for anything else."""
    if not (isinstance(node, ast.Call) and node.args):
        return None
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr in _LOADERS and isinstance(func.value, (ast.Name, ast.Attribute))):
        return None
    module = func.value.id if isinstance(func.value, ast.Name) else func.value.attr
    if module not in _LOADER_MODULES:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "open" and arg.args:
        return arg.args[0]
    if isinstance(arg, ast.Name) and arg.id in opened:
        return opened[arg.id]
    if module in ("omegaconf", "OmegaConf"):
        return arg
    return None


def _path_ref(path: ast.expr, found: ScriptRefs) -> Ref | None:
    if isinstance(path, ast.Constant) and isinstance(path.value, str):
        return Ref(None, (), path.value)
    if isinstance(path, ast.Attribute) and isinstance(path.value, ast.Name) and path.value.id in found.namespaces:
        return Ref(path.attr, ())
    return None
