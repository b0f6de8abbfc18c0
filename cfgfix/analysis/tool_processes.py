"""How many processes a training tool's own command starts, from the launch's environment
alone (no release, no file): the parts of the tools' launch logic both the project model
(`LaunchFacts.world_size`, for the rules that read a launch's count) and the resolved setup
(training/frameworks/) apply.

- `llamafactory-cli train` (llamafactory 0.8.0-0.9.5 cli.py `main`, launcher.py `launch` from
  0.9.4): torchrun when FORCE_TORCHRUN (or USE_MCA) is on or more than one GPU is visible, with
  `--nproc_per_node` NPROC_PER_NODE else the visible device count, `--nnodes` NNODES else 1;
  else `run_exp()` in this one process. USE_RAY / USE_KT hand the processes to Ray / KTransformers.
- `accelerate launch` with neither `--num_processes` nor a config (accelerate 1.15.0
  commands/launch.py `_validate_launch_command`): every visible GPU (a default config on the
  machine would decide instead).
"""

from __future__ import annotations


def visible_gpus(cuda_devices: str | None) -> int | None:
    """The GPUs `CUDA_VISIBLE_DEVICES` leaves visible: `0,1,3` -> 3; unknown for a variable."""
    if cuda_devices is None:
        return None
    text = cuda_devices.strip().strip("'\"")
    if "$" in text or "`" in text:
        return None
    if text == "" or text == "-1":
        return 0
    return len([part for part in text.split(",") if part.strip()])


def env_true(env: dict[str, str], name: str, words: tuple[str, ...] = ("true", "1", "y")) -> bool | None:
    """Whether the tool reads `name` as on (llamafactory extras/misc.py is_env_enabled); None
    when the value is not known here."""
    text = env.get(name)
    if text is None:
        return False
    text = text.strip().strip("'\"")
    if "$" in text:
        return None
    return text.lower() in words


def env_int(env: dict[str, str], name: str) -> int | None | bool:
    """An int variable of the launch; False when unset, None when set but unknown."""
    text = env.get(name)
    if text is None:
        return False
    text = text.strip().strip("'\"")
    return int(text) if text.isdigit() and text.isascii() and len(text) <= 6 else None


def llamafactory_processes(env: dict[str, str], cuda_devices: str | None) -> tuple[int | None, str]:
    """(processes or None, how) for `llamafactory-cli train` of a release that starts torchrun
    itself (0.8.0 and later)."""
    for name in ("USE_RAY", "USE_KT"):
        if env_true(env, name) is not False:
            return None, f"{name} is set: the processes are {name[4:].lower()}'s, unknown here"
    force = env_true(env, "FORCE_TORCHRUN")
    mca = env_true(env, "USE_MCA")
    force = True if True in (force, mca) else None if None in (force, mca) else False
    visible = visible_gpus(cuda_devices)
    nproc = env_int(env, "NPROC_PER_NODE")
    nodes = env_int(env, "NNODES")
    nodes = 1 if nodes is False else nodes
    if force is None or nproc is None or nodes is None or nodes == 0:
        return None, "FORCE_TORCHRUN, NPROC_PER_NODE or NNODES is set to a value unknown here"
    torchrun = force or (visible is not None and visible > 1)
    if not torchrun and visible is not None:
        return 1, f"one visible GPU (CUDA_VISIBLE_DEVICES={cuda_devices}), no FORCE_TORCHRUN: one process"
    per_node = nproc if nproc is not False else visible
    if per_node is None:
        return None, ("one process where one GPU is visible, else torchrun on every visible GPU; how many is not "
                      "stated (set CUDA_VISIBLE_DEVICES or NPROC_PER_NODE, or gpus in the cfgfix settings)")
    if not torchrun:  # NPROC_PER_NODE alone: torchrun only when more than one GPU is visible
        return None, (f"1 process on a one-GPU machine, else NPROC_PER_NODE={nproc} × NNODES={nodes}; the GPU count "
                      "is not stated")
    how = f"NPROC_PER_NODE={nproc}" if nproc is not False else f"CUDA_VISIBLE_DEVICES={cuda_devices}"
    return per_node * nodes, f"torchrun, {how} × NNODES={nodes}"
