"""Training launches recognised in parsed launch scripts.

`find_launches` reads each command of a `ShellDocument`, strips wrappers (`nohup`, `env A=B`,
`srun ...`), and recognises `accelerate launch`, `torchrun` / `python -m torch.distributed.run`,
`deepspeed` and plain `python script.py`. Numbers are reported only when they are provable
from the file: a literal, a variable whose last assignment before the launch is a literal,
shell arithmetic over those (`$((GPUS * 2))`), or the environment where the launcher reads
it (`CUDA_VISIBLE_DEVICES` for torchrun `--nproc_per_node gpu`, `_from_environment`). A
command that starts with a variable (`$LAUNCHER $CMD`) is read as the shell expands it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping

from cfgfix.core import Span
from cfgfix.documents.shell import Assignment, Command, ShellDocument, Word, env_wrapper_assignments
from cfgfix.records import dataclass, field, replace


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
    env: Mapping[str, str]  # read-only
    command: Command
    # accelerate's own options as written (`--mixed_precision bf16`, `--use_deepspeed`: None):
    # each beats the same key of its --config_file YAML (commands/launch.py, accelerate 1.15.0)
    options: Mapping[str, Word | None] = field(default_factory=dict)


def find_launches(doc: ShellDocument) -> list[Launch]:
    found = []
    for command in doc.commands:
        copied = _copied(doc, command)
        recognised = _recognise(command, copied)
        if recognised is not None or (command.words and command.words[0].raw.startswith("$")):
            found.append((command, recognised, copied))  # `$LAUNCHER $CMD`: known once expanded
    if not found:
        return []
    variables = _Variables(doc)  # one forward pass over the file for all launches
    return [launch for command, f, copied in found if (launch := variables.launch(command, f, copied)) is not None]


def accelerate_config_world_size(text: str) -> int | None:
    """World size an accelerate config YAML states. accelerate's `num_processes` already
    counts every machine (`launch` runs `num_processes // num_machines` per node), so it is
    not multiplied by `num_machines`; `distributed_type: NO` runs one process."""
    try:
        import yaml  # only when a launch names an accelerate config

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
_MULTIPLIERS = {"srun", "mpirun", "mpiexec"}  # start one copy per task
_PYTHON_VARIABLE = re.compile(r"\$(?:PYTHON\d*|PY)|\$[({](?:PYTHON\d*|PY)(?:_BIN|_EXE|_CMD)?[)}]")
_RUNNERS = {"uv", "poetry", "pipenv", "conda", "mamba", "micromamba", "pdm", "hatch", "rye"}


def _program(word: Word) -> str:
    return word.text.rsplit("/", 1)[-1]


def _is_python(word: Word) -> bool:
    """`python3.11`, `/opt/venv/bin/python`, and `$(PYTHON)` / `$PYTHON` (Makefiles, scripts)."""
    return bool(_PYTHON.fullmatch(_program(word)) or _PYTHON_VARIABLE.fullmatch(word.text))


# Training tools with their own command line: `llamafactory-cli train cfg.yaml` (`lmf` is its
# shortcut from 0.9.0: the wheels' entry_points.txt), `axolotl train cfg.yml`. The YAML is the
# whole training setup (HF Trainer underneath); the tool decides its processes
# (cfgfix/training/frameworks reads how).
TOOL_COMMANDS = {"llamafactory-cli": "llamafactory.train", "lmf": "llamafactory.train", "axolotl": "axolotl.cli.train"}
# `trl sft --model_name_or_path ... --config x.yaml`: trl's CLI runs trl/scripts/<command>.py
# under `accelerate launch` (trl 1.16.0 trl/cli/accelerate_launcher.py)
TRL_COMMANDS = frozenset({"sft", "dpo", "grpo", "kto", "reward", "rloo"})


def _is_launcher(word: Word) -> bool:
    name = _program(word)
    return (name in ("accelerate", "accelerate-launch", "torchrun", "deepspeed", "env", "trl") or name in TOOL_COMMANDS
            or _is_python(word))


def _unwrap(words: tuple[Word, ...]) -> tuple[int, bool] | None:
    """Index of the launcher word behind any wrappers, and whether a wrapper that starts
    several copies of it (`srun`, `mpirun`) came first; None when there is no launcher."""
    i, copies = 0, False
    while i < len(words):
        name = _program(words[i])
        if name == "env":
            i += 1 + len(env_wrapper_assignments(words[i:]))
            while i < len(words) and words[i].text.startswith("-"):
                i += 2 if words[i].text in ("-u", "--unset", "-C", "--chdir") else 1
            continue
        if name in _WRAPPERS or (name in _RUNNERS and i + 1 < len(words) and words[i + 1].text == "run"):
            # Their options vary (`srun -N 2`, `timeout 1h`): skip to the next launcher word.
            copies = copies or name in _MULTIPLIERS
            i = next((j for j in range(i + 1, len(words)) if _is_launcher(words[j])), len(words))
            continue
        return i, copies
    return None


# --------------------------------------------------------------------------- options

# Flags that take no value; any other option is assumed to take one unless the next word
# is an option or a `.py` script.
_ACCELERATE_FLAGS = {
    "cpu", "multi_gpu", "tpu", "ipex", "mps", "use_deepspeed", "use_fsdp", "use_megatron_lm",
    "use_xpu", "m", "module", "no_python", "q", "quiet", "debug", "same_network",
    "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation",
    "enable_cpu_affinity", "tpu_cluster", "no_tpu_cluster", "tpu_use_cluster", "tpu_use_sudo",
    "downcast_bf16", "fp8_use_autocast_during_eval", "h", "help",
}
_TORCHRUN_FLAGS = {
    "standalone", "no_python", "m", "module", "run_path", "use_env", "virtual_local_rank",
    "h", "help",
}
_DEEPSPEED_FLAGS = {
    "no_python", "module", "no_local_rank", "no_ssh_check", "force_multi", "save_pid",
    "elastic_training", "bind_cores_to_rank", "no_ssh", "h", "help",
}
# torchrun and deepspeed parse with argparse's default allow_abbrev (`--nnode` is `--nnodes`);
# accelerate turns abbreviations off.
_TORCHRUN_OPTIONS = _TORCHRUN_FLAGS | {
    "nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port", "local_addr",
    "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "max_restarts", "monitor_interval",
    "start_method", "role", "log_dir", "redirects", "tee", "local_ranks_filter", "logs_specs",
}
_DEEPSPEED_OPTIONS_ALL = _DEEPSPEED_FLAGS | {
    "hostfile", "include", "exclude", "num_nodes", "min_elastic_nodes", "max_elastic_nodes",
    "num_gpus", "master_port", "master_addr", "node_rank", "launcher", "launcher_args",
    "enable_each_rank_log", "autotuning", "bind_core_list", "ssh_port", "comment", "account",
}
_VALUE_OPTIONS = {"num_processes", "nproc_per_node", "num_gpus", "num_machines", "nnodes", "num_nodes"}
_TOOL_MODULES = {
    "pip", "venv", "virtualenv", "ensurepip", "pytest", "unittest", "http.server", "json.tool",
    "site", "pydoc", "compileall", "py_compile", "timeit", "build", "twine", "pre_commit",
    "black", "ruff", "mypy", "flake8", "isort", "pylint", "ipykernel", "jupyter", "notebook",
    "tensorboard", "pip._internal", "wheel", "setuptools", "huggingface_hub", "gdown",
}
_CONFIG_OPTIONS = {"config", "config_file", "config_path", "c"}
# accelerate launch options that take the place of a key of its --config_file YAML
# (`_validate_launch_command`, accelerate 1.15.0: a YAML key fills an option only when the
# command line left it unset; any of the distributed flags replaces `distributed_type`)
ACCELERATE_OVERRIDES = (
    "mixed_precision", "use_deepspeed", "use_fsdp", "multi_gpu", "cpu", "tpu", "use_megatron_lm",
    "num_processes", "num_machines", "deepspeed_config_file", "zero_stage", "offload_optimizer_device",
    "offload_param_device", "gradient_accumulation_steps", "fsdp_sharding_strategy",
)
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
    span = word.span  # the key holds no newline, so the value starts on the same line
    sub = replace(span, column=span.column + raw_at + 1, start=span.start + raw_at + 1)
    return Word(value, word.raw[raw_at + 1:], sub)


def _options(
    words: tuple[Word, ...], flags: set[str], known: set[str] = frozenset()
) -> tuple[dict[str, Word | None], int]:
    """Launcher options before the script: ({key: value word or None}, index of the script).
    `known`: the launcher's options, when it accepts unique prefixes of them."""

    def canonical(option: str) -> str:
        key = _key(option)
        matches = [k for k in known if k.startswith(key)] if key not in known and len(key) > 1 else []
        return matches[0] if len(matches) == 1 else key

    opts: dict[str, Word | None] = {}
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return opts, i + 1
        if not text.startswith("-") or text == "-":
            break
        if text.startswith("--") and "=" in text:
            opts[canonical(text.split("=", 1)[0])] = _after_equals(words[i])
            i += 1
            continue
        key = canonical(text)
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


# --------------------------------------------------------------------------- variables

_SETTERS = ("export", "plain", "env")  # prefix assignments last for one command only
_VARIABLE = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)(?::?[-=][^}]*)?\})")
_UNSET = object()


class _Variables:
    """What each variable certainly holds, replayed in file order up to each launch.

    `values[name]` is the assignment in force, or None once the name took a value we cannot
    know (set in a branch, loop or function body that may not have run, `read`, `for NAME`).
    What a separate shell set (a subshell, a Makefile recipe line, a Dockerfile RUN) is undone
    when it ends. `values["*"]` is the offset of the last `source`/`eval`."""

    def __init__(self, doc: ShellDocument) -> None:
        self.doc = doc
        self.values: dict[str, object] = {}
        self.exported = _EnvHistory()  # what `values` held as text, at every step: each launch's env
        self.numbers: dict[int, int | None] = {}  # assignment start -> its int value when it ran
        self.frames: list[tuple[int, dict[str, object]]] = []  # open blocks, values before them
        events = [(a.span.start, 0, a) for a in doc.assignments if a.kind in _SETTERS]
        events += [(offset, 1, name) for name, offset in doc.clobbers]
        self.events = sorted(events, key=lambda e: e[:2])
        self.next = 0
        self.inner_from: int | None = None  # start of the single-quoted inline script being read
        self._reading: Span | None = None  # the word whose variables are being read
        self.exported_names: dict[str, int] = {}  # `export NAME` / `declare -x NAME` / `set -a` ("*"): first offset
        for command in doc.commands:
            words = [w.text for w in command.words]
            if not words:
                continue
            if words[0] == "export" or (words[0] in ("declare", "typeset") and "-x" in words[1:]):
                for word in words[1:]:
                    if not word.startswith("-"):
                        self.exported_names.setdefault(word.split("=", 1)[0], command.span.start)
            elif words[0] == "set" and any(w.startswith("-") and "a" in w[1:] for w in words[1:]):
                self.exported_names.setdefault("*", command.span.start)

    def launch(self, command: Command, found: _Found | None, copied: bool = False) -> Launch | None:
        self._replay_until(command.span.start)
        self._enter(self.doc.scopes.get(command.span.start, ()))
        # inside `srun bash -c '...'` the inner shell sees the outer variables only if exported
        self.inner_from = next((start for start, end in self.doc.environment_only
                                if start <= command.span.start < end), None)
        expanded = self._expand(command)
        if expanded is not command:  # `torchrun $DISTRIBUTED_ARGS train.py`, `srun bash -c "$LAUNCHER $CMD"`
            refound = _recognise(expanded, copied)
            if refound is not None:
                command, found = expanded, refound
        if found is None:
            return None
        env = self.env(command)
        processes = self.number(found.processes)
        if processes is None:
            processes = _from_environment(found, env)
        machines = self.nodes(found.machines) if found.machines_stated else found.machines_default
        if found.counting in ("single", "unknown"):
            world = 1 if found.counting == "single" else None
        elif found.counting == "hosts":  # deepspeed with a hostfile: project.py reads it
            world = include_world_size(found.include, processes)
        elif found.counting == "total":  # accelerate's --num_processes counts every machine
            world = processes if not (found.cpu and processes != 1) else None
        elif processes is None or (found.machines_stated and machines is None):
            world = None  # a node count that is stated but unknown spoils the product
        else:
            world = processes * (machines or 1)
        configs = _script_configs(found.args)
        configs.update(found.configs)  # the launcher's own options win over the script's
        return Launch(
            launcher=found.launcher,
            script=None if found.module else found.target,
            module=found.module,
            script_args=found.args,
            num_processes=processes,
            num_machines=machines,
            world_size=world,
            config_files=configs,
            env=env,
            command=command,
            options=found.options,
        )

    # -- state
    def _replay_until(self, offset: int) -> None:
        while self.next < len(self.events) and self.events[self.next][0] < offset:
            start, _, item = self.events[self.next]
            self.next += 1
            self._enter(self.doc.scopes.get(start, ()))
            if isinstance(item, Assignment):
                self.numbers[start] = self.number(item.value)  # `N=$N` reads the old N
                self._set(item.name, item)
            else:
                self._set(item, start if item == "*" else None)

    def _set(self, name: str, value: object, before: object = _UNSET, *, known: bool = False) -> None:
        if self.frames:
            self.frames[-1][1].setdefault(name, before if known else self.values.get(name, _UNSET))
        self.values[name] = value
        self.exported.record(name, value)

    def _enter(self, scope: tuple[int, ...]) -> None:
        keep = 0
        while keep < min(len(self.frames), len(scope)) and self.frames[keep][0] == scope[keep]:
            keep += 1
        while len(self.frames) > keep:
            self._leave()
        self.frames.extend((block, {}) for block in scope[keep:])

    def _leave(self) -> None:
        block, before = self.frames.pop()
        for name, old in before.items():
            if block < 0:  # a separate shell: nothing it set survives
                if old is _UNSET:
                    self.values.pop(name, None)
                else:
                    self.values[name] = old
                self.exported.record(name, old)
            else:  # a block that may not have run: the name is unknown (a `source` stays)
                self._set(name, self.values[name] if name == "*" else None, old, known=True)

    def _expand(self, command: Command) -> Command:
        """Word-split unquoted `$NAME` words whose value is certainly a literal string, as
        the shell does (`ARGS="--nproc_per_node 8 --nnodes 1"; torchrun $ARGS x.py`). The new
        words point at the variable's token. Anything unsure stays as written."""
        words: list[Word] = []
        changed = False
        for word in command.words:
            match = _VARIABLE.fullmatch(word.raw) if word.raw.startswith("$") else None
            assignment = self.values.get(match.group(1) or match.group(2)) if match else None
            sourced = self.values.get("*")
            if (
                not isinstance(assignment, Assignment)
                or self._hidden(assignment, word.span)
                or (isinstance(sourced, int) and sourced > assignment.span.start)
                or any(mark in assignment.value.raw for mark in ("$(", "`"))
                or ":" in word.raw  # `${X:-default}`: the default may be what runs
            ):
                words.append(word)
                continue
            pieces = [p for p in assignment.value.text.split() if p != "\\"]
            if len(pieces) < 2 or not self._settled(pieces, assignment):
                words.append(word)  # one word needs no splitting: `number()` reads it as assigned
                continue
            words.extend(Word(piece, piece, word.span) for piece in pieces)
            changed = True
        return replace(command, words=tuple(words)) if changed else command

    def _settled(self, pieces: list[str], assignment: Assignment) -> bool:
        """The shell expanded `$N` inside ARGS when ARGS was assigned; reading N now is the
        same only if N was not assigned again since."""
        for piece in pieces:
            match = _VARIABLE.fullmatch(piece)
            if match is None:
                continue
            current = self.values.get(match.group(1) or match.group(2))
            # a name assigned since reads differently now; one never assigned here (the
            # environment's `$SLURM_NNODES`) or unknown stays as written, and reads as unknown
            if isinstance(current, Assignment) and current.span.start > assignment.span.start:
                return False
        return True

    def _hidden(self, assignment: Assignment, at: Span | None = None) -> bool:
        """An outer variable the inner shell of a single-quoted `bash -c` script does not see:
        assigned outside it without `export` (unless the outer shell spliced it in, `'"$X"'`)."""
        if self.inner_from is None or assignment.kind == "export" or assignment.span.start >= self.inner_from:
            return False
        if at is not None and any(start <= at.start < end for start, end in self.doc.outer_splices):
            return False
        marks = [self.exported_names.get(name) for name in (assignment.name, "*")]
        return not any(mark is not None and mark < self.inner_from for mark in marks)

    def _substituted(self, value: Word) -> str:
        """A prefix assignment's value as the shell expands it when the command runs:
        `CUDA_VISIBLE_DEVICES=$VISIBLE_DEVICES` with `VISIBLE_DEVICES=5,6,7` set above (exported
        or not) is `5,6,7`; anything unsure stays as written (and reads as unknown)."""
        match = _VARIABLE.fullmatch(value.text) if value.text.startswith("$") and "'" not in value.raw and ":" not in value.text else None
        assignment = self.values.get(match.group(1) or match.group(2)) if match else None
        sourced = self.values.get("*")
        if (not isinstance(assignment, Assignment) or (isinstance(sourced, int) and sourced > assignment.span.start)
                or self._hidden(assignment, value.span) or any(mark in assignment.value.raw for mark in ("$(", "`", "$"))):
            return value.text
        return assignment.value.text

    # -- queries
    def number(self, word: Word | None) -> int | None:
        """The literal int `word` certainly holds now, or None."""
        if word is None or "'" in word.raw or "\\" in word.raw:
            return None
        self._reading = word.span
        text = word.text.strip()
        if text.isdigit() and text.isascii():
            return int(text) if len(text) <= 30 else None  # no launch has 10^30 processes
        if text.startswith("$((") and text.endswith("))"):  # `$((128/4/1))`, `$(( NUM_GPUS * 2 ))`
            value = arithmetic(text[3:-2], self._known)
            return value if value is not None and 0 <= value < 10 ** 30 else None
        match = _VARIABLE.fullmatch(text)
        if match is None:
            return None
        return self._known(match.group(1) or match.group(2))

    def _known(self, name: str) -> int | None:
        """The int the variable `name` certainly holds now, or None."""
        # `${N:-8}` with N never assigned here: the environment may set it, so stay unsure.
        assignment = self.values.get(name)
        if not isinstance(assignment, Assignment) or self._hidden(assignment, self._reading):
            return None
        sourced = self.values.get("*")
        if isinstance(sourced, int) and sourced > assignment.span.start:
            return None
        return self.numbers.get(assignment.span.start)

    def nodes(self, word: Word | None) -> int | None:
        """`--nnodes 2`, `--nnodes 2:2` (a fixed elastic range); `1:4` is unknown."""
        if word is not None and ":" in word.text:
            low, _, high = word.text.partition(":")
            return int(low) if low == high and low.isdigit() and low.isascii() and len(low) <= 30 else None
        return self.number(word)

    def env(self, command: Command) -> Mapping[str, str]:
        own = {}
        for assignment in command.env:
            own[assignment.name] = self._substituted(assignment.value)
        for word in env_wrapper_assignments(command.words):
            name, _, value = word.text.partition("=")
            own[name] = value
        return _LaunchEnv(self.exported, self.exported.now(), own)


_ARITHMETIC_TOKEN = re.compile(r"\s*(?:(\d+)|\$?\{?([A-Za-z_]\w*)\}?|(\*\*|[-+*/%()]))")


def arithmetic(expression: str, lookup) -> int | None:
    """The value of a shell arithmetic expression of integers, variables (`N`, `$N`, `${N}`,
    their ints from `lookup`) and `+ - * / % **` with parentheses, as bash computes it (`/`
    and `%` truncate toward zero); None for anything else (an unknown variable, a division
    by zero, an operator outside these: `<<`, `?:`, `=`)."""
    tokens: list = []
    pos = 0
    expression = expression.strip()
    if len(expression) > 200:
        return None
    while pos < len(expression):
        match = _ARITHMETIC_TOKEN.match(expression, pos)
        if match is None or match.end() == pos:
            return None
        number, name, op = match.groups()
        if number is not None:
            tokens.append(int(number))
        elif name is not None:
            value = lookup(name)
            if value is None:
                return None
            tokens.append(value)
        else:
            tokens.append(op)
        pos = match.end()
        while pos < len(expression) and expression[pos].isspace():
            pos += 1
    at = 0

    def peek():
        return tokens[at] if at < len(tokens) else None

    def take():
        nonlocal at
        at += 1
        return tokens[at - 1]

    def unary(depth: int = 0):
        if depth > 50:
            raise ValueError
        token = peek()
        if token in ("-", "+"):
            take()
            value = unary(depth + 1)
            return -value if token == "-" else value
        if token == "(":
            take()
            value = sum_(depth + 1)
            if take() != ")":
                raise ValueError
            return value
        if isinstance(token, int):
            return take()
        raise ValueError

    def power(depth: int):
        base = unary(depth)
        if peek() == "**":
            take()
            exponent = power(depth + 1)
            if exponent < 0 or exponent > 64:
                raise ValueError
            return base ** exponent
        return base

    def product(depth: int):
        value = power(depth)
        while peek() in ("*", "/", "%"):
            op, right = take(), power(depth)
            if op == "*":
                value *= right
            elif right == 0:
                raise ValueError
            else:
                quotient = abs(value) // abs(right) * (1 if (value < 0) == (right < 0) else -1)
                value = quotient if op == "/" else value - right * quotient
        return value

    def sum_(depth: int = 0):
        value = product(depth)
        while peek() in ("+", "-"):
            op, right = take(), product(depth)
            value = value + right if op == "+" else value - right
        return value

    try:
        value = sum_()
    except (ValueError, IndexError, TypeError):
        return None
    return value if at == len(tokens) and abs(value) < 10 ** 30 else None


def visible_devices(text: str | None) -> int | None:
    """The GPUs `CUDA_VISIBLE_DEVICES` leaves visible (`0,1,2` -> 3; GPU/MIG UUIDs count
    too), or None when unset, empty, hidden (`-1`) or not a plain list (`$GPUS`)."""
    if not text:
        return None
    ids = [part.strip() for part in text.strip("'\"").split(",")]
    if not ids or not all(i.isdigit() or i.startswith(("GPU-", "MIG-")) for i in ids):
        return None
    return len(ids)


def _from_environment(found: _Found, env: Mapping[str, str]) -> int | None:
    """Processes per node the launcher takes from the environment when its flags leave the
    count open: torchrun `--nproc_per_node gpu|auto` (torch.cuda.device_count()) or
    PET_NPROC_PER_NODE (its option's environment default); accelerate with neither
    --num_processes nor --config_file (every visible GPU, `_validate_launch_command`,
    accelerate 1.15.0; a default config on the machine would decide instead); deepspeed with
    no --num_gpus, --include, --exclude, --num_nodes or hostfile (`--include localhost:` +
    CUDA_VISIBLE_DEVICES, launcher/runner.py, deepspeed 0.19.8)."""
    visible = visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    if found.launcher == "torchrun":
        if found.processes is not None:
            return visible if found.processes.text in ("gpu", "auto") else None
        pet = env.get("PET_NPROC_PER_NODE", "")
        if pet.isdigit() and len(pet) < 10:
            return int(pet)
        return visible if pet in ("gpu", "auto") else None
    if found.processes is not None:
        return None
    if found.launcher in ("accelerate", "trl") and "accelerate" not in found.configs and not found.cpu:
        return visible
    if found.launcher == "deepspeed" and found.counting == "per_node" and not found.machines_stated:
        return visible
    return None


class _EnvHistory:
    """Every value each variable took as text, in order (None: unset or unknown), so a launch's
    environment is a point in this history (`_LaunchEnv`) rather than a copy of every variable:
    a script that sets a new variable before each of its launches made them quadratic in time
    and memory (issue 24: a 1 MB run.sh with 6,400 launches, 67 s and 1.2 GB)."""

    def __init__(self) -> None:
        self.steps: dict[str, list[int]] = {}
        self.texts: dict[str, list[str | None]] = {}
        self.step = 0

    def record(self, name: str, value: object) -> None:
        self.steps.setdefault(name, []).append(self.step)
        self.texts.setdefault(name, []).append(value.value.text if isinstance(value, Assignment) else None)
        self.step += 1

    def now(self) -> int:
        return self.step

    def at(self, name: str, step: int) -> str | None:
        steps = self.steps.get(name)
        if not steps:
            return None
        i = bisect.bisect_left(steps, step) - 1
        return self.texts[name][i] if i >= 0 else None


class _LaunchEnv(Mapping):
    """A launch's environment: the variables the script certainly set before it (as of `step`
    in the history), then the command's own prefix assignments."""

    def __init__(self, history: _EnvHistory, step: int, own: dict[str, str]) -> None:
        self._history, self._step, self._own = history, step, own

    def __getitem__(self, name: str) -> str:
        if name in self._own:
            return self._own[name]
        text = self._history.at(name, self._step)
        if text is None:
            raise KeyError(name)
        return text

    def _names(self) -> list[str]:
        return [*self._own, *(n for n in self._history.steps if n not in self._own and self._history.at(n, self._step) is not None)]

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(dict(self))


# --------------------------------------------------------------------------- launchers


@dataclass
class _Found:
    """What a launch command says, before its variables are resolved."""

    launcher: str
    target: Word
    args: tuple[Word, ...]
    module: str | None = None
    processes: Word | None = None
    machines: Word | None = None
    machines_stated: bool = False
    machines_default: int | None = None
    counting: str = "per_node"  # "per_node" (x machines) | "total" (accelerate) | "single" | "unknown" | "hosts"
    include: str | None = None  # deepspeed --include, with counting "hosts"
    cpu: bool = False
    configs: dict[str, Word] = field(default_factory=dict)
    options: dict[str, Word | None] = field(default_factory=dict)  # accelerate's, for LaunchFacts


def _copied(doc: ShellDocument, command: Command) -> bool:
    """The command is in an inline script run once per task (`srun bash -c '...'`)."""
    return any(start <= command.span.start < end for start, end in doc.copied)


def _recognise(command: Command, copied: bool = False) -> _Found | None:
    unwrapped = _unwrap(command.words)
    if unwrapped is None:
        return None
    start, copies = unwrapped
    copies = copies or copied
    name, rest = _program(command.words[start]), command.words[start + 1:]
    if name == "accelerate":
        return _accelerate(rest[1:]) if rest and rest[0].text == "launch" else None
    if name == "accelerate-launch":
        return _accelerate(rest)
    if name == "torchrun":
        return _torchrun(rest)
    if name == "deepspeed":
        return _deepspeed(rest)
    if name in TOOL_COMMANDS:
        # `llamafactory-cli train cfg.yaml key=value ...`, `llamafactory-cli train --stage sft ...`,
        # `axolotl train cfg.yml --micro_batch_size 2`: processes decided by the tool (unknown here)
        if len(rest) < 2 or rest[0].text != "train":
            return None
        config = next((w for w in rest[1:] if w.text.lower().endswith((".yaml", ".yml", ".json"))), None)
        return _Found(name, rest[0], rest[1:], TOOL_COMMANDS[name], counting="unknown",
                      configs={"config": config} if config is not None else {})
    if name == "trl":
        return _trl(rest)
    if _is_python(command.words[start]):
        found = _python(rest)
        if found is not None and copies and found.counting == "single":
            found.counting = "unknown"  # `srun python train.py`: one process per task
        return found
    return None


# accelerate's options that `trl <command>` hands to `accelerate launch` (the words its own
# parser does not take: trl 1.16.0 cli/commands/training.py), and `--accelerate_config` (a file,
# else a config trl ships: cli/accelerate_config.py). Not the ones TrainingArguments shares
# (`--gradient_accumulation_steps` is the training script's).
_TRL_LAUNCH_OPTIONS = frozenset({"num_processes", "num_machines", "config_file", "accelerate_config", "mixed_precision",
                                 "use_deepspeed", "deepspeed_config_file", "zero_stage", "use_fsdp", "multi_gpu", "cpu"})
_TRL_LAUNCH_FLAGS = frozenset({"use_deepspeed", "use_fsdp", "multi_gpu", "cpu"})
# trl/accelerate_configs/*.yaml (trl 1.16.0): every one says num_processes 8
TRL_BUNDLED_ACCELERATE = {"zero1": 8, "zero2": 8, "zero3": 8, "fsdp1": 8, "fsdp2": 8, "multi_gpu": 8, "single_gpu": 8}


def _trl(rest: tuple[Word, ...]) -> _Found | None:
    """`trl sft --model_name_or_path m --num_processes 4 --config x.yaml`: trl's script under
    `accelerate launch`, with accelerate's options taken from among the script's flags."""
    if not rest or rest[0].text not in TRL_COMMANDS:
        return None
    args = rest[1:]
    opts: dict[str, Word | None] = {}
    config = None
    i = 0
    while i < len(args):
        text = args[i].text
        key, eq, _ = text.partition("=") if text.startswith("--") else ("", "", "")
        key = _key(key)
        if key == "config":
            config = _after_equals(args[i]) if eq else args[i + 1] if i + 1 < len(args) else None
        if key in _TRL_LAUNCH_OPTIONS:
            if key in _TRL_LAUNCH_FLAGS and not eq:
                opts[key] = None
            elif eq:
                opts[key] = _after_equals(args[i])
            elif i + 1 < len(args):
                opts[key] = args[i + 1]
                i += 1
        i += 1
    configs: dict[str, Word] = {"config": config} if config is not None else {}
    accelerate = opts.get("config_file") or opts.get("accelerate_config")
    processes = opts.get("num_processes")
    if accelerate is not None:
        configs["accelerate"] = accelerate
        bundled = TRL_BUNDLED_ACCELERATE.get(accelerate.text)
        if processes is None and bundled is not None and "accelerate_config" in opts:
            processes = Word(str(bundled), accelerate.raw, accelerate.span)  # the config trl ships
    if opts.get("deepspeed_config_file") is not None:
        configs["deepspeed"] = opts["deepspeed_config_file"]
    return _Found("trl", rest[0], args, f"trl.scripts.{rest[0].text}", processes=processes,
                  machines=opts.get("num_machines"), machines_stated="num_machines" in opts, counting="total",
                  cpu="cpu" in opts, configs=configs,
                  options={key: opts[key] for key in ACCELERATE_OVERRIDES if key in opts})


def _module(opts: dict, target: Word, *keys: str) -> str | None:
    """The module name when the launcher was told the target is one (`-m` / `--module`)."""
    return target.text if any(key in opts for key in keys) else None


def _accelerate(words: tuple[Word, ...]) -> _Found | None:
    opts, i = _options(words, _ACCELERATE_FLAGS)
    if i >= len(words):
        return None
    configs = {}
    if opts.get("config_file"):
        configs["accelerate"] = opts["config_file"]
    if opts.get("deepspeed_config_file"):
        configs["deepspeed"] = opts["deepspeed_config_file"]
    return _Found(
        "accelerate", words[i], words[i + 1:], _module(opts, words[i], "m", "module"),
        processes=opts.get("num_processes"), machines=opts.get("num_machines"),
        machines_stated="num_machines" in opts, counting="total", cpu="cpu" in opts, configs=configs,
        options={key: opts[key] for key in ACCELERATE_OVERRIDES if key in opts},
    )


def _torchrun(words: tuple[Word, ...]) -> _Found | None:
    opts, i = _options(words, _TORCHRUN_FLAGS, _TORCHRUN_OPTIONS)
    if i >= len(words):
        return None
    return _Found(
        "torchrun", words[i], words[i + 1:], _module(opts, words[i], "m", "module"),
        processes=opts.get("nproc_per_node"),  # `gpu` / `auto` stay unknown
        machines=opts.get("nnodes"), machines_stated="nnodes" in opts,
        machines_default=1 if "standalone" in opts else None,
    )


def _deepspeed(words: tuple[Word, ...]) -> _Found | None:
    opts, i = _options(words, _DEEPSPEED_FLAGS, _DEEPSPEED_OPTIONS_ALL)
    if i >= len(words):
        return None
    found = _Found(
        "deepspeed", words[i], words[i + 1:], _module(opts, words[i], "module"),
        processes=opts.get("num_gpus"), machines=opts.get("num_nodes"), machines_stated="num_nodes" in opts,
    )
    if opts.get("hostfile") is not None:
        found.configs["hostfile"] = opts["hostfile"]  # the hosts and their slots: the project stage reads it
    both = "num_nodes" in opts and "num_gpus" in opts  # N hosts x G GPUs each, whatever the hostfile lists
    if "include" in opts or "exclude" in opts or ("hostfile" in opts and not both):
        # DeepSpeed's runner takes the hosts from the hostfile (its first --num_nodes, each
        # with --num_gpus GPUs or its slots) or from --include/--exclude: not a product of flags
        found.counting = "hosts"
        found.include = opts.get("include").text if opts.get("include") is not None and "exclude" not in opts else None
    return found


def include_world_size(include: str | None, per_host: int | None = None) -> int | None:
    """The processes `--include host1:0,1@host2:2` names (each host with its GPUs, or
    `per_host` each when --num_gpus is given), else None."""
    if not include or "$" in include:
        return None
    total = 0
    for part in include.split("@"):
        host, colon, slots = part.partition(":")
        if per_host is not None and host:
            total += per_host  # --num_gpus replaces each host's GPU list (runner.py)
            continue
        if not colon or not host or not slots:
            return None  # a host with all its GPUs: as many as it has, unknown here
        ids = [s for s in slots.split(",") if s.strip()]
        if not all(s.strip().isdigit() for s in ids):
            return None
        total += len(ids)
    return total or None


_PYTHON_FLAGS = set("bBdEiIOPqsSRuvx")  # interpreter switches that take no value


def _python(words: tuple[Word, ...]) -> _Found | None:
    """`python [switches] script.py args` or `python [switches] -m module args`."""
    i = 0
    while i < len(words):
        text = words[i].text
        if text in ("-", "--version", "--help"):
            return None  # stdin, or no script at all
        if text == "--" or not text.startswith("-"):
            i += text == "--"
            if i >= len(words) or _program(words[i]) == "setup.py":
                return None  # packaging, not training
            return _Found("python", words[i], words[i + 1:], counting="single")
        if text.startswith("--"):  # `--check-hash-based-pycs always`
            i += 2 if text == "--check-hash-based-pycs" else 1
            continue
        for at, switch in enumerate(text[1:], start=1):  # a cluster such as `-uBm`
            if switch in _PYTHON_FLAGS:
                continue
            rest = text[at + 1:]
            if switch == "m":
                if rest:
                    return _python_module(rest, words[i], words[i + 1:])
                if i + 1 < len(words):
                    return _python_module(words[i + 1].text, words[i + 1], words[i + 2:])
                return None
            if switch in "WX":  # their value is the rest of the word, or the next word
                i += 0 if rest else 1
                break
            return None  # `-c code`, `-V`, `-h`, or a switch we do not know
        i += 1
    return None


def _python_module(module: str, target: Word, args: tuple[Word, ...]) -> _Found | None:
    if module in ("torch.distributed.run", "torch.distributed.launch"):
        return _torchrun(args)
    if module == "accelerate.commands.launch":
        return _accelerate(args)
    if module == "deepspeed.launcher.runner":
        return _deepspeed(args)
    if not module or module in _TOOL_MODULES or module.startswith("$"):
        return None  # tools (`pip`, `pytest`) and modules we cannot name are no launches
    return _Found("python", target, args, module, counting="single")
