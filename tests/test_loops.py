"""CFX301-CFX303 beyond their embedded examples: severities, fixes that meet, the
re-indent of CFX303 (CRLF, f-strings, nested strings) and the shared loop analysis."""

import os

import pytest
from conftest import lint_project, write_project

from cfgfix.core import Severity
from cfgfix.fixing import fix_file

CODES = ["CFX301", "CFX302", "CFX303"]


def _check(tmp_path, code: str, select=CODES):
    write_project(tmp_path, {"train.py": code})
    engine, files, result = lint_project(tmp_path, select=select)
    return engine, files, result.findings


def _fix(tmp_path, code: str, select=CODES) -> str:
    engine, files, _ = _check(tmp_path, code, select)
    sf = next(f for f in files if f.display == "train.py")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return fix_file(engine, sf, sf.path.read_bytes(), unsafe=True).fixed
    finally:
        os.chdir(cwd)


TRAIN = (
    "import torch\n"
    "total = 0.0\n"
    "for batch in loader:\n"
    "    loss = model(**batch).loss\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
    "    total += loss\n"
    "print(total)\n"
)


def test_cfx302_is_a_warning_where_backward_runs(tmp_path):
    _, _, findings = _check(tmp_path, TRAIN)
    assert [(f.code, f.severity) for f in findings] == [("CFX302", Severity.WARNING)]


def test_cfx302_is_an_error_in_code_that_never_calls_backward(tmp_path):
    code = (
        "import torch\n"
        "def score(model, loader):\n"
        "    losses = []\n"
        "    for batch in loader:\n"
        "        losses.append(model(**batch).loss)\n"
        "    print(sum(losses) / len(losses))\n"
    )
    _, _, findings = _check(tmp_path, code, ["CFX302"])
    assert [(f.code, f.severity, f.span.line) for f in findings] == [("CFX302", Severity.ERROR, 5)]
    assert _fix(tmp_path, code, ["CFX302"]).count("losses.append(model(**batch).loss.item())") == 1


def test_cfx302_follows_the_accumulator_into_a_backward(tmp_path):
    code = (
        "total = 0\n"
        "for batch in loader:\n"
        "    total += criterion(model(batch.x), batch.y)\n"
        "mean = total / len(loader)\n"
        "mean.backward()\n"
    )
    assert _check(tmp_path, code)[2] == []


def test_cfx302_stays_silent_when_the_accumulator_escapes(tmp_path):
    code = (
        "history = []\n"
        "losses = []\n"
        "for batch in loader:\n"
        "    loss = model(**batch).loss\n"
        "    loss.backward()\n"
        "    losses.append(loss)\n"
        "history.append(losses)\n"
    )
    assert _check(tmp_path, code)[2] == []


def test_eval_loop_gets_both_fixes(tmp_path):
    code = (
        "import torch.nn.functional as F\n"
        "def validate(model, loader):\n"
        "    total = 0.0\n"
        "    for x, y in loader:\n"
        "        total += F.cross_entropy(model(x), y)\n"
        "    print(f'{total:.3f}')\n"
    )
    _, _, findings = _check(tmp_path, code)
    assert sorted(f.code for f in findings) == ["CFX302", "CFX303"]
    assert _fix(tmp_path, code) == (
        "import torch.nn.functional as F\n"
        "import torch\n"
        "def validate(model, loader):\n"
        "    total = 0.0\n"
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            total += F.cross_entropy(model(x), y).item()\n"
        "    print(f'{total:.3f}')\n"
    )


def test_cfx303_reindent_keeps_crlf_and_string_continuations(tmp_path):
    code = (
        "import torch\r\n"
        "model.eval()\r\n"
        "for x in loader:\r\n"
        "    out = model(x)\r\n"
        "    msg = f'''{out.shape}\r\n"
        "  tail'''\r\n"
        "    text = ('a'\r\n"
        "            'b')\r\n"
        "    # a comment\r\n"
        "\r\n"
        "    print(msg, text)\r\n"
        "print('done')\r\n"
    )
    assert _fix(tmp_path, code, ["CFX303"]) == (
        "import torch\r\n"
        "model.eval()\r\n"
        "with torch.no_grad():\r\n"
        "    for x in loader:\r\n"
        "        out = model(x)\r\n"
        "        msg = f'''{out.shape}\r\n"
        "  tail'''\r\n"
        "        text = ('a'\r\n"
        "                'b')\r\n"
        "        # a comment\r\n"
        "\r\n"
        "        print(msg, text)\r\n"
        "print('done')\r\n"
    )


def test_cfx303_one_line_loop_body(tmp_path):
    code = "import torch\nmodel.eval()\nfor x in loader: print(model(x))\n"
    assert _fix(tmp_path, code, ["CFX303"]) == (
        "import torch\nmodel.eval()\nwith torch.no_grad():\n    for x in loader: print(model(x))\n"
    )


def test_cfx303_flags_the_outer_loop_only(tmp_path):
    code = (
        "import torch\n"
        "def evaluate(model, loaders):\n"
        "    model.eval()\n"
        "    for loader in loaders:\n"
        "        for batch in loader:\n"
        "            model(**batch)\n"
    )
    _, _, findings = _check(tmp_path, code, ["CFX303"])
    assert [f.span.line for f in findings] == [6]
    assert "with torch.no_grad():\n        for loader in loaders:" in _fix(tmp_path, code, ["CFX303"])


@pytest.mark.parametrize(
    "prefix",
    [
        "import torch\ntorch.set_grad_enabled(False)\n",
        "import torch\nfrom torch import no_grad\n",
    ],
)
def test_cfx303_module_level_grad_switch_and_decorator_forms(tmp_path, prefix):
    decorated = prefix.endswith("no_grad\n")
    code = prefix + ("@no_grad()\n" if decorated else "") + (
        "def evaluate(model, loader):\n    model.eval()\n    for batch in loader:\n        model(**batch)\n"
    )
    assert _check(tmp_path, code, ["CFX303"])[2] == []


def test_cfx303_ignores_unrelated_decorators(tmp_path):
    code = (
        "import torch\n"
        "class Runner:\n"
        "    @staticmethod\n"
        "    def evaluate(model, loader):\n"
        "        model.eval()\n"
        "        for batch in loader:\n"
        "            model(**batch)\n"
    )
    assert [f.span.line for f in _check(tmp_path, code, ["CFX303"])[2]] == [7]


def test_cfx301_sole_statement_of_a_with_block_becomes_pass(tmp_path):
    code = (
        "import torch\n"
        "for step, batch in enumerate(loader):\n"
        "    model(**batch).loss.backward()\n"
        "    optimizer.step()\n"
        "    with timer('cache'):\n"
        "        torch.cuda.empty_cache()\n"
    )
    assert _fix(tmp_path, code, ["CFX301"]).endswith("    with timer('cache'):\n        pass\n")


def test_cfx301_keeps_a_comment_that_is_not_about_the_cache(tmp_path):
    code = (
        "import torch\n"
        "for step, batch in enumerate(loader):\n"
        "    model(**batch).loss.backward()\n"
        "    optimizer.step()\n"
        "    # next step\n"
        "    torch.cuda.empty_cache()\n"
        "    log(step)\n"
    )
    assert _fix(tmp_path, code, ["CFX301"]).endswith("    optimizer.step()\n    # next step\n    log(step)\n")


def test_cfx301_a_loop_else_is_not_inside_the_loop(tmp_path):
    code = (
        "import torch\n"
        "for batch in loader:\n"
        "    model(**batch).loss.backward()\n"
        "    optimizer.step()\n"
        "else:\n"
        "    torch.cuda.empty_cache()\n"
    )
    assert _check(tmp_path, code, ["CFX301"])[2] == []


_HELPER_CALLED_PER_STEP = (
    "import torch\n"
    "def helper(model, batch):\n"
    "{body}"
    "def train(model, loader, optimizer):\n"
    "    for batch in loader:\n"
    "        model(**batch).loss.backward()\n"
    "        optimizer.step()\n"
    "        helper(model, batch)\n"
)


@pytest.mark.parametrize("body", [
    # a loop over a spelled-out collection runs per step, like the helper around it
    "    for key in ('chosen', 'rejected'):\n        model(**batch[key])\n        torch.cuda.empty_cache()\n",
    "    for key in ['chosen', 'rejected']:\n        model(**batch[key])\n    torch.cuda.empty_cache()\n",
    "    pairs = {'c': batch['c'], 'r': batch['r']}\n    for name, x in pairs.items():\n        model(**x)\n"
    "    torch.cuda.empty_cache()\n",
    "    for i, key in enumerate(('a', 'b')):\n        model(**batch[key])\n    torch.cuda.empty_cache()\n",
    "    for key, x in {'a': 1, 'b': 2}.items():\n        model(**batch)\n        torch.cuda.empty_cache()\n",
])
def test_cfx301_a_helper_with_a_loop_over_a_spelled_out_collection_is_per_step(tmp_path, body):
    findings = _check(tmp_path, _HELPER_CALLED_PER_STEP.format(body=body), ["CFX301"])[2]
    assert [f.code for f in findings] == ["CFX301"]


@pytest.mark.parametrize("body", [
    # near misses: a pass over data, or a collection that the code builds or changes, is a phase
    "    for x in batch:\n        model(**x)\n    torch.cuda.empty_cache()\n",
    "    for i in range(10):\n        model(**batch)\n    torch.cuda.empty_cache()\n",
    "    for name, p in model.state_dict().items():\n        p.cpu()\n    torch.cuda.empty_cache()\n",
    "    keys = ['a']\n    keys.append(batch)\n    for key in keys:\n        model(**key)\n"
    "    torch.cuda.empty_cache()\n",
    "    keys = ['a']\n    keys = load_keys()\n    for key in keys:\n        model(**key)\n"
    "    torch.cuda.empty_cache()\n",
    "    for key in (*batch, 'a'):\n        model(**key)\n    torch.cuda.empty_cache()\n",
    "    for key in ('a', 'b'):\n        for x in loader:\n            model(**x)\n    torch.cuda.empty_cache()\n",
])
def test_cfx301_a_helper_with_a_pass_over_data_stays_a_phase(tmp_path, body):
    assert _check(tmp_path, _HELPER_CALLED_PER_STEP.format(body=body), ["CFX301"])[2] == []


def test_cfx301_a_spelled_out_loop_inside_the_step_loop(tmp_path):
    code = (
        "import torch\n"
        "for batch in loader:\n"
        "    model(**batch).loss.backward()\n"
        "    optimizer.step()\n"
        "    for key in ('chosen', 'rejected'):\n"
        "        log(batch[key])\n"
        "        torch.cuda.empty_cache()\n"
    )
    findings = _check(tmp_path, code, ["CFX301"])[2]
    assert [f.code for f in findings] == ["CFX301"]
    # at module level, a spelled-out loop alone is no step loop
    assert _check(tmp_path, "import torch\nfor k in ('a', 'b'):\n    torch.cuda.empty_cache()\n", ["CFX301"])[2] == []


def test_statements_in_loops_stop_at_functions():
    import ast

    from cfgfix.analysis.loops import statements_in_loops

    tree = ast.parse(
        "for a in b:\n"
        "    x = 1\n"
        "    def f():\n"
        "        y = 2\n"
        "        while c:\n"
        "            z = 3\n"
        "else:\n"
        "    w = 4\n"
    )
    found = [(stmt.lineno, getattr(func, "name", None), outer.lineno) for stmt, func, outer in statements_in_loops(tree)]
    assert found == [(2, None, 1), (3, None, 1), (6, "f", 5)]


def test_statements_in_loops_in_every_kind_of_block():
    import ast

    from cfgfix.analysis.loops import statements_in_loops

    tree = ast.parse(
        "class C:\n"                     # 1
        "    def m(self):\n"             # 2
        "        async def g():\n"       # 3
        "            async for a in b:\n"  # 4
        "                try:\n"         # 5
        "                    x = 1\n"    # 6
        "                except E:\n"    # 7
        "                    y = 2\n"    # 8
        "                finally:\n"     # 9
        "                    z = 3\n"    # 10
        "        while t:\n"             # 11
        "            match v:\n"         # 12
        "                case 1:\n"      # 13
        "                    w = 4\n"    # 14
        "            class D:\n"         # 15
        "                q = 5\n"        # 16
    )
    found = sorted((stmt.lineno, getattr(func, "name", None), outer.lineno) for stmt, func, outer in statements_in_loops(tree))
    assert found == [(5, "g", 4), (6, "g", 4), (8, "g", 4), (10, "g", 4), (12, "m", 11), (14, "m", 11), (15, "m", 11)]


def test_scope_flow_bindings_and_statements():
    import ast

    from cfgfix.analysis.loops import ScopeFlow, scope_statements

    tree = ast.parse(
        "a = 1\n"
        "b: int = 2\n"
        "a += 3\n"
        "for i, (j, *k) in x:\n"
        "    with m() as n, o() as (p, q), r():\n"
        "        self.s, t[u] = 1, 2\n"
        "def f():\n"
        "    v = 1\n"
        "try:\n"
        "    w = 1\n"
        "except E as e:\n"
        "    y = 2\n"
    )
    # not into `def f`; a block's handlers before its body (a stack's order)
    assert [s.lineno for s in scope_statements(tree.body)] == [1, 2, 3, 4, 5, 6, 7, 9, 12, 10]
    bindings = ScopeFlow(tree.body).bindings
    assert {name: [(line, value is not None) for line, _, _, value in entries] for name, entries in bindings.items()} == {
        "a": [(1, True), (3, True)], "b": [(2, True)], "i": [(4, False)], "j": [(4, False)], "k": [(4, False)],
        "n": [(5, False)], "p": [(5, False)], "q": [(5, False)],
        # names read in a tuple target's attribute or subscript count as bound (a superset)
        "self": [(6, False)], "t": [(6, False)], "u": [(6, False)],
        "w": [(10, True)], "y": [(12, True)],
    }


@pytest.mark.parametrize(
    "line, flagged",
    [
        ("        x = Variable(x, requires_grad=False)\n", True),
        ("        x.requires_grad = False\n", True),
        ("        x = x.detach().requires_grad_(False)\n", True),
        ("        x = Variable(x, requires_grad=True)\n", False),
        ("        x.requires_grad = True\n", False),
        ("        x.requires_grad_()\n", False),
        ("        x = torch.zeros_like(x, requires_grad=wanted)\n", False),
    ],
)
def test_cfx303_turning_gradients_off_is_no_request_for_them(tmp_path, line, flagged):
    code = (
        "import torch\n"
        "from torch.autograd import Variable\n"
        "def valid(model, loader):\n"
        "    model.eval()\n"
        "    for x, y in loader:\n"
        + line
        + "        out = model(x)\n"
        "        total += out.sum().item()\n"
    )
    assert bool(_check(tmp_path, code, ["CFX303"])[2]) is flagged


def test_cfx303_names_a_volatile_variable_that_no_longer_works(tmp_path):
    code = (
        "import torch\n"
        "from torch.autograd import Variable\n"
        "def valid(model, loader):\n"
        "    model.eval()\n"
        "    for x, y in loader:\n"
        "        out = model(Variable(x, volatile=True))\n"
        "        total += out.sum().item()\n"
    )
    (finding,) = _check(tmp_path, code, ["CFX303"])[2]
    assert "`Variable(..., volatile=True)` (line 6) has been ignored since torch 0.4" in finding.message
    assert [r.span.line for r in finding.related][-1] == 6


_HOOK = "import torch\n{imp}\nclass C({base}):\n    def {name}(self, *args, **kwargs):\n        torch.cuda.empty_cache()\n"
_LIGHTNING_CB = ("from lightning.pytorch.callbacks import Callback", "Callback")
_LIGHTNING_MODULE = ("import pytorch_lightning as pl", "pl.LightningModule")
_HF_CB = ("from transformers import TrainerCallback", "TrainerCallback")
_HF_TRAINER = ("from transformers import Trainer", "Trainer")


@pytest.mark.parametrize("framework, name", [
    # the per-batch hooks of the frameworks' evaluation and predict loops
    (_LIGHTNING_CB, "on_test_batch_end"), (_LIGHTNING_CB, "on_validation_batch_end"),
    (_LIGHTNING_CB, "on_predict_batch_start"), (_LIGHTNING_CB, "on_validation_batch_start"),
    (_LIGHTNING_MODULE, "validation_step"), (_LIGHTNING_MODULE, "test_step"),
    (_LIGHTNING_MODULE, "predict_step"), (_LIGHTNING_MODULE, "on_test_batch_end"),
    (_HF_CB, "on_prediction_step"), (_HF_TRAINER, "prediction_step"),
])
def test_cfx301_evaluation_step_hooks_run_per_step(tmp_path, framework, name):
    imp, base = framework
    findings = _check(tmp_path, _HOOK.format(imp=imp, base=base, name=name), ["CFX301"])[2]
    assert [f.code for f in findings] == ["CFX301"]
    assert "every evaluation step" in findings[0].message
    assert findings[0].related[0].message == "runs once per evaluation step"


@pytest.mark.parametrize("framework, name", [
    # once per evaluation or per epoch: a phase boundary
    (_HF_CB, "on_evaluate"), (_HF_CB, "on_predict"), (_LIGHTNING_CB, "on_validation_epoch_end"),
    (_LIGHTNING_CB, "on_test_end"), (_LIGHTNING_MODULE, "on_validation_end"),
    (_LIGHTNING_MODULE, "on_predict_epoch_end"),
    # a Trainer subclass's evaluation entry point runs the whole loop
    (_HF_TRAINER, "evaluate"), (_HF_TRAINER, "evaluation_loop"),
    # the hook's name on a class no framework calls
    (("", "object"), "on_test_batch_end"), (("", "object"), "validation_step"),
])
def test_cfx301_once_per_evaluation_hooks_stay_silent(tmp_path, framework, name):
    imp, base = framework
    assert _check(tmp_path, _HOOK.format(imp=imp, base=base, name=name), ["CFX301"])[2] == []


def test_cfx301_training_hooks_still_say_training_step(tmp_path):
    imp, base = _LIGHTNING_CB
    findings = _check(tmp_path, _HOOK.format(imp=imp, base=base, name="on_train_batch_end"), ["CFX301"])[2]
    assert findings[0].related[0].message == "runs once per training step"
    assert "every evaluation step" not in findings[0].message


_UNUSED_CALLBACK = (
    "import torch\nfrom transformers import Trainer, TrainerCallback\n"
    "class EmptyCache(TrainerCallback):\n"
    "    def on_step_begin(self, args, state, control, **kwargs):\n"
    "        torch.cuda.empty_cache()\n"
    "def main():\n"
    "    cb = EmptyCache()\n"
    "    trainer = Trainer(model=model, args=args{register})\n"
    "{after}"
    "    trainer.train()\n"
)


def test_cfx301_a_callback_built_but_never_registered_is_never_called(tmp_path):
    # `callbacks=[cb]` commented out: the instance is never read
    assert _check(tmp_path, _UNUSED_CALLBACK.format(register="", after=""), ["CFX301"])[2] == []


@pytest.mark.parametrize("register, after", [
    (", callbacks=[cb]", ""),
    ("", "    trainer.add_callback(cb)\n"),
    (", callbacks=[EmptyCache()]", ""),
])
def test_cfx301_a_registered_callback_is_judged(tmp_path, register, after):
    findings = _check(tmp_path, _UNUSED_CALLBACK.format(register=register, after=after), ["CFX301"])[2]
    assert [f.code for f in findings] == ["CFX301"]


def test_cfx301_a_callback_the_module_never_builds_may_be_built_elsewhere(tmp_path):
    code = ("import torch\nfrom transformers import TrainerCallback\n"
            "class EmptyCache(TrainerCallback):\n"
            "    def on_step_end(self, args, state, control, **kwargs):\n"
            "        torch.cuda.empty_cache()\n")
    assert [f.code for f in _check(tmp_path, code, ["CFX301"])[2]] == ["CFX301"]


@pytest.mark.parametrize(
    "code, expected",
    [
        (b"for b in loader:\n    loss = f(b)\n    total += loss\n", True),
        (b"for b in loader:\n    losses.append(criterion(out, y))\n", True),
        (b"while True:\n    total = total + out.loss\n", True),
        (b"while True:\n    total = out.loss + total  # sum\n", True),
        (b"total += loss\n", False),  # not in a loop
        (b"for b in loader:\n    total += 1\n    print(loss + 1)\n", False),  # `+` lines that accumulate no loss
        (b"for b in loader:\n    n += 1\n    loss.backward()\n", False),
        (b"def compute_loss(x):\n    for b in x:\n        total += loss\n", False),  # a loss builder's own sum
    ],
)
def test_cfx302_text_look_finds_accumulated_losses(code, expected):
    from cfgfix.rules.loops.cfx302_loss_accumulates_graph import _loss_word_accumulated

    assert _loss_word_accumulated(code) is expected


def test_cfx302_text_look_finds_accumulated_call_results():
    from cfgfix.rules.loops.cfx302_loss_accumulates_graph import _accumulated_names, _call_result_accumulated

    code = b"from m import step\nfor b in loader:\n    cost = step(b)\n    a[0] += 1\n    avg_cost += cost  # c\n    n+= 1\n"
    assert {name: match.group(0) for name, match in _accumulated_names(code).items()} == {
        b"cost": b"    avg_cost += cost  # c", b"1": b"    n+= 1"}
    assert _call_result_accumulated(code)
    assert not _call_result_accumulated(code.replace(b"cost = step(b)", b"cost = 2"))


# A loop over data chunks whose body runs whole phases (a rollout, a model built by a
# factory, the inner step loop, `del` of the model): `empty_cache` there runs once per
# phase, not per step (heldout4's homzer/llama-rlhf shape), with the names varied.
_PHASE_LOOP = (
    "import gc\nimport torch\n"
    "for epoch, datalist in IterationHandler(records, epochs, chunk_size):\n"
    "    buffer = collect_rollouts(datalist)\n"
    "    {bound} = {factory}(config_file, dtype=dtype)\n"
    "    policy.train()\n"
    "    trainer = PolicyTrainer(policy, optimizer)\n"
    "    for data in buffer.get(batch_size):\n"
    "        outputs = trainer.forward(data)\n"
    "    trainer.save(save_dir)\n"
    "    del policy\n"
    "    torch.cuda.empty_cache()\n"
    "    gc.collect()\n"
)


@pytest.mark.parametrize("factory, bound", [
    ("get_parallel_model", "policy, tokenizer"),
    ("build_model", "policy"),
    ("self.create_policy_model", "policy"),
    ("utils.load_reward_model", "policy, _"),
    ("_init_actor_model", "policy"),
])
def test_cfx301_silent_in_a_loop_that_builds_and_drops_a_model_per_iteration(tmp_path, factory, bound):
    code = _PHASE_LOOP.format(factory=factory, bound=bound)
    if factory.startswith("self."):
        code = "class Runner:\n    def run(self):\n" + "".join(
            "        " + line + "\n" if line else "\n" for line in code.splitlines()[2:]) + "import torch\nimport gc\n"
    _, _, findings = _check(tmp_path, code, ["CFX301"])
    assert findings == []


def test_cfx301_a_model_factory_is_not_a_forward_pass(tmp_path):
    # No `del`: the loop is not a loop over models, but the factory call alone no longer
    # makes the chunk loop an evaluation loop.
    code = (
        "import torch\n"
        "for chunk_id, data_chunk in enumerate(chunks):\n"
        "    model = get_parallel_model(cfg)\n"
        "    for batch in loader_of(data_chunk):\n"
        "        trainer.forward(batch)\n"
        "    torch.cuda.empty_cache()\n"
    )
    _, _, findings = _check(tmp_path, code, ["CFX301"])
    assert findings == []


@pytest.mark.parametrize("accessor", ["get_model", "self.get_policy_model", "build_model"])
def test_cfx301_still_flags_a_step_loop_that_fetches_its_model_every_step(tmp_path, accessor):
    # A near miss: the factory (or accessor) runs every step but the model is never
    # deleted, and the loop runs backward and the optimizer: it is a training step loop.
    code = (
        "import torch\n"
        "for step, batch in enumerate(train_loader):\n"
        f"    model = {accessor}()\n"
        "    loss = model(**batch).loss\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    torch.cuda.empty_cache()\n"
    )
    _, _, findings = _check(tmp_path, code, ["CFX301"])
    assert [(f.code, f.span.line) for f in findings] == [("CFX301", 7)]


def test_cfx301_still_flags_an_evaluation_loop_over_batches(tmp_path):
    # The forward pass is a model's, not a factory's: still a step loop.
    code = (
        "import torch\n"
        "for batch in eval_loader:\n"
        "    reward_model = reward_models[0]\n"
        "    scores = reward_model(**batch)\n"
        "    torch.cuda.empty_cache()\n"
    )
    _, _, findings = _check(tmp_path, code, ["CFX301"])
    assert [(f.code, f.span.line) for f in findings] == [("CFX301", 5)]
