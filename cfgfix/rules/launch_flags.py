"""The launches a finding holds for, by the script flags its branch needs: a statement in the
`else` of `if args.deepspeed:` runs only on launches that leave `--deepspeed` off, one in the
body of `if args.model_parallel:` only on launches that turn it on (when its default is off).
A rule yields `Conditioned(finding, base + flag_qualifiers(ctx, node))`; the project stage
(project.py `condition_holds`) keeps the launches that reach the statement."""

from __future__ import annotations

import ast


def default_off(refs, tree, dest: str) -> bool:
    """The flag `dest` is off unless a launch sets it: an argparse flag with no default,
    `default=None`/`False`/`0`/`""` or `action="store_true"`, or a field of the module's
    own dataclass (`use_lora: bool = field(default=False)`) with such a default. A computed
    default, a flag declared twice or one we cannot see (a TrainingArguments field) is not."""
    default = refs.defaults.get(dest)
    if default is not None:
        if dest in refs.repeated:
            return False
        computed = default.node is not None and default.value is None and not (
            isinstance(default.node, ast.Constant) and default.node.value is None)
        return not computed and not default.value
    values = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == dest:
                    value = stmt.value
                    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
                        value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
                    values.append(value)
    return len(values) == 1 and isinstance(values[0], ast.Constant) and not values[0].value


def flag_qualifiers(ctx, node: ast.AST) -> str:
    """`;unless:--a,--b` for each flag the branches around `node` need off (the `else` of
    `if training_args.use_deepspeed:` or `if args.deepspeed:`), `;only:--a` for each they
    need on whose default is surely off (the body of `if args.model_parallel:` with
    `action="store_true"`). A flag is named by every option that sets it: its argparse
    option strings, else `--name` (HfArgumentParser also takes `--use-deepspeed`)."""
    from cfgfix.analysis.flag_guards import flag_needs
    from cfgfix.training.references import read_refs

    tree = ctx.document.tree
    refs = read_refs(tree)
    needs = flag_needs(tree, node, refs.namespaces)
    out = []
    for (_, dest), on in needs:
        if on and not default_off(refs, tree, dest):
            continue  # a flag that may be on by default: every launch may reach the statement
        declared = [o for o, d in refs.options.items() if d == dest]
        options = [o for o in dict.fromkeys(declared or [f"--{dest}", f"--{dest.replace('_', '-')}"])
                   if o.startswith("-") and "," not in o and ";" not in o]
        if options:
            out.append(f";{'only' if on else 'unless'}:{','.join(options)}")
    return "".join(out)
