"""Training launches recognised in parsed launch scripts.

`find_launches` reads each command of a `ShellDocument`, strips wrappers (`nohup`, `env A=B`,
`srun ...`), and recognises `accelerate launch`, `torchrun` / `python -m torch.distributed.run`,
`deepspeed` and plain `python script.py`. Numbers are reported only when they are provable
from the file: a literal, or a variable whose last assignment before the launch is a literal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from cfgfix.core import Span
from cfgfix.documents.shell import Assignment, Command, ShellDocument, Word, env_wrapper_assignments

LAUNCHERS = ("accelerate", "torchrun", "deepspeed", "python")


@dataclass(frozen=True)
class Launch:
    launcher: str  # "accelerate" | "torchrun" | "deepspeed" | "python"
    script: Word | None  # None for `-m module` launches
    module: str | None
    script_args: tuple[Word, ...]
    # As stated: --num_processes (accelerate: the TOTAL over all machines),
    # --nproc_per_node (torchrun), --num_gpus (deepspeed, per node).
    num_processes: int | None
    num_machines: int | None  # --num_machines / --nnodes / --num_nodes
    world_size: int | None  # processes in total; 1 for plain python; None when unknown
    config_files: dict[str, Word]  # "accelerate" | "deepspeed" | "config"
    env: dict[str, str]
    command: Command


def find_launches(doc: ShellDocument) -> list[Launch]:
    launches = []
    for command in doc.commands:
        launch = _launch(doc, command)
        if launch is not None:
            launches.append(launch)
    return launches


def accelerate_config_world_size(text: str) -> int | None:
    """World size an accelerate config YAML states. accelerate's `num_processes` already
    counts every machine (`launch` runs `num_processes // num_machines` per node), so it is
    not multiplied by `num_machines`; `distributed_type: NO` runs one process."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("distributed_type") == "NO":
        return 1
    value = data.get("num_processes")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


# --------------------------------------------------------------------------- wrappers

_PYTHON = re.compile(r"python(?:\d+(?:\.\d+)*)?")
_WRAPPERS = {  # run the command that follows their own options
    "nohup", "exec", "time", "command", "builtin", "setsid", "sudo", "srun", "mpirun",
    "mpiexec", "timeout", "nice", "ionice", "taskset", "numactl", "stdbuf", "unbuffer",
    "xvfb-run",
}
_RUNNERS = {"uv", "poetry", "pipenv", "conda", "mamba", "micromamba", "pdm", "hatch", "rye"}


def _program(word: Word) -> str:
    return word.text.rsplit("/", 1)[-1]


def _is_launcher(word: Word) -> bool:
    name = _program(word)
    return name in ("accelerate", "accelerate-launch", "torchrun", "deepspeed", "env") or bool(
        _PYTHON.fullmatch(name)
    )


def _unwrap(words: tuple[Word, ...]) -> int | None:
    """Index of the launcher word behind any wrappers, or None."""
    i = 0
    while i < len(words):
        name = _program(words[i])
        if name == "env":
            i += 1 + len(env_wrapper_assignments(words[i:]))
            while i < len(words) and words[i].text.startswith("-"):
                i += 2 if words[i].text in ("-u", "--unset", "-C", "--chdir") else 1
            continue
        if name in _WRAPPERS or (name in _RUNNERS and i + 1 < len(words) and words[i + 1].text == "run"):
            # Their options vary (`srun -N 2`, `timeout 1h`): skip to the next launcher word.
            i = next((j for j in range(i + 1, len(words)) if _is_launcher(words[j])), len(words))
            continue
        return i
    return None


# --------------------------------------------------------------------------- options

# Flags that take no value; any other option is assumed to take one unless the next word
# is an option or a `.py` script.
_ACCELERATE_FLAGS = {
    "cpu", "multi_gpu", "tpu", "ipex", "mps", "use_deepspeed", "use_fsdp", "use_megatron_lm",
    "use_xpu", "m", "module", "no_python", "q", "quiet", "debug", "same_network",
    "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation",
    "enable_cpu_affinity", "tpu_use_cluster", "tpu_use_sudo", "downcast_bf16", "h", "help",
}
_TORCHRUN_FLAGS = {
    "standalone", "no_python", "m", "module", "run_path", "use_env", "virtual_local_rank",
    "h", "help",
}
_DEEPSPEED_FLAGS = {
    "no_python", "module", "no_local_rank", "no_ssh_check", "force_multi", "save_pid",
    "elastic_training", "bind_cores_to_rank", "no_ssh", "h", "help",
}
_VALUE_OPTIONS = {"num_processes", "nproc_per_node", "num_gpus", "num_machines", "nnodes", "num_nodes"}
_TOOL_MODULES = {
    "pip", "venv", "virtualenv", "ensurepip", "pytest", "unittest", "http.server", "json.tool",
    "site", "pydoc", "compileall", "py_compile", "timeit", "build", "twine", "pre_commit",
    "black", "ruff", "mypy", "flake8", "isort", "pylint", "ipykernel", "jupyter", "notebook",
    "tensorboard", "pip._internal", "wheel", "setuptools", "huggingface_hub", "gdown",
}
_CONFIG_OPTIONS = {"config", "config_file", "config_path", "c"}
_DEEPSPEED_OPTIONS = {"deepspeed", "deepspeed_config", "deepspeed_config_file"}


def _key(option: str) -> str:
    """`--nproc-per-node` and `--nproc_per_node` are the same option."""
    return option.lstrip("-").replace("-", "_")


def _after_equals(word: Word) -> Word:
    """The `value` of a `--key=value` word, with its own span when the key is unquoted."""
    text_at, raw_at = word.text.index("="), word.raw.find("=")
    value = word.text[text_at + 1:]
    if raw_at < 0 or word.raw[:raw_at] != word.text[:text_at] or "\n" in word.raw[:raw_at]:
        return Word(value, word.raw, word.span)  # `"--key=v"`: no exact span for the value alone
    span = word.span
    sub = Span(span.path, span.line, span.column + raw_at + 1, span.end_line, span.end_column,
               span.start + raw_at + 1, span.end)
    return Word(value, word.raw[raw_at + 1:], sub)


def _options(words: tuple[Word, ...], flags: set[str]) -> tuple[dict[str, Word | None], int]:
    """Launcher options before the script: ({key: value word or None}, index of the script)."""
    opts: dict[str, Word | None] = {}
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return opts, i + 1
        if not text.startswith("-") or text == "-":
            break
        if text.startswith("--") and "=" in text:
            opts[_key(text.split("=", 1)[0])] = _after_equals(words[i])
            i += 1
            continue
        key = _key(text)
        nxt = words[i + 1] if i + 1 < len(words) else None
        takes_value = key not in flags and nxt is not None and not nxt.text.startswith("-")
        if takes_value and key not in _VALUE_OPTIONS and nxt.text.endswith(".py"):
            takes_value = False  # `--unknown_flag train.py`
        opts[key] = nxt if takes_value else None
        i += 2 if takes_value else 1
    return opts, i


def _script_configs(args: tuple[Word, ...]) -> dict[str, Word]:
    """Config files named in the training script's own arguments."""
    found: dict[str, Word] = {}
    for i, word in enumerate(args):
        text = word.text
        if not text.startswith("-"):
            continue
        if text.startswith("--") and "=" in text:
            key, value = _key(text.split("=", 1)[0]), _after_equals(word)
        else:
            nxt = args[i + 1] if i + 1 < len(args) else None
            key, value = _key(text), nxt if nxt is not None and not nxt.text.startswith("-") else None
        if value is None or not value.text:
            continue  # DeepSpeed's own `--deepspeed` is a flag before `--deepspeed_config F`
        if key in _DEEPSPEED_OPTIONS:
            found["deepspeed"] = value
        elif key in _CONFIG_OPTIONS and (key != "c" or not text.startswith("--")):
            found["config"] = value
    if "config" not in found and len(args) == 1 and args[0].text.endswith((".json", ".yaml", ".yml")):
        found["config"] = args[0]  # HfArgumentParser: `train.py args.json`
    return found


# --------------------------------------------------------------------------- numbers

_SETTERS = ("export", "plain", "env")  # prefix assignments last for one command only
_VARIABLE = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)(?::?[-=][^}]*)?\})")


def _number(doc: ShellDocument, word: Word | None, at: Span, depth: int = 0) -> int | None:
    """The literal int `word` certainly holds at `at`, or None."""
    if word is None or "'" in word.raw or "\\" in word.raw or depth > 5:
        return None
    text = word.text.strip()
    if text.isdigit() and text.isascii():
        return int(text)
    match = _VARIABLE.fullmatch(text)
    if match is None:
        return None
    name = match.group(1) or match.group(2)
    last = None
    for assignment in doc.assignments:
        if assignment.span.start >= at.start:
            break
        if assignment.name == name and assignment.kind in _SETTERS and doc.reaches(assignment, at):
            last = assignment
    # `${N:-8}` with N never assigned here: the environment may set it, so stay unsure.
    if last is None or not doc.visible(last, at) or doc.clobbered(name, last.span.start, at.start):
        return None
    return _number(doc, last.value, last.span, depth + 1)


def _nodes(doc: ShellDocument, word: Word | None, at: Span) -> int | None:
    """`--nnodes 2`, `--nnodes 2:2` (a fixed elastic range); `1:4` is unknown."""
    if word is not None and ":" in word.text:
        low, _, high = word.text.partition(":")
        return int(low) if low == high and low.isdigit() else None
    return _number(doc, word, at)


def _env(doc: ShellDocument, command: Command) -> dict[str, str]:
    """Variables certainly set for `command`: the last assignment of each name before it,
    when that one ran on the way to the command and nothing changed the name since."""
    last: dict[str, Assignment] = {}
    for assignment in doc.assignments:
        if assignment.span.start >= command.span.start:
            break
        if assignment.kind in _SETTERS and doc.reaches(assignment, command.span):
            last[assignment.name] = assignment
    env = {
        name: a.value.text
        for name, a in last.items()
        if doc.visible(a, command.span) and not doc.clobbered(name, a.span.start, command.span.start, any_name=False)
    }
    for assignment in command.env:
        env[assignment.name] = assignment.value.text
    for word in env_wrapper_assignments(command.words):
        name, _, value = word.text.partition("=")
        env[name] = value
    return env


# --------------------------------------------------------------------------- launchers


def _launch(doc: ShellDocument, command: Command) -> Launch | None:
    start = _unwrap(command.words)
    if start is None:
        return None
    name, rest = _program(command.words[start]), command.words[start + 1:]
    if name == "accelerate":
        if not rest or rest[0].text != "launch":
            return None
        return _accelerate(doc, command, rest[1:])
    if name == "accelerate-launch":
        return _accelerate(doc, command, rest)
    if name == "torchrun":
        return _torchrun(doc, command, rest)
    if name == "deepspeed":
        return _deepspeed(doc, command, rest)
    if _PYTHON.fullmatch(name):
        return _python(doc, command, rest)
    return None


def _make(doc, command, launcher, opts, target, args, processes, machines, world, module) -> Launch:
    configs = _script_configs(args)
    if launcher == "accelerate":  # the launcher's own options win over the script's
        if opts.get("config_file"):
            configs["accelerate"] = opts["config_file"]
        if opts.get("deepspeed_config_file"):
            configs["deepspeed"] = opts["deepspeed_config_file"]
    return Launch(
        launcher=launcher,
        script=None if module else target,
        module=module,
        script_args=tuple(args),
        num_processes=processes,
        num_machines=machines,
        world_size=world,
        config_files=configs,
        env=_env(doc, command),
        command=command,
    )


def _module(opts: dict, target: Word, *keys: str) -> str | None:
    """The module name when the launcher was told the target is one (`-m` / `--module`)."""
    return target.text if any(key in opts for key in keys) else None


def _accelerate(doc: ShellDocument, command: Command, words: tuple[Word, ...]) -> Launch | None:
    opts, i = _options(words, _ACCELERATE_FLAGS)
    if i >= len(words):
        return None
    at = command.span
    processes = _number(doc, opts.get("num_processes"), at)
    machines = _number(doc, opts.get("num_machines"), at)
    world = processes  # accelerate's --num_processes already counts every machine
    if "cpu" in opts and world != 1:
        world = None  # `--cpu --num_processes 2` starts one process without mpirun
    module = _module(opts, words[i], "m", "module")
    return _make(doc, command, "accelerate", opts, words[i], words[i + 1:], processes, machines, world, module)


def _torchrun(doc: ShellDocument, command: Command, words: tuple[Word, ...]) -> Launch | None:
    opts, i = _options(words, _TORCHRUN_FLAGS)
    if i >= len(words):
        return None
    at = command.span
    processes = _number(doc, opts.get("nproc_per_node"), at)  # `gpu` / `auto`: unknown
    machines = _nodes(doc, opts.get("nnodes"), at)
    if "nnodes" not in opts and "standalone" in opts:
        machines = 1
    world = _product(processes, machines, stated="nnodes" in opts)
    module = _module(opts, words[i], "m", "module")
    return _make(doc, command, "torchrun", opts, words[i], words[i + 1:], processes, machines, world, module)


def _deepspeed(doc: ShellDocument, command: Command, words: tuple[Word, ...]) -> Launch | None:
    opts, i = _options(words, _DEEPSPEED_FLAGS)
    if i >= len(words):
        return None
    at = command.span
    processes = _number(doc, opts.get("num_gpus"), at)
    machines = _number(doc, opts.get("num_nodes"), at)
    world = _product(processes, machines, stated="num_nodes" in opts)
    module = _module(opts, words[i], "module")
    return _make(doc, command, "deepspeed", opts, words[i], words[i + 1:], processes, machines, world, module)


def _product(processes: int | None, machines: int | None, *, stated: bool) -> int | None:
    """Processes per node times nodes; a node count that is stated but unknown spoils it."""
    if processes is None or (stated and machines is None):
        return None
    return processes * (machines or 1)


def _python(doc: ShellDocument, command: Command, words: tuple[Word, ...]) -> Launch | None:
    i = 0
    while i < len(words):
        text = words[i].text
        if text.startswith("-m"):  # `-m pkg.mod` or `-mpkg.mod`
            module, args = (text[2:], words[i + 1:]) if len(text) > 2 else (
                words[i + 1].text if i + 1 < len(words) else "", words[i + 2:])
            return _python_module(doc, command, module, words[i], args)
        if text.startswith("-c") or text in ("-", "-V", "--version", "-h", "--help"):
            return None  # inline code, stdin, or no script at all
        if text in ("-W", "-X", "-Q", "--check-hash-based-pycs"):
            i += 2
        elif text.startswith("-"):
            i += 1
        else:
            return _make(doc, command, "python", {}, words[i], words[i + 1:], None, None, 1, None)
    return None


def _python_module(doc, command, module: str, target: Word, args: tuple[Word, ...]) -> Launch | None:
    if module in ("torch.distributed.run", "torch.distributed.launch"):
        return _torchrun(doc, command, args)
    if module == "accelerate.commands.launch":
        return _accelerate(doc, command, args)
    if module == "deepspeed.launcher.runner":
        return _deepspeed(doc, command, args)
    if not module or module in _TOOL_MODULES or module.startswith("$"):
        return None  # tools (`pip`, `pytest`) and modules we cannot name are no launches
    return _make(doc, command, "python", {}, target, args, None, None, 1, module)
