#!/usr/bin/env python3
"""Read DeepSpeed's pydantic config models from release sdists and print them as the data
module `cfgfix/analysis/deepspeed_fields.py` (field -> type, bounds, alias, default).

    pip download deepspeed==0.19.6 --no-deps --no-binary :all: -d SDISTS   (and 0.19.7, 0.19.8)
    python bench/deepspeed_tests/read_models.py SDISTS/deepspeed-0.19.6 SDISTS/deepspeed-0.19.7 ... \
        > cfgfix/analysis/deepspeed_fields.py

Each argument is an unpacked sdist; the newest release's type wins for a field present in
several, and a field absent from the oldest one read carries the first release it is in.
Only `ast` reads the sources: nothing of DeepSpeed is imported."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# config block (dotted, as in the JSON) -> (module under deepspeed/runtime, class)
BLOCKS = {
    "zero_optimization": ("zero/config.py", "DeepSpeedZeroConfig"),
    "zero_optimization.offload_param": ("zero/offload_config.py", "DeepSpeedZeroOffloadParamConfig"),
    "zero_optimization.offload_optimizer": ("zero/offload_config.py", "DeepSpeedZeroOffloadOptimizerConfig"),
    "zero_optimization.zenflow": ("zenflow/zenflow_config.py", "ZenFlowConfig"),
    "zero_optimization.leaf_module": ("zero/leaf_module_config.py", "DeepSpeedZeroLeafModuleConfig"),
    "fp16": ("precision_config.py", "DeepSpeedFP16Config"),
    "bf16": ("precision_config.py", "DeepSpeedBF16Config"),
}
MODELS = {cls: block for block, (_, cls) in BLOCKS.items()}
ENUMS = {"ZeroStageEnum": ("zero/config.py", True), "OffloadDeviceEnum": ("zero/offload_config.py", False)}


def enum_values(root: Path, name: str) -> tuple:
    module, _ = ENUMS[name]
    tree = ast.parse((root / "deepspeed/runtime" / module).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return tuple(sorted({stmt.value.value for stmt in node.body if isinstance(stmt, ast.Assign)
                                 and isinstance(stmt.value, ast.Constant)}, key=str))
    raise SystemExit(f"{name} not found in {module}")


def spec(root: Path, annotation: ast.expr) -> str:
    """The type as a short string: bool, int, float, str, path, dict, list, model:<block>,
    enum:<values>, a|b for unions, a leading ? for Optional."""
    text = ast.unparse(annotation)
    if text.startswith("Optional[") and text.endswith("]"):
        return "?" + spec(root, annotation.slice)
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Union":
        parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        inner = [spec(root, part) for part in parts]
        optional = any(part == "None" for part in inner)
        body = "|".join(part for part in inner if part != "None")
        return ("?" if optional else "") + body
    if text in ("bool", "int", "float", "str"):
        return text
    if text == "None":
        return "None"
    if text == "Path":
        return "path"
    if text.startswith(("Dict", "dict")):
        return "dict"
    if text.startswith(("List", "list")):
        return "list"
    if text in MODELS:
        return "model:" + MODELS[text]
    if text in ENUMS:
        return "enum:" + ",".join(map(str, enum_values(root, text)))
    return "any"


def read(root: Path) -> dict:
    out = {}
    for block, (module, cls) in BLOCKS.items():
        path = root / "deepspeed/runtime" / module
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            continue
        fields = {}
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            entry = {"type": spec(root, stmt.annotation)}
            value = stmt.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "Field":
                for kw in value.keywords:
                    if kw.arg in ("gt", "ge", "lt", "le") and isinstance(kw.value, ast.Constant):
                        entry[kw.arg] = kw.value.value
                    elif kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                        entry["alias"] = kw.value.value
                default = value.args[0] if value.args else next(
                    (kw.value for kw in value.keywords if kw.arg == "default"), None)
            else:
                default = value
            if isinstance(default, ast.Constant) and isinstance(default.value, str):
                entry["default"] = default.value
            fields[stmt.target.id] = entry
        out[block] = fields
    return out


def version(root: Path) -> str:
    return (root / "version.txt").read_text().strip()


def main(argv: list[str]) -> None:
    roots = sorted((Path(a) for a in argv), key=lambda r: tuple(int(x) for x in version(r).split(".")[:3]))
    releases = [version(r) for r in roots]
    merged: dict[str, dict] = {}
    for root, release in zip(roots, releases):
        for block, fields in read(root).items():
            for name, entry in fields.items():
                old = merged.setdefault(block, {}).get(name)
                entry = dict(entry)
                entry["since"] = old["since"] if old else (None if release == releases[0] else release)
                merged[block][name] = entry
    print('"""DeepSpeed\'s pydantic config models as data: for each validated block, its fields with')
    print("type, bounds, alias and string default. Generated by bench/deepspeed_tests/read_models.py")
    print(f"from the sdists of DeepSpeed {', '.join(releases)} (read with ast, nothing imported); do not edit")
    print("by hand. A field's `since` is the first of those releases that has it (None: the oldest")
    print('read). Types: bool, int, float, str, path, dict, list, model:<block>, enum:<values>, a|b,')
    print('a leading ? for Optional."""')
    print()
    print(f"RELEASES = {tuple(releases)!r}")
    print()
    print("FIELDS = {")
    for block, fields in merged.items():
        print(f"    {block!r}: {{")
        for name, entry in fields.items():
            print(f"        {name!r}: {entry!r},")
        print("    },")
    print("}")


if __name__ == "__main__":
    main(sys.argv[1:])
