"""cfgfix verify's in-process harness: count optimizer steps of an unmodified training
script, measure them, write one JSON report per process, and stop after N steps.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one;
`cfgfix verify` puts a folder holding this file first on PYTHONPATH, so every Python
process of the launch (torchrun / accelerate workers included) loads it. It imports only
the standard library until the script imports torch (an import hook), then installs:
optimizer step pre/post hooks (count and time steps), a wrapper of torch.autograd.backward
(losses), of clip_grad_norm_ (grad norm before clipping) and of torch.manual_seed (did the
script seed), and a global module forward hook (the root modules, the first forward).
Broad `except Exception` clauses are deliberate: a measurement that fails must be noted in
the report, never change how the user's script runs.
After step N it writes its report and leaves with os._exit(0): a SystemExit could be
swallowed by the script's own `finally` / `except BaseException` (verify-notes.md).

Environment: CFGFIX_VERIFY_DIR (where reports go; without it this file does nothing but
chain), CFGFIX_VERIFY_STEPS (N), CFGFIX_VERIFY_COVER (a JSON file naming the changed lines:
see _Coverage). Launcher parents (torchrun, accelerate launch, deepspeed) and
multiprocessing helpers write no step report, but every Python process of the launch notes
that it started (`seen-PID.json`) and records coverage of the change (`cover-PID.txt`).
"""

import os
import sys


def _chain_shadowed_sitecustomize():
    """Run the sitecustomize this one shadows (a virtualenv's or the distribution's)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_cfgfix_shadowed_sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the interpreter would only print it too
        print(f"Error in shadowed sitecustomize; set PYTHONVERBOSE for traceback: {exc!r}", file=sys.stderr)


_LAUNCHER_SCRIPTS = {"torchrun", "accelerate", "deepspeed"}
_LAUNCHER_MODULES = {
    "torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
    "accelerate.commands.accelerate_cli", "deepspeed.launcher.runner",
}


def _role():
    """'launcher', 'helper' (a multiprocessing child) or 'worker', from the command line."""
    argv = list(getattr(sys, "orig_argv", sys.argv))[1:]
    if "--multiprocessing-fork" in argv or any("multiprocessing" in a and "spawn_main" in a for a in argv):
        return "helper"
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and i + 1 < len(argv):
            return "launcher" if argv[i + 1] in _LAUNCHER_MODULES else "worker"
        if arg in ("-c",):
            return "worker"
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return "launcher" if os.path.basename(arg) in _LAUNCHER_SCRIPTS else "worker"
    return "worker"


class _Harness:
    def __init__(self, folder, target):
        import threading
        import time
        import weakref

        self.folder = folder
        self.target = target
        self.clock = time.perf_counter
        self.lock = threading.RLock()
        self.roots = weakref.WeakSet()
        self.optimizers = weakref.WeakSet()
        self.counter = None  # a LiveBytes on a CPU run
        self.live_bytes = self.state_bytes = None  # from _cfgfix_live_bytes, once torch is imported
        self.finished = False
        self.depth = 0  # module call nesting (root modules are called at depth 0)
        self.step_depth = 0  # optimizer step nesting (a wrapper optimizer steps an inner one)
        self.pending_losses = []
        self.pending_norm = None
        self.first_forward = None
        self.step_ends = []
        self.report = {
            "pid": os.getpid(),
            "rank": _int_env("RANK"),
            "local_rank": _int_env("LOCAL_RANK"),
            "world_size": _int_env("WORLD_SIZE"),
            "argv": list(sys.argv),
            "status": "running",
            "target_steps": target,
            "steps": 0,
            "forwards": 0,
            "error": None,
            "signal": None,
            "torch_imported": False,
            "seeded": False,
            "device": None,
            "first_step_s": None,
            "later_step_mean_s": None,
            "step_times_s": [],
            "losses": [],
            "step_losses": [],
            "losses_finite": None,
            "grad_norms": [],
            "grad_norm_source": None,
            "params_finite": None,
            "state_bytes": None,
            "memory": {},
            "notes": [],
        }

    # -- reports ---------------------------------------------------------------------
    def path(self, kind):
        return os.path.join(self.folder, f"{kind}-{os.getpid()}.json")

    def write(self):
        import json

        target = self.path("proc")
        tmp = target + ".tmp"
        with open(tmp, "w") as out:
            json.dump(self.report, out, default=str)
        os.replace(tmp, target)  # the runner never reads half a report

    def finish(self, status):
        with self.lock:
            if self.finished:
                return
            self.finished = True
            self.report["status"] = status
            try:
                self.measure_end()
            except Exception as exc:  # a measurement must never hide the run's outcome
                self.report["notes"].append(f"final measurement failed: {exc!r}")
            self.write()

    # -- process-level handlers (stdlib only) -------------------------------------------
    def install_process_handlers(self):
        import atexit
        import faulthandler
        import signal

        self.stack_file = open(self.path("stack").replace(".json", ".txt"), "w")
        # `cfgfix verify` sends SIGUSR1 on timeout: the C-level handler dumps every thread's
        # Python stack even when the main thread is blocked inside a C call.
        faulthandler.register(signal.SIGUSR1, file=self.stack_file, all_threads=True)
        previous_hook = sys.excepthook

        def excepthook(kind, value, tb):
            import traceback

            self.report["error"] = {
                "type": kind.__name__,
                "message": str(value),
                "traceback": "".join(traceback.format_exception(kind, value, tb))[-8000:],
            }
            self.finish("crashed")
            previous_hook(kind, value, tb)

        sys.excepthook = excepthook
        atexit.register(lambda: self.finish("crashed" if self.report["error"] else "exited_early"))
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            def on_term(signum, frame):
                self.report["signal"] = "SIGTERM"
                self.finish("terminated")
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

            signal.signal(signal.SIGTERM, on_term)

    def watch_for_torch(self):
        import importlib.abc
        import importlib.util

        harness = self

        class TorchWatcher(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name != "torch":
                    return None
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec("torch")
                if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                    return spec
                original = spec.loader.exec_module

                def exec_module(module):
                    original(module)
                    try:
                        harness.on_torch(module)
                    except Exception as exc:
                        harness.report["notes"].append(f"harness could not hook torch: {exc!r}")

                spec.loader.exec_module = exec_module
                return spec

        if "torch" in sys.modules:
            self.on_torch(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, TorchWatcher())

    # -- torch hooks -------------------------------------------------------------------
    def on_torch(self, torch):
        self.torch = torch
        self.report["torch_imported"] = True
        try:  # copied next to this file by cfgfix verify; stdlib + torch only
            from _cfgfix_live_bytes import LiveBytes, model_state_bytes

            self.live_bytes, self.state_bytes = LiveBytes, model_state_bytes
        except Exception as exc:
            self.live_bytes = self.state_bytes = None
            self.report["notes"].append(f"cfgfix's live-bytes counter is unavailable, CPU peak and state bytes not measured: {exc!r}")
        self.wrap_backward(torch)
        self.wrap_clip(torch)
        self.wrap_seed(torch)
        from torch.nn.modules import module as module_mod
        from torch.optim import optimizer as optimizer_mod

        module_mod.register_module_forward_pre_hook(self.on_forward_pre)
        try:
            module_mod.register_module_forward_hook(self.on_forward_post, always_call=True)
        except TypeError:  # torch < 2.1: a forward that raises leaves depth high; harmless
            module_mod.register_module_forward_hook(self.on_forward_post)
        optimizer_mod.register_optimizer_step_pre_hook(self.on_step_pre)
        optimizer_mod.register_optimizer_step_post_hook(self.on_step_post)
        self.write()  # a process that hangs before its first step still has a report

    def wrap_backward(self, torch):
        original = torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
            if isinstance(first, torch.Tensor) and first.numel() == 1:
                self.pending_losses.append(float(first.detach().float()))
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward

    def wrap_clip(self, torch):
        from torch.nn.utils import clip_grad as clip_mod

        original = clip_mod.clip_grad_norm_

        def clip_grad_norm_(*args, **kwargs):
            norm = original(*args, **kwargs)
            try:
                self.pending_norm = float(norm)
            except Exception:  # a DTensor norm, say: not read here
                pass
            return norm

        clip_mod.clip_grad_norm_ = clip_grad_norm_
        torch.nn.utils.clip_grad_norm_ = clip_grad_norm_

    def wrap_seed(self, torch):
        original = torch.manual_seed

        def manual_seed(seed):
            self.report["seeded"] = True
            return original(seed)

        torch.manual_seed = manual_seed
        torch.random.manual_seed = manual_seed

    def on_forward_pre(self, module, args):
        if self.depth == 0 and not self.finished:
            self.roots.add(module)
            self.report["forwards"] += 1
            if self.first_forward is None:
                self.first_forward = self.clock()
                self.start_memory(module)
        self.depth += 1

    def on_forward_post(self, module, args, output):
        self.depth = max(self.depth - 1, 0)

    def start_memory(self, module):
        on_cuda = any(p.is_cuda for p in module.parameters())
        self.report["device"] = "cuda" if on_cuda else "cpu"
        if on_cuda:
            return  # the caching allocator's own peak counters are read at the end
        if self.live_bytes is None:
            return
        counter = self.live_bytes(device="cpu")
        counter.__enter__()  # left active until the process ends (os._exit)
        counter.track_existing([module])  # weights from_pretrained memory-mapped never pass the dispatcher
        self.counter = counter

    def on_step_pre(self, optimizer, args, kwargs):
        self.step_depth += 1
        if self.step_depth > 1 or self.finished:
            return
        self.optimizers.add(optimizer)
        if self.counter is not None:
            self.counter.track_existing(list(self.roots), [optimizer])
        if self.pending_norm is None:
            self.pending_norm = self.grad_norm(optimizer)
            self.report["grad_norm_source"] = self.report["grad_norm_source"] or "computed before step"
        else:
            self.report["grad_norm_source"] = "clip_grad_norm_"

    def on_step_post(self, optimizer, args, kwargs):
        self.step_depth -= 1
        if self.step_depth > 0 or self.finished:
            return
        with self.lock:
            report = self.report
            report["steps"] += 1
            self.step_ends.append(self.clock())
            report["step_losses"].append(self.pending_losses)
            report["losses"].extend(self.pending_losses)
            report["grad_norms"].append(self.pending_norm)
            self.pending_losses, self.pending_norm = [], None
            self.update_times()
            self.snapshot_state()
            if report["steps"] >= self.target:
                self.finish("completed")
                _leave(0)
            self.write()  # progress for the runner's display, and what a hang leaves behind

    def grad_norm(self, optimizer):
        torch = self.torch
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return None
        with torch.no_grad():
            return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))

    def update_times(self):
        import itertools

        ends = self.step_ends
        start = self.first_forward if self.first_forward is not None else ends[0]
        times = [ends[0] - start] + [b - a for a, b in itertools.pairwise(ends)]
        self.report["step_times_s"] = times
        self.report["first_step_s"] = times[0]
        later = times[1:]
        self.report["later_step_mean_s"] = sum(later) / len(later) if later else None

    # -- the end ---------------------------------------------------------------------
    def snapshot_state(self):
        """Parameter / gradient / optimizer-state bytes and finiteness, after each step:
        at exit the script's model and optimizer may already be gone."""
        torch = self.torch
        optimizers, roots = list(self.optimizers), list(self.roots)
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        if params:
            with torch.no_grad():
                self.report["params_finite"] = all(bool(torch.isfinite(p).all()) for p in params)
        if self.state_bytes is not None:
            self.report["state_bytes"] = self.state_bytes(roots, optimizers)

    def measure_end(self):
        import math

        report = self.report
        report["losses_finite"] = all(math.isfinite(x) for x in report["losses"]) if report["losses"] else None
        report["memory"]["rss_peak_bytes"] = _rss_peak()
        torch = sys.modules.get("torch")
        if torch is None or not report["torch_imported"]:
            return
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            report["memory"]["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            report["memory"]["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            report["device_name"] = torch.cuda.get_device_name()
        if self.counter is not None:
            report["memory"]["cpu_live_peak_bytes"] = self.counter.peak


class _Coverage:
    """Which of the changed lines run in this process: the statements cfgfix's fix (or the
    revision) edited, named in the JSON file CFGFIX_VERIFY_COVER as {"files": {absolute path:
    [[line, ...], ...]}, "reads": [absolute path, ...]}: per file, groups of lines, one group
    per changed statement, any line of which running proves the statement ran. Only those
    files are traced, and a group only until one of its lines runs: sys.monitoring (3.12+)
    turns the event off at each code object of another file and at each line once seen, so
    its cost ends with the first step. sys.settrace (before 3.12) installs a local tracer
    only for code objects of a changed file that hold a wanted line, but a trace function
    alone slows every Python instruction of the thread (about 2x in CPython 3.11): with
    "steady" (set by cfgfix for both runs whenever either side has lines to watch) it stays
    installed for the whole run in both copies, so their step times compare like for like,
    instead of one run losing it at its first step and the other never. "reads": changed
    files that are not Python (configs), noted when the process opens them (an audit hook).
    A hit is appended to `cover-PID.txt` at once, so it survives os._exit, a kill or a crash."""

    def __init__(self, folder, groups, reads):
        self.out_path = os.path.join(folder, f"cover-{os.getpid()}.txt")
        self.groups = groups  # real path -> [set of lines] not seen yet
        self.files = {path: set().union(*sets) for path, sets in groups.items()}  # the lines still wanted
        self.reads = reads  # real paths of changed non-Python files not opened yet
        self.names = {}  # co_filename as written -> real path of a changed file, or None
        self.cwd = os.getcwd()
        self.tool = None
        self.tracer = None
        self.steady = False

    @classmethod
    def install(cls, folder, spec_path):
        """The tracer used ("monitoring", "settrace") or None."""
        if not spec_path:
            return None
        try:
            import json

            with open(spec_path) as f:
                spec = json.load(f)
            files = {os.path.realpath(p): [set(g) for g in groups if g]
                     for p, groups in spec.get("files", {}).items() if any(groups)}
            reads = {os.path.realpath(p) for p in spec.get("reads", [])}
            coverage = cls(folder, files, reads)
            coverage.steady = bool(spec.get("steady"))
            kind = coverage.start_tracing() if files or coverage.steady else None
            if reads:
                sys.addaudithook(coverage.on_audit)
            return kind
        except Exception as exc:  # noqa: BLE001 -- never change how the user's script runs
            print(f"cfgfix verify: coverage of the change is not recorded: {exc!r}", file=sys.stderr)
            return None

    def record(self, text):
        try:
            with open(self.out_path, "a") as out:
                out.write(text)
        except Exception:  # noqa: BLE001, S110 -- a full disk must not stop the user's run
            pass

    def changed_file(self, filename):
        """The real path of a changed file for a code object's co_filename, or None."""
        try:
            return self.names[filename]
        except KeyError:
            pass
        path = None
        if filename and not filename.startswith("<"):
            real = os.path.realpath(os.path.join(self.cwd, filename))
            path = real if real in self.files else None
        self.names[filename] = path
        return path

    def wanted_in(self, code):
        path = self.changed_file(code.co_filename)
        if path is None:
            return None
        lines = self.files[path]
        return path if any(line in lines for _, _, line in code.co_lines()) else None

    def hit(self, path, line):
        lines = self.files.get(path)
        if lines is None or line not in lines:
            return
        self.record(f"{path}\t{line}\n")
        left = [group for group in self.groups[path] if line not in group]
        self.groups[path] = left
        self.files[path] = set().union(*left)
        if not any(self.files.values()) and not (self.steady and self.tracer is not None):
            self.stop_tracing()

    # -- 3.12+: sys.monitoring ----------------------------------------------------------
    def start_tracing(self):
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is None:
            return self.start_settrace()
        if not self.files:
            return None  # nothing to watch; sys.monitoring costs nothing to leave off
        for tool in (monitoring.COVERAGE_ID, 3, 4):
            try:
                monitoring.use_tool_id(tool, "cfgfix-verify")
            except ValueError:  # taken (the user's own coverage run, say)
                continue
            self.tool = tool
            break
        else:
            return self.start_settrace()
        events = monitoring.events

        def on_start(code, offset):
            if self.wanted_in(code) is not None:
                monitoring.set_local_events(self.tool, code, events.LINE)
            return monitoring.DISABLE

        def on_line(code, line):
            path = self.changed_file(code.co_filename)
            if path is not None:
                self.hit(path, line)
            return monitoring.DISABLE

        monitoring.register_callback(self.tool, events.PY_START, on_start)
        monitoring.register_callback(self.tool, events.LINE, on_line)
        monitoring.set_events(self.tool, events.PY_START)
        return "monitoring"

    # -- before 3.12: sys.settrace ------------------------------------------------------
    def start_settrace(self):
        import threading

        def local(frame, event, arg):
            if event == "line":
                self.hit(self.names.get(frame.f_code.co_filename), frame.f_lineno)
            return local

        def tracer(frame, event, arg):
            if self.tracer is None:  # every line seen, in another thread: stop in this one too
                sys.settrace(None)
                return None
            return local if self.wanted_in(frame.f_code) is not None else None

        self.tracer = tracer
        sys.settrace(tracer)
        threading.settrace(tracer)
        return "settrace"

    def stop_tracing(self):
        """Every changed line ran: no more cost to the run."""
        if self.tool is not None:
            monitoring = sys.monitoring
            monitoring.set_events(self.tool, 0)
            monitoring.register_callback(self.tool, monitoring.events.PY_START, None)
            monitoring.register_callback(self.tool, monitoring.events.LINE, None)
            monitoring.free_tool_id(self.tool)
            self.tool = None
        elif getattr(self, "tracer", None) is not None:
            import threading

            if sys.gettrace() is self.tracer:
                sys.settrace(None)
            threading.settrace(None)
            self.tracer = None  # other threads' tracers remove themselves at their next call

    def on_audit(self, event, args):
        if event != "open" or not self.reads:
            return
        try:
            name = args[0]
            if isinstance(name, bytes):
                name = os.fsdecode(name)
            if not isinstance(name, str):
                return  # a file descriptor
            real = os.path.realpath(os.path.join(self.cwd, name))
            if real in self.reads:
                self.reads.discard(real)
                self.record(f"read\t{real}\n")
        except Exception:  # noqa: BLE001, S110 -- an audit hook that raises would fail the open
            pass


def _int_env(name):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _rss_peak():
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    except Exception:
        return None


def _leave(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _note_start(folder, role, tracer):
    """`seen-PID.json`: this Python process started under the harness (the runner tells a
    launch that ran no Python from one whose Python never reached torch), and how it records
    coverage of the change."""
    import json

    try:
        with open(os.path.join(folder, f"seen-{os.getpid()}.json"), "w") as out:
            json.dump({"pid": os.getpid(), "role": role, "argv": list(sys.argv), "tracer": tracer,
                       "python": ".".join(map(str, sys.version_info[:2]))}, out)
    except Exception:  # noqa: BLE001, S110 -- a note only
        pass


def _watch_verify(parent):
    """The launch ends with the `cfgfix verify` that started it: killed with SIGKILL or by the
    OOM killer, verify cannot stop its launch, which would train on, holding the GPU. Every
    Python process of the launch watches verify's pid and kills the launch's process group
    (its own session, runner.run_launch) once that pid is gone."""
    import signal
    import threading
    import time

    def watch():
        while True:
            time.sleep(1.0)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                try:
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                finally:
                    os._exit(137)
            except OSError:
                pass  # alive, another user's (EPERM)

    threading.Thread(target=watch, name="cfgfix-verify-watch", daemon=True).start()


def _install():
    folder = os.environ.get("CFGFIX_VERIFY_DIR")
    if not folder:
        return
    parent = _int_env("CFGFIX_VERIFY_PARENT")
    if parent:
        _watch_verify(parent)
    role = _role()
    tracer = _Coverage.install(folder, os.environ.get("CFGFIX_VERIFY_COVER"))
    _note_start(folder, role, tracer)
    if role != "worker":
        return
    try:
        target = max(int(os.environ.get("CFGFIX_VERIFY_STEPS", "2")), 1)
    except ValueError:
        target = 2
    harness = _Harness(folder, target)
    harness.install_process_handlers()
    harness.watch_for_torch()


_chain_shadowed_sitecustomize()
_install()
