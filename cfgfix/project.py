"""The project model: which training script each launch script starts, with how many
processes, and which accelerate / DeepSpeed configs each launch uses. Built from the
per-file facts (launches, config kinds) after every file was linted.

CFX105 reads it through `condition_holds("multi-process-launch", script)` (narrowed per
finding to the launches that do not turn a flag on, `;unless:--use_deepspeed`); the project
rules (`rules.base.ProjectRule`, CFX402/CFX502) read the config links through `accelerate_links()`
and `deepspeed_uses()`. The model reads only the few config files that launches and
accelerate configs reference (and the run's recognised configs), each once per run,
memoised per path; it is rebuilt on every run, so edits to a referenced file are seen even
when every per-file result came from the cache.
"""

from __future__ import annotations

import base64
import os
import re
from array import array
from collections.abc import Iterable
from pathlib import Path

from cfgfix.core import LazyRegex, Related, Span
from cfgfix.documents.files import MAX_PYTHON_BYTES, is_regular_file, read_file
from cfgfix.documents.text import lone_cr_as_lf
from cfgfix.records import dataclass, field, replace

# Values that may turn a flag off (HfArgumentParser's string_to_bool, argparse `type=str`
# left as the text): a launch passing one of these may still reach the `else`.
_FALSE_WORDS = frozenset({"false", "0", "no", "n", "f", "off", "none", ""})


def _last_value(args, options: list[str]):
    """The value the script arguments `args` ((text, span) pairs) give the first of
    `options` they name, the last occurrence winning as in argparse: True for a bare
    `--flag`, the text of `--flag X` / `--flag=X`, None when absent; and whether a word of
    `args` is a variable that may hold more flags (`$EXTRA_ARGS`, `"$@"`)."""
    value, hidden, previous = None, False, ""
    texts = [text for text, _ in args]
    for i, text in enumerate(texts):
        if "$" in text and not text.startswith("-") and not previous.startswith("-"):
            hidden = True
        previous = text
        for option in options:
            if text == option:
                following = texts[i + 1] if i + 1 < len(texts) else None
                value = True if following is None or following.startswith("-") else following
            elif option.startswith("--") and text.startswith(option + "="):
                value = text[len(option) + 1:]
    return value, hidden


def turns_on(args, options: list[str]) -> bool:
    """The script arguments set one of `options` to a value that is surely true: a bare
    `--flag`, `--flag true`, `--deepspeed ds.json`. `--flag false`, `--flag 0` or a value
    from a variable (`$USE_DS`) may be false: not on."""
    value, _ = _last_value(args, options)
    if value is None or value is True:
        return value is True
    return "$" not in value and value.strip("'\"").lower() not in _FALSE_WORDS


def turns_off(args, options: list[str]) -> bool:
    """The script arguments surely leave a flag whose default is off at off: none of
    `options` is passed (and no variable may hold more flags), or the last one says
    `false`/`0`/`no`."""
    value, hidden = _last_value(args, options)
    if value is None:
        return not hidden
    return value is not True and "$" not in value and value.strip("'\"").lower() in _FALSE_WORDS


# LLaMA-Factory's launcher (llamafactory/launcher.py, cli.py before 0.9.4) and axolotl's CLI read these
TOOL_ENV = ("FORCE_TORCHRUN", "NPROC_PER_NODE", "NNODES", "USE_RAY", "USE_KT", "USE_MCA")
TOOL_ENV_MODULES = frozenset({"llamafactory.train", "axolotl.cli.train"})


@dataclass(frozen=True)
class LaunchFacts:
    """A launch as plain data, so it can be cached with its launch script's result."""

    launcher: str
    script: str | None
    world_size: int | None
    accelerate_config: str | None
    span: Span
    deepspeed_config: str | None = None  # accelerate --deepspeed_config_file, or --deepspeed F in script args
    training_config: str | None = None  # the script's --config F
    grad_accum: int | None = None  # the script's --gradient_accumulation_steps N
    grad_accum_span: Span | None = None
    args: tuple[tuple[str, Span], ...] = ()  # the script's arguments as written, with spans
    cuda_devices: str | None = None  # CUDA_VISIBLE_DEVICES in the launch's environment
    module: str | None = None  # `-m pkg.mod` launches and training tools (`axolotl.cli.train`)
    # deepspeed --hostfile F (world_size None until the project stage reads F), with the
    # --num_nodes / --num_gpus that limit it
    hostfile: str | None = None
    num_nodes: int | None = None
    num_gpus: int | None = None
    # the variables a training tool reads to start its processes (`FORCE_TORCHRUN=1
    # NNODES=2 llamafactory-cli train x.yaml`), as the launch's environment holds them
    tool_env: tuple[tuple[str, str], ...] = ()
    # accelerate's own options (`--mixed_precision bf16`, `--use_deepspeed`): (key, value as
    # expanded or None for a bare flag, span); they beat its --config_file YAML's keys
    options: tuple[tuple[str, str | None, Span], ...] = ()

    def option(self, key: str):
        """(value, span) of accelerate's option `key` on this launch's command line, else None."""
        return next(((value, span) for name, value, span in self.options if name == key), None)

    @classmethod
    def from_launch(cls, launch) -> "LaunchFacts":
        configs = launch.config_files
        config = configs.get("accelerate")
        deepspeed = configs.get("deepspeed")
        deepspeed_text = _expand(deepspeed.text, launch.env) if deepspeed is not None else None
        # `--deepspeed $DS_CONFIG` with DS_CONFIG assigned in the script: its value
        expanded = [_Text(_expand(w.text, launch.env)) for w in launch.script_args]
        if deepspeed_text is None:
            # `--deepspeed ds.json` (HF Trainer) or `--deepspeed_config ds.json` (deepspeed.initialize)
            deepspeed_text = _option(expanded, ("--deepspeed_config", "--deepspeed"))
        training = configs.get("config")
        training_text = _expand(training.text, launch.env) if training is not None else _option(expanded, ("--config",))
        steps_word = _option_word(launch.script_args, "--gradient_accumulation_steps")
        steps = None
        if steps_word is not None:
            # `--gradient_accumulation_steps=N` is the whole word; after `--gradient_accumulation_steps`
            # the next word is the value, even one that starts with `--` (fuzz-found: `--1e400`)
            name, eq, value = steps_word.text.partition("=")
            text = value if eq and name == "--gradient_accumulation_steps" else steps_word.text
            steps = int(text) if text.isdigit() and len(text) <= 30 and int(text) > 0 else None
        return cls(
            launcher=launch.launcher,
            script=launch.script.text if launch.script is not None else None,
            world_size=launch.world_size,
            accelerate_config=_expand(config.text, launch.env) if config is not None else None,
            span=launch.command.span,
            deepspeed_config=deepspeed_text,
            training_config=training_text,
            grad_accum=steps,
            grad_accum_span=steps_word.span if steps is not None else None,
            args=tuple((_expand(w.text, launch.env), w.span) for w in launch.script_args),
            cuda_devices=launch.env.get("CUDA_VISIBLE_DEVICES"),
            module=launch.module,
            hostfile=_expand(hostfile.text, launch.env) if (hostfile := configs.get("hostfile")) is not None else None,
            num_nodes=launch.num_machines if launch.launcher == "deepspeed" else None,
            num_gpus=launch.num_processes if launch.launcher == "deepspeed" else None,
            tool_env=tuple((name, launch.env[name]) for name in TOOL_ENV if launch.env.get(name) is not None)
            if launch.module in TOOL_ENV_MODULES else (),
            options=tuple((key, _expand(word.text, launch.env) if word is not None else None,
                           word.span if word is not None else _flag_span(launch, key))
                          for key, word in launch.options.items()),
        )

    def to_dict(self) -> dict:
        return {
            "launcher": self.launcher,
            "script": self.script,
            "world_size": self.world_size,
            "accelerate_config": self.accelerate_config,
            "span": self.span.to_dict(),
            "deepspeed_config": self.deepspeed_config,
            "training_config": self.training_config,
            "grad_accum": self.grad_accum,
            "grad_accum_span": self.grad_accum_span.to_dict() if self.grad_accum_span else None,
            **_packed_args(self.args, self.span.path),
            "cuda_devices": self.cuda_devices,
            "module": self.module,
            "hostfile": self.hostfile,
            "num_nodes": self.num_nodes,
            "num_gpus": self.num_gpus,
            "tool_env": [list(pair) for pair in self.tool_env],
            "options": [[key, value, span.to_dict()] for key, value, span in self.options],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "LaunchFacts":
        return cls(
            data["launcher"], data["script"], data["world_size"], data["accelerate_config"],
            Span.from_dict(data["span"]), data.get("deepspeed_config"), data.get("training_config"),
            data.get("grad_accum"),
            Span.from_dict(data["grad_accum_span"]) if data.get("grad_accum_span") else None,
            _unpacked_args(data, data["span"]["path"]),
            data.get("cuda_devices"),
            data.get("module"),
            data.get("hostfile"),
            data.get("num_nodes"),
            data.get("num_gpus"),
            tuple(tuple(pair) for pair in data.get("tool_env", ())),
            tuple((key, value, Span.from_dict(span)) for key, value, span in data.get("options", ())),
        )


def _flag_span(launch, key: str) -> Span:
    """The span of a bare flag (`--use_deepspeed`) among the launch's words, else the launch's."""
    for word in launch.command.words:
        if word.text.lstrip("-").replace("-", "_") == key:
            return word.span
    return launch.command.span


def _packed_args(args, path: str) -> dict:
    """The script arguments as the cache stores them: their texts, and their spans' six
    numbers as one array's bytes in base64. A dict per span was ~350 of the ~1,000 bytes
    each argument of a 400,000-argument launch line cost (issue 24)."""
    if any(span.path != path for _, span in args):
        return {"args": [[text, span.to_dict()] for text, span in args]}
    numbers = array("q", (n for _, s in args for n in (s.line, s.column, s.end_line, s.end_column, s.start, s.end)))
    return {"args": [text for text, _ in args], "arg_spans": base64.b64encode(numbers.tobytes()).decode("ascii")}


def _unpacked_args(data: dict, path: str) -> tuple[tuple[str, Span], ...]:
    texts = data.get("args", ())
    numbers = data.get("arg_spans")
    if numbers is None:
        return tuple((text, Span.from_dict(span)) for text, span in texts)
    if not texts:
        return ()
    n = array("q")
    n.frombytes(base64.b64decode(numbers))
    if len(n) != 6 * len(texts):
        raise ValueError("each argument needs six span numbers")
    return tuple((text, Span(path, n[at], n[at + 1], n[at + 2], n[at + 3], n[at + 4], n[at + 5]))
                 for text, at in zip(texts, range(0, len(n), 6), strict=True))


@dataclass(frozen=True)
class _Text:
    """A script argument after variable expansion, shaped like a launch word (`.text`)."""

    text: str


_VARIABLE = LazyRegex(r"\$(?:\{(\w+)\}|(\w+))")


def _expand(text: str, env: dict[str, str]) -> str:
    """`--model=$MODEL_NAME` with the value the launch script assigned; a variable it did
    not assign stays as written (and the setting stays unknown). The launch script's own
    folder (`$(cd "$(dirname "$0")/.." && pwd)`, `$(dirname "$0")`, also through a variable:
    `ROOT=...; $ROOT/configs/x.yaml`) is written relative to it (`./..`), which is where
    `_resolve` looks first."""
    if "$" not in text:
        return text
    return _script_folder(_VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), text))


_SCRIPT = r"\$(?:0|\{0\}|\{BASH_SOURCE(?:\[0\])?\}|BASH_SOURCE(?:\[0\])?)"
_SCRIPT_FOLDER = (
    re.compile(r"\$\(cd\s+\$\(dirname\s+" + _SCRIPT + r"\)((?:/\.\.)*)/?\s*(?:&&|;)\s*pwd(?:\s+-P)?\s*\)"),
    re.compile(r"\$\(dirname\s+" + _SCRIPT + r"\)((?:/\.\.)*)"),
)


def _script_folder(text: str) -> str:
    if not text.startswith(("$(", '"$(')):
        return text
    plain = text.replace('"', "")
    for pattern in _SCRIPT_FOLDER:
        match = pattern.match(plain)
        if match is not None:
            return "." + match.group(1) + plain[match.end():]
    return text


def _option(words, names: tuple[str, ...]) -> str | None:
    """The value of the first of `names` among script arguments (`--name V` or `--name=V`);
    a following option (`--deepspeed --deepspeed_config F`) is not a value."""
    texts = [w.text for w in words]
    for name in names:
        for i, text in enumerate(texts):
            if text == name and i + 1 < len(texts) and not texts[i + 1].startswith("-"):
                return texts[i + 1]
            if text.startswith(name + "="):
                return text[len(name) + 1:] or None
    return None


def _option_word(words, name: str):
    """The word that holds the value of `name` (`--name V`: V; `--name=V`: the whole word)."""
    for i, word in enumerate(words):
        if word.text == name and i + 1 < len(words):
            return words[i + 1]
        if word.text.startswith(name + "="):
            return word
    return None


def _resolve_in(written: str, bases: Iterable[Path]) -> Path | None:
    """`written` as a file under the first base that has it; None for `$VAR` paths."""
    if not written or "$" in written or written.lstrip().startswith(("{", "[")):
        return None
    candidate = Path(written)
    # is_regular_file: a name over 255 bytes or a loop is no file (Path.is_file raises on
    # some OSErrors), and a FIFO or device is never read as a config
    if candidate.is_absolute():
        return Path(os.path.realpath(candidate)) if is_regular_file(candidate) else None
    for base in bases:
        path = base / candidate
        if is_regular_file(path):
            return Path(os.path.realpath(path))
    return None


def _resolve(written: str, launch_file: Path, root: Path) -> Path | None:
    """A path as a launch script wrote it: relative to the script's folder, a folder above
    it inside the project (`scripts/train.sh` is usually run from the repository's top),
    the project root, or the current folder (launch scripts are run from any of these)."""
    return _resolve_in(written, [*_launch_folders(launch_file, root), root, Path.cwd()])


def hostfile_world_size(launch: LaunchFacts, launch_file: Path, root: Path) -> int | None:
    """The processes `deepspeed --hostfile F` starts: F's first `--num_nodes` hosts, each
    with `--num_gpus` GPUs when given (the runner replaces every host's GPU list), else its
    slots (DeepSpeed's launcher/runner.py, `fetch_hostfile`); None when F cannot be read or
    a line is not `host slots=N`."""
    path = _resolve(launch.hostfile, launch_file, root)
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:100_000]
    except OSError:
        return None
    slots = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"\S+\s+slots\s*=\s*(\d+)", line)
        if match is None:
            return None  # DeepSpeed raises on such a line: no world size to claim
        slots.append(int(match.group(1)))
    if not slots:
        return None
    if launch.num_nodes is not None:
        slots = slots[:launch.num_nodes]
    if launch.num_gpus is not None:
        slots = [launch.num_gpus] * len(slots)
    return sum(slots) or None


_MODULE_NAME = LazyRegex(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def script_path(launch: LaunchFacts, launch_file: Path, root: Path) -> Path | None:
    """The training script a launch runs: its script argument, or for `-m pkg.train`
    (`python -m`, `accelerate launch -m`, `torchrun -m`, `deepspeed --module`) the module's
    file in the project (`pkg/train.py`, `pkg/train/__main__.py`, also under `src/`)."""
    if launch.module:
        return _resolve_module(launch.module, launch_file, root)
    return _resolve(launch.script, launch_file, root) if launch.script else None


def _resolve_module(module: str, launch_file: Path, root: Path) -> Path | None:
    if not _MODULE_NAME.fullmatch(module):
        return None  # `$MODULE`, or not a module name at all
    relative = module.replace(".", "/")
    bases = [*_launch_folders(launch_file, root), root, root / "src", Path.cwd()]
    return _resolve_in(relative + ".py", bases) or _resolve_in(relative + "/__main__.py", bases)


def _launch_folders(launch_file: Path, root: Path) -> list[Path]:
    """The launch script's folder and its parents up to (not including) the project root."""
    folders = [launch_file.parent]
    try:
        real_root = Path(os.path.realpath(root))
        current = Path(os.path.realpath(launch_file.parent))
        while current != real_root and real_root in current.parents and len(folders) < 8:
            current = current.parent
            if current != real_root:
                folders.append(current)
    except OSError:
        pass
    return folders


def _reads_one_file(key) -> Path | None:
    """The one file a `ProjectModel._scripts` entry was read from (a parsed script, its facts,
    a launch script's text), or None for what reads several (setups, budgets, versions)."""
    if isinstance(key, Path):
        return key
    if isinstance(key, tuple) and len(key) == 2 and key[0] in ("facts", "launch-text", "bound-configs") and isinstance(key[1], Path):
        return key[1]
    return None


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


@dataclass
class DeepSpeedUse:
    """One way a DeepSpeed config is used: by a launch directly (`--deepspeed F`) or through
    an accelerate config; `world_size` None when nothing states it."""

    world_size: int | None
    related: list[Related] = field(default_factory=list)
    via_accelerate: Path | None = None
    script: Path | None = None  # the training script the launch runs (real path), when found
    args: tuple = ()  # the launch's script arguments (`(text, span)`), for model-parallel sizes
    training_config: Path | None = None  # the script's --config file, when found


@dataclass
class AccelerateLink:
    """An accelerate config and the DeepSpeed config its `deepspeed_config_file` names."""

    path: Path
    doc: object  # ConfigDocument
    deepspeed_path: Path | None
    deepspeed_node: object | None  # the deepspeed_config_file value node
    launches: list[LaunchFacts] = field(default_factory=list)


class ProjectModel:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else Path.cwd()
        # training script (real path) -> launches with more than one process
        self.multi_process: dict[Path, list[tuple[LaunchFacts, int]]] = {}
        self.launches: list[tuple[LaunchFacts, Path]] = []  # with the launch script's real path
        self.configs: dict[Path, frozenset[str]] = {}  # recognised configs of this run (real path)
        self.displays: dict[Path, str] = {}  # real path -> display path of this run's configs and launch scripts
        # Files of this run not recognised as configs by content (YAML/JSON that hold no
        # config keys, and any other file that is neither Python nor a launch script), by file
        # name: a launch may still pass one as its accelerate or DeepSpeed config (an accelerate
        # YAML saved as `config.sh`); realpath only when one is named
        self.unrecognised: dict[str, list] = {}
        self._docs: dict[Path, object] = {}
        self._scripts: dict[Path, object] = {}
        self._overrides: dict[Path, bytes] = {}
        self._links: tuple | None = None
        self._project_bounds: dict | None = None  # the code idioms of every file (version conditions)
        self.launched: dict[Path, list] = {}  # a script's real path -> every launch that runs it
        self.target_gpu: str | None = None  # [tool.cfgfix] gpu / --gpu
        self.target_gpus: int | None = None
        self.target_gpu_origin = "gpu in the cfgfix settings"
        self.simulate = False  # `check --simulate`
        self.target_model: dict = {}  # [tool.cfgfix.model]: {"params": int, "modules": {name: count or id}}

    @classmethod
    def build(cls, files, results, root: Path, settings=None) -> "ProjectModel":
        model = cls(root)
        if settings is not None:
            model.target_gpu, model.target_gpus = settings.gpu, settings.gpus
            model.target_gpu_origin = settings.gpu_origin
            model.simulate = settings.simulate
            model.target_model = {"params": settings.model_params, "modules": dict(settings.model_modules)}
        for sf in files:
            result = results.get(sf.display)
            if result is None:
                continue
            kinds = getattr(result, "configs", None)
            if not kinds and not result.launches:
                if sf.kind not in ("python", "notebook"):
                    model.unrecognised.setdefault(sf.path.name, []).append(sf)
                continue  # only configs and launch scripts take part (realpath costs a syscall)
            real = _real(sf.path)
            model.displays.setdefault(real, sf.display)
            if kinds:
                model.configs[real] = frozenset(kinds)
            for data in result.launches:
                launch = LaunchFacts.from_dict(data)
                if launch.hostfile and launch.world_size is None:
                    launch = replace(launch, world_size=hostfile_world_size(launch, sf.path, root))
                if launch.module in TOOL_ENV_MODULES and not launch.deepspeed_config and launch.training_config:
                    launch = replace(launch, deepspeed_config=model._tool_deepspeed(launch, sf.path))
                if launch.module == "llamafactory.train" and launch.world_size is None:
                    launch = replace(launch, world_size=model._llamafactory_processes(launch, sf.path))
                model.launches.append((launch, real))
                if launch.script is None and launch.module is None:
                    continue
                script = script_path(launch, sf.path, root)
                world = launch.world_size
                if world is None and launch.accelerate_config:
                    world = _accelerate_world_size(launch.accelerate_config, sf.path, root)
                if script is not None and world is not None and world > 1:
                    model.multi_process.setdefault(script, []).append((launch, world))
                if script is not None:
                    model.launched.setdefault(script, []).append(launch)
        return model

    def condition_holds(self, condition: str, sf) -> list[Related] | None:
        """None when the condition does not hold for this file; else the spans that show it.
        `multi-process-launch`, optionally narrowed by `;unless:--a,--b` (rules/base.py
        `Conditioned`): a launch that turns one of those script flags on does not count;
        by `;only:--a,--b` (a flag whose default is off): one that surely leaves it off
        does not count."""
        base, *qualifiers = condition.split(";")
        if base == "version":
            return self._version_holds(qualifiers)
        if base == "launch-flags":
            return self._flags_hold(sf, qualifiers)
        if base != "multi-process-launch":
            return None
        launches = self.multi_process.get(Path(os.path.realpath(sf.path)))
        for qualifier in qualifiers:
            kind, _, options = qualifier.partition(":")
            if kind == "unless" and launches:
                launches = [(launch, world) for launch, world in launches
                            if not turns_on(launch.args, options.split(","))]
            elif kind == "only" and launches:  # a flag whose default is off
                launches = [(launch, world) for launch, world in launches
                            if not turns_off(launch.args, options.split(","))]
        if not launches:
            return None
        return [Related(launch.span, f"launched here with {world} processes") for launch, world in launches]

    def _flags_hold(self, sf, qualifiers: list[str]) -> list[Related] | None:
        """`launch-flags;unless:--deepspeed` (a statement in the `else` of `if args.deepspeed:`):
        it holds unless the script has launches and every one of them turns a needed-off flag
        on (or surely leaves a needed-on flag off). A script no launch of the project runs
        may be run any way: it holds."""
        launches = self.launched.get(Path(os.path.realpath(sf.path)))
        if not launches:
            return []
        for qualifier in qualifiers:
            kind, _, options = qualifier.partition(":")
            if kind == "unless":
                launches = [launch for launch in launches if not turns_on(launch.args, options.split(","))]
            elif kind == "only":
                launches = [launch for launch in launches if not turns_off(launch.args, options.split(","))]
        return [] if launches else None

    def _version_holds(self, qualifiers: list[str]) -> list[Related] | None:
        """`version;at_least:transformers:5.0.0` (a finding on an assumed current release):
        it holds unless the project's code, any file of it, dates the library below that
        release (analysis/version_idioms.py `project_bounds`, read once per run and only
        when such a finding needs it). A plain `version` always holds."""
        for qualifier in qualifiers:
            kind, _, rest = qualifier.partition(":")
            package, _, release = rest.partition(":")
            if kind == "at_least" and package and release:
                from cfgfix.analysis.version_idioms import excludes_from, project_bounds

                if self._project_bounds is None:
                    self._project_bounds = project_bounds(self.root)
                if excludes_from(self._project_bounds, package, release):
                    return None
        return []

    # -- reading configs (memoised per path; overrides hold a file's unsaved edits) -----------
    def with_override(self, path: Path, data: bytes) -> "ProjectModel":
        """The same project with one file's bytes replaced (the fixer's edited text)."""
        real = _real(path)
        other = _shallow_copy(self)
        other._overrides = {**self._overrides, real: data}
        # Every other file's parse stays: the fixer re-checks after each round, and parsing a
        # launch's megabyte configs again each time made `fix` 5x slower than `check` (issue 24).
        other._docs = {p: doc for p, doc in self._docs.items() if p != real}
        other._scripts = {k: v for k, v in self._scripts.items() if _reads_one_file(k) not in (None, real)}
        other._links = None
        return other

    def files_by_launch(self) -> list[set[Path]]:
        """For each launch (in `self.launches` order), the real paths of the files it links:
        its launch script, its training script, its accelerate config and the DeepSpeed JSON
        that names, a DeepSpeed JSON of its own or one its script binds in code."""
        of_launch: dict[int, set[Path]] = {}
        for link in self.accelerate_links():
            for launch in link.launches:
                of_launch.setdefault(id(launch), set()).update(p for p in (link.path, link.deepspeed_path) if p is not None)
        out = []
        for launch, launch_file in self.launches:
            files = {launch_file, *of_launch.get(id(launch), ())}
            script = _resolve(launch.script, launch_file, self.root) if launch.script else None
            if script is not None:
                files.add(script)
            bases = [*_launch_folders(launch_file, self.root), self.root, Path.cwd()] + ([script.parent] if script else [])
            if launch.deepspeed_config:
                ds = _resolve_in(launch.deepspeed_config, bases)
                if ds is not None:
                    files.add(ds)
            files.update(path for path, _ in self._bound_in_code(launch, script, bases))  # `TrainingArguments(deepspeed=...)`
            out.append(files)
        return out

    def around(self, path: Path, files_by_launch: list[set[Path]]) -> "ProjectModel":
        """A copy that holds only what can put a project finding on `path`: the launches
        whose files (`files_by_launch`, one set per launch) include it, and the configs those
        launches link. The fixer re-checks one file after each edit; judging the whole tree
        each time made `fix` quadratic in the number of projects of a tree."""
        real = _real(path)
        keep = [i for i, files in enumerate(files_by_launch) if real in files]
        linked = {real}.union(*(files_by_launch[i] for i in keep))
        for link in self.accelerate_links():  # an accelerate config no launch uses that names `path`
            if real in (link.path, link.deepspeed_path):
                linked.update(p for p in (link.path, link.deepspeed_path) if p is not None)
        other = _shallow_copy(self)
        other.launches = [self.launches[i] for i in keep]
        other.configs = {p: kinds for p, kinds in self.configs.items() if p in linked}
        other._links = None
        other._docs = dict(self._docs)
        other._scripts = {k: v for k, v in self._scripts.items() if not isinstance(k, tuple) or k[0] != "training-setups"}
        return other

    def display(self, path: Path) -> str:
        shown = self.displays.get(path)
        if shown is not None:
            return shown
        try:
            return Path(os.path.relpath(path, Path.cwd())).as_posix()
        except ValueError:
            return path.as_posix()

    def real_path(self, shown: str) -> Path:
        """The real path of a file as findings and edits name it (its display path)."""
        for real, display in self.displays.items():
            if display == shown:
                return real
        return _real(Path(shown))

    def _llamafactory_processes(self, launch: LaunchFacts, launch_file: Path) -> int | None:
        """`llamafactory-cli train`'s processes (analysis/tool_processes.py), for the rules
        that read a launch's count; one where the project pins a release before 0.8.0, which
        starts no torchrun of its own (training/frameworks/llamafactory.py FACTS)."""
        from cfgfix.analysis.tool_processes import llamafactory_processes
        from cfgfix.analysis.versions import ProjectVersions

        key = ("project-versions",)  # shared with training/frameworks/yaml_tools.py release_for
        if key not in self._scripts:
            self._scripts[key] = ProjectVersions(self.root)
        try:
            pins = self._scripts[key].for_file(launch_file)
            old = any(pins.get(name).below("0.8.0") is True for name in ("llamafactory", "llmtuner"))
        except (OSError, ValueError):
            return None
        if old:
            return 1
        return llamafactory_processes(dict(launch.tool_env), launch.cuda_devices)[0]

    def _tool_deepspeed(self, launch: LaunchFacts, launch_file: Path) -> str | None:
        """`deepspeed: ds.json` in the YAML a training tool runs (`llamafactory-cli train x.yaml`,
        `axolotl train x.yml`): the launch's DeepSpeed config, for every rule that needs one
        (the tools hand it to the HF Trainer as --deepspeed)."""
        path = _resolve(launch.training_config, launch_file, self.root)
        doc = self.read(path) if path is not None else None
        root = doc.root if doc is not None else None
        node = root.get("deepspeed") if root is not None and root.kind == "mapping" else None
        if node is None or node.kind != "scalar" or not isinstance(node.value, str) or not node.value.strip():
            return None
        return node.value.strip()

    def read(self, path: Path):
        """The parsed config at `path` (a real path), or None when it cannot be read."""
        if path in self._docs:
            return self._docs[path]
        from cfgfix.documents.config import ConfigError, parse_config
        from cfgfix.documents.text import SourceText

        doc = None
        try:
            data = self._overrides.get(path)
            if data is None:
                data = read_file(path)
            data = lone_cr_as_lf(data)
            doc = parse_config(SourceText.from_bytes(self.display(path), data), config_format(path, data), lenient=True)
            if doc.root is None or doc.root.kind != "mapping":
                doc = None
        except (OSError, ValueError, ConfigError, RecursionError, MemoryError):  # DecodeError is a ValueError
            doc = None
        self._docs[path] = doc
        return doc

    def script(self, path: Path):
        """The training script at `path` (a real path) as (SourceText, ast.Module), or None
        when it is not Python or cannot be read; parsed once per run."""
        if path in self._scripts:
            return self._scripts[path]
        from cfgfix.documents.python import parse_python
        from cfgfix.documents.text import DecodeError, SourceText

        found = None
        if path.suffix == ".py":
            try:
                data = self._overrides.get(path)
                if data is None:
                    data = read_file(path, limit=MAX_PYTHON_BYTES)
                data = lone_cr_as_lf(data)
                if len(data) <= MAX_PYTHON_BYTES:
                    source = SourceText.from_bytes(self.display(path), data)
                    found = (source, parse_python(source.text))
            except (OSError, DecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
                found = None
        self._scripts[path] = found
        return found

    def launch_text(self, launch: LaunchFacts) -> str | None:
        """The command text of `launch` as its launch script wrote it (continuations
        included), or None when the script cannot be read."""
        for known, launch_file in self.launches:
            if known is not launch:
                continue
            key = ("launch-text", launch_file)
            if key not in self._scripts:
                try:
                    data = self._overrides.get(launch_file)
                    self._scripts[key] = lone_cr_as_lf(data if data is not None else read_file(launch_file)).decode(
                        "utf-8", "replace")
                except OSError:
                    self._scripts[key] = None
            text = self._scripts[key]
            return text[launch.span.start:launch.span.end] if text is not None else None
        return None

    # -- links ------------------------------------------------------------------------------
    def wants_launch_scripts(self) -> bool:
        """True when a DeepSpeed config of this run has no use with a known world size: the
        launch that gives one may be in a launch script the run did not name."""
        uses = self.deepspeed_uses()
        for path, kinds in self.configs.items():
            if "deepspeed" in kinds and not any(use.world_size for use in uses.get(path, ())):
                return True
        return False

    def accelerate_links(self) -> list[AccelerateLink]:
        return self._linked()[0]

    def deepspeed_uses(self) -> dict[Path, list[DeepSpeedUse]]:
        return self._linked()[1]

    def _recognise_by_use(self, path: Path, kind: str) -> None:
        """A file that a launch passes as its DeepSpeed config (`--deepspeed`,
        `--deepspeed_config`) or its accelerate config (`--config_file`) is one of that kind,
        whatever it holds (`{"train_batch_size": 8}` alone is not recognisable by content)
        and whatever its name ends with (accelerate reads any name but `.json` as YAML): when
        its content reads as a YAML/JSON mapping, a file of this run takes part in the project
        rules as such."""
        if path in self.configs:
            return
        for sf in self.unrecognised.get(path.name, ()):
            if _real(sf.path) == path:
                doc = self.read(path)
                if doc is not None:
                    self.configs[path] = frozenset({kind})
                    self.displays.setdefault(path, sf.display)
                return

    def configs_by_use(self) -> list[tuple[object, bytes, str, frozenset[str]]]:
        """(file, bytes, "yaml" or "json", kinds) for each file of this run that is a config
        only because a launch passes it as one: its content alone does not say so
        (`{"train_batch_size": 16, "train_batch_size": 32}`) or its name is not a config's
        (`config.sh`). The per-file config rules read it as that format and those kinds."""
        self._linked()
        found = []
        for path, kinds in self.configs.items():
            for sf in self.unrecognised.get(path.name, ()):
                if _real(sf.path) != path:
                    continue
                try:
                    data = self._overrides.get(path)
                    data = data if data is not None else read_file(path)
                except OSError:
                    continue
                found.append((sf, data, config_format(path, lone_cr_as_lf(data)), kinds))
        return found

    def bound_in_code(self, launch, script: Path | None, bases) -> list[tuple[Path, Related]]:
        """The DeepSpeed configs the launch's training script binds in code
        (`TrainingArguments(deepspeed="ds.json")`, `deepspeed.initialize(config=...)`,
        `DeepSpeedPlugin(hf_ds_config=...)`; `analysis/training_script.py` BoundConfig), as
        real paths resolved from the launch's folders, the project root and the script's folder,
        each with a related location at the binding. A default the launch's own flag replaces
        (`--deepspeed other.json` for `default="ds.json"`) is the flag's file; a config the
        launch already names (`--deepspeed ds.json`) is not repeated."""
        return self._bound_in_code(launch, script, bases, repeat=True)

    def _bound_in_code(self, launch, script: Path | None, bases, repeat: bool = False) -> list[tuple[Path, Related]]:
        if script is None:
            return []
        key = ("bound-configs", script)
        if key not in self._scripts:
            self._scripts[key] = _bound_configs(self, script)
        bound = self._scripts[key]
        if not bound:
            return []
        source, configs = bound
        named = _resolve_in(launch.deepspeed_config, bases) if launch.deepspeed_config else None
        found: list[tuple[Path, Related]] = []
        for config in configs:
            written = config.path
            if config.flag is not None:
                value, _ = _last_value(launch.args, [config.flag])
                if isinstance(value, str) and "$" not in value:
                    written = value
            if not written:
                continue
            path = _resolve_in(written, bases)
            if path is None or (path == named and not repeat) or any(path == p for p, _ in found):
                continue
            found.append((path, Related(source.span_of_node(config.node), f"{config.call} binds this DeepSpeed config")))
        return found

    def _linked(self):
        if self._links is None:
            self._links = self._link()
        return self._links

    def _link(self):
        by_yaml: dict[Path, list[LaunchFacts]] = {}
        uses: dict[Path, list[DeepSpeedUse]] = {}
        script_dirs: dict[Path, list[Path]] = {}
        scripts: dict[int, Path] = {}  # id(launch) -> its training script
        launch_configs: dict[int, Path | None] = {}  # id(launch) -> its script's --config file
        for launch, launch_file in self.launches:
            if launch.training_config:
                launch_configs[id(launch)] = _resolve(launch.training_config, launch_file, self.root)
            script = script_path(launch, launch_file, self.root)
            if script is not None:
                scripts[id(launch)] = script
            if launch.accelerate_config:
                path = _resolve(launch.accelerate_config, launch_file, self.root)
                if path is not None:
                    self._recognise_by_use(path, "accelerate")
                    by_yaml.setdefault(path, []).append(launch)
                    if script is not None:
                        script_dirs.setdefault(path, []).append(script.parent)
            bases = [*_launch_folders(launch_file, self.root), self.root, Path.cwd()] + ([script.parent] if script is not None else [])
            for path, related_code in self._bound_in_code(launch, script, bases):
                self._recognise_by_use(path, "deepspeed")
                world = launch.world_size
                if world is None and launch.accelerate_config:
                    world = _accelerate_world_size(launch.accelerate_config, launch_file, self.root)
                uses.setdefault(path, []).append(DeepSpeedUse(
                    world, [Related(launch.span, _launched(world)), related_code], script=script, args=launch.args,
                    training_config=launch_configs.get(id(launch))))
            if launch.deepspeed_config:
                path = _resolve_in(launch.deepspeed_config, bases)
                if path is not None:
                    self._recognise_by_use(path, "deepspeed")
                    world = launch.world_size
                    related = [Related(launch.span, _launched(world))]
                    if world is None and launch.accelerate_config:
                        yaml_path = _resolve(launch.accelerate_config, launch_file, self.root)
                        doc = self.read(yaml_path) if yaml_path is not None else None
                        world, node = accelerate_world_size(doc) if doc is not None else (None, None)
                        if node is not None:
                            related.append(Related(doc.span(node), f"num_processes {world}"))
                    uses.setdefault(path, []).append(DeepSpeedUse(
                        world, related, script=script, args=launch.args,
                        training_config=_resolve(launch.training_config, launch_file, self.root) if launch.training_config else None))
        links: list[AccelerateLink] = []
        candidates = [p for p, kinds in self.configs.items() if "accelerate" in kinds]
        candidates += [p for p in by_yaml if p not in self.configs]
        for path in candidates:
            doc = self.read(path)
            if doc is None:
                continue
            block = doc.root.get("deepspeed_config")
            node = block.get("deepspeed_config_file") if block is not None and block.kind == "mapping" else None
            ds_path = None
            kind = doc.root.get("distributed_type")
            if kind is not None and kind.value != "DEEPSPEED":
                node = None  # accelerate reads deepspeed_config only for DEEPSPEED runs
            if node is not None and node.kind == "scalar" and isinstance(node.value, str):
                # accelerate opens the path as written (from the launch's folder); a path
                # relative to the YAML itself is tried first, then the project root.
                bases = [path.parent, self.root] + script_dirs.get(path, []) + [Path.cwd()]
                ds_path = _resolve_in(node.value, bases)
            launches = by_yaml.get(path, [])
            links.append(AccelerateLink(path, doc, ds_path, node if ds_path else None, launches))
            if ds_path is None:
                continue
            ref = Related(doc.span(node), f"used by {self.display(path)}")
            yaml_world, world_node = accelerate_world_size(doc)
            if not launches:
                related = [ref] + ([Related(doc.span(world_node), f"num_processes {yaml_world}")] if world_node else [])
                uses.setdefault(ds_path, []).append(DeepSpeedUse(yaml_world, related, path))
            for launch in launches:
                related = [ref]
                world = launch.world_size
                if world is not None:
                    related.append(Related(launch.span, _launched(world)))
                else:
                    world = yaml_world
                    if world_node is not None:
                        related.append(Related(doc.span(world_node), f"num_processes {world}"))
                    related.append(Related(launch.span, "launched here"))
                uses.setdefault(ds_path, []).append(DeepSpeedUse(world, related, path, scripts.get(id(launch)), launch.args,
                                                                 launch_configs.get(id(launch))))
        return links, uses


def _bound_configs(project: ProjectModel, script: Path):
    """(SourceText, [BoundConfig]) of a training script that names a DeepSpeed config in
    code, or None; scripts whose text never says "deepspeed"/"hf_ds_config" are not parsed."""
    from cfgfix.analysis.training_script import script_facts

    try:
        data = project._overrides.get(script)
        data = data if data is not None else read_file(script, limit=MAX_PYTHON_BYTES)
    except (OSError, ValueError):
        return None
    if b"deepspeed" not in data.lower() and b"hf_ds_config" not in data:
        return None
    found = script_facts(project, script)
    if found is None:
        return None
    configs = [config for config in found[1].bound_configs if not config.inline]
    return (found[0], configs) if configs else None


def config_format(path: Path, data: bytes) -> str:
    """"json" or "yaml" for a config file: by its suffix when it has a config suffix, else
    by its content (a config saved as `ds.sh` or `accelerate.cfg`): JSON when it opens with
    `{`; YAML otherwise (which also reads most JSON)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    return "json" if data.lstrip()[:1] == b"{" else "yaml"


def _launched(world: int | None) -> str:
    return f"launched here with {world} processes" if world is not None else "launched here"


def accelerate_world_size(doc):
    """(world size, the node that states it) from an accelerate config document:
    `num_processes` counts every machine; `distributed_type: NO` runs one process."""
    root = doc.root
    kind = root.get("distributed_type")
    if kind is not None and kind.value == "NO":
        return 1, kind
    node = root.get("num_processes")
    if node is None or node.kind != "scalar":
        return None, None
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None, None
    return value, node


def _accelerate_world_size(written: str, launch_file: Path, root: Path) -> int | None:
    from cfgfix.documents.launches import accelerate_config_world_size

    path = _resolve(written, launch_file, root)
    if path is None:
        return None
    try:
        return accelerate_config_world_size(read_file(path).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, absurd numbers or nesting
        return None


def _shallow_copy(model: ProjectModel) -> ProjectModel:
    """`copy.copy(model)`, without importing `copy` on every check (issue 15)."""
    import copy

    return copy.copy(model)
