"""A class walked as one for the model analysis (models.py): `__init__` first (from what
the project's base classes leave in `self.x` when it calls `super().__init__()`), then
each other method, seeded with what `__init__` leaves and what every assignment of an
attribute may hold."""

from __future__ import annotations

import ast

from cfgfix.analysis.model_attributes import (
    _calls_any,
    _calls_super_init,
    _may_hold_load,
    _moved_attributes,
    _project_bases,
)
from cfgfix.analysis.model_loads import _Resolver
from cfgfix.analysis.model_values import (
    Choice,
    ModelAnalysis,
    ModelState,
    ParamLoad,
    _loosen,
    _map_states,
    _merge_values,
    _unknown_dtype,
)
from cfgfix.analysis.model_walker import _analyze_function, _Walker
from cfgfix.analysis.names import dotted, single_assignments, walk_statements


def _analyze_class(cls: ast.ClassDef, analysis, resolver, module_seeds, init_params: dict | None = None,
                   survey=None) -> None:
    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    # `self.x` assigned once in the whole class from a load: other methods see that load,
    # with an unknown dtype (another method may have cast it in place).
    assigned: dict[str, list[tuple[ast.AST, ast.expr]]] = {}
    nested: dict[int, list[ast.AST]] = {}  # method -> functions defined inside it
    for method in methods:
        inner = nested[id(method)] = []
        for node in walk_statements(method):  # one walk per method collects both (statements only)
            if node is not method and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner.append(node)
            targets = []
            if isinstance(node, ast.Assign):
                targets = [(t, node.value) for t in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [(node.target, node.value)]
            for target, value in targets:
                key = dotted(target)
                if key and key.startswith("self.") and key.count(".") == 1:
                    assigned.setdefault(key, []).append((method, value))
    init = next((m for m in methods if m.name == "__init__"), None)
    # What the project's base classes leave in the `self.x` this class never binds.
    inherited = _inherited_states(cls, resolver, set(assigned), {m.name for m in methods}, init)
    # What `__init__` leaves in `self.x`, for attributes no other method rebinds: every other
    # method runs after it (`self.model = self.model.to(dtype)` in `__init__` included).
    after_init: dict[str, ModelState] = {}
    if init is not None:
        start = {**module_seeds, **inherited} if inherited and _calls_super_init(init) else module_seeds
        end = _analyze_function(init, analysis, resolver, start, cls, params=init_params)
        for key, state in end.items():
            if key.startswith("self.") and key.count(".") == 1 and isinstance(state, (ModelState, Choice)) \
                    and all(method is init for method, _ in assigned.get(key, [])):
                after_init[key] = _loosen(state)
        if start is not module_seeds:  # what this `__init__` did to them after `super().__init__()`
            inherited = {key: after_init.pop(key) for key in inherited if key in after_init}
    # Each attribute's values are evaluated once for the whole class, not once per method.
    attribute_states = {
        key: (_class_attribute_state(analysis, resolver, cls, key, [value for _, value in places])
              if all(value is not None for _, value in places) and _may_hold_load(places) else None)
        for key, places in assigned.items()
    }
    table = resolver.functions
    local_names = set(table.defs) | set(table.classes) if table is not None else set()
    if survey is not None:  # a method that calls one of the class's loading methods
        local_names |= {m.name for m in methods if m in survey.load_scopes}
    for method in methods:
        if method is init:
            for node in nested[id(method)]:  # nested functions inside __init__
                _analyze_function(node, analysis, resolver, dict(module_seeds), cls)
            continue
        seeds = {**module_seeds, **inherited}
        for key, state in attribute_states.items():
            if key in after_init:
                seeds[key] = after_init[key]
            elif state is not None and all(place is not method for place, _ in assigned[key]):
                # Assigned only in other methods (`model_init()` loads it, one branch per
                # family): if every assignment is a load no rule can tell apart, this method
                # sees that load, with an unknown dtype (another method may have cast it).
                seeds[key] = state
        if survey is not None and not survey.may_hold_model(method, module_seeds, seeds, local_names):
            continue  # nothing it could record: no load, tracked value or call site of this module
        _analyze_function(method, analysis, resolver, seeds, cls)
        for node in nested[id(method)]:  # nested functions inside methods
            _analyze_function(node, analysis, resolver, seeds, cls)


def _inherited_states(cls: ast.ClassDef, resolver, own: set[str], overridden: set[str], init) -> dict:
    """What `self.x` holds, for each attribute that the project's base classes of `cls`
    bind and `cls` never does but casts or moves (`_moved_attributes`): what a base's
    `__init__` leaves there when it runs (`cls`
    has no `__init__`, or calls `super().__init__()`), else the loads every base assignment
    makes, with an unknown dtype (as for a class's own attributes). A base method that
    `cls` (or a nearer base) overrides is not the one that runs: an attribute whose
    assignments call one is left unknown, and a base `__init__` that calls one is not used."""
    table = resolver.functions
    if table is None or not cls.bases:
        return {}
    moved = _moved_attributes(table, cls)
    if moved is not None and not moved:
        return {}  # nothing a base's load could tell about this class's casts and moves
    bases = _project_bases(cls, table, moved)
    if not bases:
        return {}
    states: dict = {}
    seen = set(own)  # a nearer class's binding hides the farther ones
    overridden = set(overridden)
    runs_init = init is None or _calls_super_init(init)
    for base_table, base in bases:
        methods = [n for n in base.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        base_init = next((m for m in methods if m.name == "__init__"), None)
        live = [m for m in methods if m.name not in overridden or m is base_init and runs_init]
        assigned: dict[str, list] = {}
        for method in live:
            for node in walk_statements(method):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else ()
                for target in targets:
                    key = dotted(target)
                    if key and key.startswith("self.") and key.count(".") == 1:
                        assigned.setdefault(key, []).append((method, node.value))
        fresh = [key for key in assigned if key not in seen and (moved is None or key[5:] in moved)]
        seen.update(assigned)
        if fresh:
            local = resolver if base_table is table else _Resolver(base_table.imports, base_table.consts, base_table)
            scratch = ModelAnalysis(imports=base_table.imports)  # findings belong to the base's own module
            after: dict = {}
            if runs_init and base_init is not None and base_init in live and not _calls_any(base_init, overridden):
                end = _analyze_function(base_init, scratch, local, {}, base)
                after = {key: _loosen(state) for key, state in end.items()
                         if key in assigned and isinstance(state, (ModelState, Choice))
                         and all(method is base_init for method, _ in assigned[key])}
            for key in fresh:
                places = assigned[key]
                if key in after:
                    states[key] = after[key]
                elif all(value is not None for _, value in places) and _may_hold_load(places) \
                        and not any(_calls_any(value, overridden) for _, value in places):
                    state = _class_attribute_state(scratch, local, base, key, [value for _, value in places])
                    if state is not None:
                        states[key] = state
        overridden.update(m.name for m in methods)
        runs_init = runs_init and (base_init is None or _calls_super_init(base_init))
    return states


def _seeds_from(body: list[ast.stmt], resolver, prefix: str) -> dict[str, ModelState]:
    """Module-level names bound exactly once to a load, as functions see them."""
    seeds = {}
    for name, value in single_assignments(body).items():
        state = _Walker(ModelAnalysis(resolver.imports), resolver, {}).expr(value, {})
        if isinstance(state, ModelState) and not isinstance(state.load, ParamLoad):
            seeds[prefix + name] = ModelState(state.load, dtype=None)
    return seeds


def _class_attribute_state(analysis, resolver, cls, key: str, values):
    """What `self.x` may hold in a method that does not assign it: the values of every
    assignment in the class (a `Choice` when they are different loads), dtype unknown.
    Assignments that rewrap the attribute itself (`self.model = get_peft_model(self.model,
    cfg)`, `self.model = self.model.eval()`) are evaluated on what the others hold."""
    def evaluate(value, env):
        state = _Walker(ModelAnalysis(analysis.imports), resolver, {}, cls=cls).expr(value, env)
        if isinstance(state, Choice) and all(isinstance(s, ModelState) for s in state.states) and state.states:
            return _loosen(_map_states(state, _unknown_dtype))
        if not isinstance(state, ModelState):
            return None
        return ModelState(state.load, None)

    own = [v for v in values if any(isinstance(n, ast.Attribute) and dotted(n) == key for n in ast.walk(v))]
    merged = None
    for value in [v for v in values if not any(v is o for o in own)] or ():
        state = evaluate(value, {})
        if state is None or any(isinstance(s.load, ParamLoad) for s in _states_of(state)):
            return None
        merged = state if merged is None else _merge_values(merged, state)
        if merged is None:
            return None
    if merged is None:
        return None
    base = merged
    for value in own:
        state = evaluate(value, {key: base})
        if state is None:
            return None
        merged = _merge_values(merged, state)
        if merged is None:
            return None
    return merged


def _states_of(value) -> list:
    return value.states if isinstance(value, Choice) else [value] if isinstance(value, ModelState) else []
