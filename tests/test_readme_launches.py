"""Launches documented only in a README's fenced shell blocks link scripts too."""

from cfgfix.core import Span
from cfgfix.documents.markdown import shell_blocks_only
from cfgfix.documents.launches import find_launches
from cfgfix.documents.shell import parse_shell
from cfgfix.documents.text import SourceText
from conftest import lint_project, write_project

README = """# Fine-tuning

Install, then launch on two GPUs:

```bash
pip install -r requirements.txt
torchrun --nproc_per_node 2 train.py --lr 1e-4
```

```python
print("torchrun --nproc_per_node 8 other.py")
```

```text
deepspeed --num_gpus 8 other.py
```

Or, from a console:

```console
$ accelerate launch --num_processes 4 other.py
```
"""

TRAIN = (
    "from transformers import AutoModelForCausalLM, Trainer\n"
    "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
    "Trainer(model=model).train()\n"
)


def _launches(text: str):
    return find_launches(parse_shell(shell_blocks_only(SourceText("README.md", text))))


def test_only_shell_blocks_are_read_and_positions_stay_in_the_readme():
    launches = _launches(README)
    assert [(l.launcher, l.script.text, l.world_size) for l in launches] == [
        ("torchrun", "train.py", 2),
        ("accelerate", "other.py", 4),
    ]
    span: Span = launches[0].script.span
    assert README[span.start:span.end] == "train.py"
    assert span.line == 7


def test_a_readme_launch_makes_the_cross_file_finding(tmp_path):
    write_project(tmp_path, {"README.md": README, "train.py": TRAIN})
    _, _, result = lint_project(tmp_path)
    (finding,) = [f for f in result.findings if f.code == "CFX105"]
    assert finding.path == "train.py" and finding.span.line == 2
    assert [(r.span.path, r.span.line) for r in finding.related] == [("README.md", 7)]


def test_readme_text_is_never_reported(tmp_path):
    write_project(
        tmp_path,
        {"README.md": "```bash\npkill -9 -f python\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true\ntorchrun --nproc_per_node 2 train.py\n```\n", "train.py": "x = 1\n"},
    )
    _, _, result = lint_project(tmp_path)
    assert [f for f in result.findings if f.path == "README.md"] == []


def test_project_rules_never_report_on_the_readme(tmp_path):
    """A launch documented only in a README still links its configs, but a finding whose
    value is set on the README's own command line (here CFX602's `--fp16 True`) is dropped:
    the README is documentation, never reported."""
    from conftest import lint_project, write_project

    write_project(tmp_path, {
        "README.md": "# run\n\n```bash\ntorchrun --nproc_per_node 2 train.py --fp16 True --output_dir o\n```\n",
        "train.py": ("from transformers import HfArgumentParser, Trainer, TrainingArguments\n\n"
                     "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
                     "Trainer(model=model, args=args).train()\n"),
        "cfgfix.toml": 'gpu = "A100 80GB"\n',
    })
    _, _, result = lint_project(tmp_path)
    assert [f for f in result.findings if f.path == "README.md"] == []
