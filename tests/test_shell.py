"""Launch-script documents: logical lines, positions, dialects and launch recognition."""

from __future__ import annotations

import textwrap

import pytest

from cfgfix.documents.launches import Launch, accelerate_config_world_size, find_launches
from cfgfix.documents.shell import ShellDocument, parse_shell
from cfgfix.documents.text import SourceText


def parse(text: str, dialect: str = "sh", path: str = "run.sh") -> ShellDocument:
    doc = parse_shell(SourceText(path, textwrap.dedent(text)), dialect)
    check_positions(doc)
    return doc


def check_positions(doc: ShellDocument) -> None:
    """Every span points at the exact token, and its line/column agree with its offsets."""
    text = doc.source.text
    words = [w for c in doc.commands for w in c.words] + [a.value for a in doc.assignments]
    for word in words:
        assert text[word.span.start:word.span.end] == word.raw, word
        assert (word.span.line, word.span.column) == doc.source.position(word.span.start)
        assert (word.span.end_line, word.span.end_column) == doc.source.position(word.span.end)


def argvs(doc: ShellDocument) -> list[list[str]]:
    return [[w.text for w in c.words] for c in doc.commands]


def launches(text: str, dialect: str = "sh", path: str = "run.sh") -> list[Launch]:
    doc = parse(text, dialect, path)
    found = find_launches(doc)
    for launch in found:
        for word in launch.script_args + tuple(launch.config_files.values()):
            assert launch.command.span.start <= word.span.start
            assert doc.source.text[word.span.start:word.span.end] == word.raw
    return found


def one(text: str, dialect: str = "sh", path: str = "run.sh") -> Launch:
    found = launches(text, dialect, path)
    assert len(found) == 1, found
    return found[0]


# --------------------------------------------------------------------------- logical lines


def test_separators_split_commands():
    doc = parse("cd out && python a.py || echo failed; ls | wc -l & wait\n")
    assert argvs(doc) == [["cd", "out"], ["python", "a.py"], ["echo", "failed"], ["ls"], ["wc", "-l"], ["wait"]]


def test_continuations_join_one_logical_line():
    doc = parse(
        """\
        torchrun \\
          --nproc_per_node 2 \\
          train.py \\
          --lr 1e-4
        echo done
        """
    )
    assert argvs(doc) == [["torchrun", "--nproc_per_node", "2", "train.py", "--lr", "1e-4"], ["echo", "done"]]
    first = doc.commands[0]
    assert (first.span.line, first.span.end_line) == (1, 4)
    assert first.words[3].span.line == 3 and first.words[3].span.column == 3


def test_crlf_line_endings():
    doc = parse_shell(SourceText("run.sh", "export N=2\r\ntorchrun --nproc_per_node $N \\\r\n  train.py\r\n"))
    check_positions(doc)
    assert argvs(doc) == [["export", "N=2"], ["torchrun", "--nproc_per_node", "$N", "train.py"]]
    assert find_launches(doc)[0].world_size == 2


def test_comments_only_at_word_start_and_never_launch():
    doc = parse(
        """\
        # torchrun --nproc_per_node 8 train.py
        echo a#b  # accelerate launch train.py
          #deepspeed train.py
        """
    )
    assert argvs(doc) == [["echo", "a#b"]]
    assert find_launches(doc) == []


def test_quote_removal_keeps_variables_and_substitutions():
    doc = parse("""python "train me.py" 'single $X' "$HOME/x" $(nproc --all) `hostname` a\\ b ${N:-2}\n""")
    assert argvs(doc) == [
        ["python", "train me.py", "single $X", "$HOME/x", "$(nproc --all)", "`hostname`", "a b", "${N:-2}"]
    ]
    assert doc.commands[0].words[1].raw == '"train me.py"'


def test_command_substitution_is_not_parsed_into_commands():
    doc = parse('N=$(python -c "import torch; print(torch.cuda.device_count())"; torchrun x.py)\n')
    assert doc.commands == []
    assert doc.assignments[0].value.text.startswith("$(python -c")


def test_multiline_quotes_and_substitutions_stay_in_one_word():
    doc = parse('python -c "\nimport torch\n" && echo "$(\n  date\n)"\n')
    assert argvs(doc) == [["python", "-c", "\nimport torch\n"], ["echo", "$(\n  date\n)"]]


def test_heredoc_bodies_are_skipped():
    doc = parse(
        """\
        cat > cfg.yaml <<EOF
        torchrun --nproc_per_node 8 a.py
        EOF
        cat <<'END' | python -
        accelerate launch b.py
        END
        \tcat <<-"X" && echo after
        \t\tdeepspeed c.py
        \tX
        python train.py
        """
    )
    assert argvs(doc) == [["cat"], ["cat"], ["python", "-"], ["cat"], ["echo", "after"], ["python", "train.py"]]
    assert [l.script.text for l in find_launches(doc)] == ["train.py"]


def test_a_heredoc_script_that_this_script_submits_is_read_as_shell():
    doc = parse(
        """\
        SCRIPT=$(mktemp /tmp/job_XXXX.sh)
        cat > "$SCRIPT" << 'EOF'
        #!/bin/bash
        #SBATCH --gres=gpu:4
        export PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"
        torchrun --nproc_per_node 4 train.py
        EOF
        JOB=$(sbatch --parsable "${SCRIPT}" 2>&1)
        rm "$SCRIPT"
        """
    )
    assert argvs(doc) == [
        ["cat"], ["export", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"],
        ["torchrun", "--nproc_per_node", "4", "train.py"], ["rm", "$SCRIPT"],
    ]
    alloc = next(a for a in doc.assignments if a.name == "PYTORCH_CUDA_ALLOC_CONF")
    assert (alloc.kind, alloc.value.text, alloc.span.line) == ("export", "expandable_segments:True", 5)
    # the body runs in a shell of its own, like `bash -c`
    assert doc.scopes[alloc.span.start][-1] < 0
    assert [l.script.text for l in find_launches(doc)] == ["train.py"]


@pytest.mark.parametrize(
    "text, inner",
    [
        ("sbatch <<EOF\ntorchrun a.py\nEOF\n", True),
        ("cat <<EOF | sbatch --parsable\ntorchrun a.py\nEOF\n", True),
        ("bash -s <<'EOF'\ntorchrun a.py\nEOF\n", True),
        ("tee job.sh <<EOF >/dev/null\ntorchrun a.py\nEOF\nbash job.sh\n", True),
        ("cat <<EOF > job.sh\ntorchrun a.py\nEOF\nchmod +x job.sh\n./job.sh\n", True),
        ("cat > job.sh <<EOF\ntorchrun a.py\nEOF\n", False),  # written, never run here
        ("cat > job.sh <<EOF\ntorchrun a.py\nEOF\nbash other.sh\n", False),
        ("cat 2> job.sh <<EOF\ntorchrun a.py\nEOF\nbash job.sh\n", False),  # stderr, not the body
        ("cat <<EOF | python -\ntorchrun a.py\nEOF\n", False),  # a Python program
        ("bash run.sh <<EOF\ntorchrun a.py\nEOF\n", False),  # the script's stdin, not a script
        ("bash -c 'cat' <<EOF\ntorchrun a.py\nEOF\n", False),
        ("sbatch <<EOF\ntorchrun a.py\n", False),  # the body never ends: not trusted
    ],
)
def test_which_heredoc_bodies_are_scripts(text, inner):
    doc = parse(text)
    assert (["torchrun", "a.py"] in argvs(doc)) is inner


def test_a_heredoc_inside_a_heredoc_script():
    doc = parse("sbatch <<'OUT'\npython - <<'PY'\nprint(1)\nPY\nexport A=1\nOUT\n")
    assert argvs(doc) == [["sbatch"], ["python", "-"], ["export", "A=1"]]
    assert [(a.name, a.span.line) for a in doc.assignments] == [("A", 5)]


def test_unbalanced_quote_skips_only_that_line():
    doc = parse("echo 'oops\npython train.py --config a.yaml\n")
    # The quote never closes: its line is dropped and the rest is read normally.
    assert argvs(doc) == [["python", "train.py", "--config", "a.yaml"]]
    assert parse("echo \"$(date\n").commands == []  # nothing left, and no exception


def test_redirections_are_not_arguments():
    doc = parse("python train.py --x 1 > log.txt 2>&1 < /dev/null\n")
    assert argvs(doc) == [["python", "train.py", "--x", "1"]]
    assert doc.commands[0].span.end == len("python train.py --x 1 > log.txt 2>&1 < /dev/null")


def test_assignment_kinds():
    doc = parse(
        """\
        export A=1 B="two words"
        C=3
        D=4 E=5 python x.py
        declare -x F=6
        local G=7
        """
    )
    got = [(a.name, a.value.text, a.kind) for a in doc.assignments]
    assert got == [
        ("A", "1", "export"), ("B", "two words", "export"), ("C", "3", "plain"),
        ("D", "4", "prefix"), ("E", "5", "prefix"), ("F", "6", "export"), ("G", "7", "plain"),
    ]
    assert [a.name for a in doc.commands[1].env] == ["D", "E"]
    assert argvs(doc)[1] == ["python", "x.py"]
    assert doc.assignments[1].value.raw == '"two words"'


def test_control_structures_expose_inner_commands():
    doc = parse(
        """\
        if [ "$WORLD" -gt 1 ]; then torchrun --nproc_per_node 2 a.py; else python a.py; fi
        for seed in 1 2 3; do
          python b.py --seed $seed
        done
        case "$MODE" in
          big|huge) deepspeed c.py ;;
          *) echo nothing ;;
        esac
        main() {
          accelerate launch d.py
        }
        (cd sub && python e.py)
        """
    )
    assert argvs(doc) == [
        ["[", "$WORLD", "-gt", "1", "]"],
        ["torchrun", "--nproc_per_node", "2", "a.py"],
        ["python", "a.py"],
        ["python", "b.py", "--seed", "$seed"],
        ["deepspeed", "c.py"],
        ["echo", "nothing"],
        ["accelerate", "launch", "d.py"],
        ["cd", "sub"],
        ["python", "e.py"],
    ]
    launchers = [launch.launcher for launch in find_launches(doc)]
    assert launchers == ["torchrun", "python", "python", "deepspeed", "accelerate", "python"]


def test_unknown_dialect_is_an_error():
    with pytest.raises(ValueError):
        parse_shell(SourceText("x", ""), "powershell")


# --------------------------------------------------------------------------- launchers


def test_accelerate_launch_full_form():
    launch = one("accelerate launch --multi_gpu --num_processes=8 --config_file cfg.yaml train.py --config x.yaml\n")
    assert launch.launcher == "accelerate"
    assert launch.script.text == "train.py" and launch.module is None
    assert [w.text for w in launch.script_args] == ["--config", "x.yaml"]
    assert (launch.num_processes, launch.num_machines, launch.world_size) == (8, None, 8)
    assert {k: w.text for k, w in launch.config_files.items()} == {"accelerate": "cfg.yaml", "config": "x.yaml"}


def test_accelerate_num_processes_counts_all_machines():
    launch = one("accelerate launch --num_machines 2 --num_processes 16 --machine_rank 0 train.py\n")
    assert (launch.num_processes, launch.num_machines, launch.world_size) == (16, 2, 16)


def test_accelerate_without_count_is_unknown():
    launch = one("accelerate launch --config-file=acc.yaml --deepspeed_config_file ds.json train.py\n")
    assert launch.world_size is None and launch.num_processes is None
    assert launch.config_files["accelerate"].text == "acc.yaml"
    assert launch.config_files["accelerate"].raw == "acc.yaml"  # the value alone, not `--config-file=`
    assert launch.config_files["deepspeed"].text == "ds.json"


def test_accelerate_module_and_python_module_form():
    launch = one("python3 -m accelerate.commands.launch --num_processes 2 -m my_pkg.train --lr 3\n")
    assert launch.launcher == "accelerate"
    assert launch.script is None and launch.module == "my_pkg.train"
    assert launch.world_size == 2
    assert [w.text for w in launch.script_args] == ["--lr", "3"]


def test_accelerate_needs_the_launch_subcommand():
    assert launches("accelerate config default\naccelerate env\n") == []


def test_torchrun_forms():
    assert one("torchrun --nproc_per_node 4 train.py\n").world_size == 4
    assert one("torchrun --nproc-per-node=4 --nnodes 2 train.py\n").world_size == 8
    launch = one("torchrun --standalone --nnodes=1 --nproc_per_node=gpu train.py\n")
    assert (launch.num_processes, launch.num_machines, launch.world_size) == (None, 1, None)
    assert one("torchrun --nproc_per_node auto train.py\n").world_size is None


def test_torchrun_elastic_nodes_are_unknown():
    launch = one("torchrun --nnodes=1:4 --nproc_per_node=8 --rdzv-backend c10d train.py\n")
    assert (launch.num_processes, launch.num_machines, launch.world_size) == (8, None, None)
    assert one("torchrun --nnodes=2:2 --nproc_per_node=8 train.py\n").world_size == 16


def test_torchrun_unstated_count_is_unknown():
    launch = one("torchrun train.py --epochs 3\n")
    assert launch.num_processes is None and launch.world_size is None
    assert launch.script.text == "train.py"


def test_python_m_torch_distributed():
    run = one("python -m torch.distributed.run --nproc_per_node 2 train.py\n")
    assert (run.launcher, run.world_size, run.module, run.script.text) == ("torchrun", 2, None, "train.py")
    old = one("python3 -m torch.distributed.launch --use_env --nproc_per_node=4 train.py --config c.yaml\n")
    assert (old.launcher, old.world_size, old.script.text) == ("torchrun", 4, "train.py")
    assert old.config_files["config"].text == "c.yaml"


def test_torchrun_module_target():
    launch = one("torchrun --nproc_per_node 2 -m pkg.train --x 1\n")
    assert launch.script is None and launch.module == "pkg.train"


def test_deepspeed_launcher():
    launch = one("deepspeed --num_gpus=2 train.py --deepspeed ds.json\n")
    assert (launch.launcher, launch.num_processes, launch.world_size) == ("deepspeed", 2, 2)
    assert launch.config_files["deepspeed"].text == "ds.json"
    multi = one("deepspeed --num_nodes 2 --num_gpus 4 --hostfile h train.py --deepspeed --deepspeed_config ds.json\n")
    assert (multi.num_machines, multi.world_size) == (2, 8)
    assert multi.config_files["deepspeed"].text == "ds.json"
    assert one("deepspeed train.py\n").world_size is None  # all visible GPUs


def test_plain_python_launch():
    launch = one("python train.py --config configs/sdxl.yaml --bs 4\n")
    assert (launch.launcher, launch.world_size, launch.num_processes) == ("python", 1, None)
    assert launch.config_files["config"].text == "configs/sdxl.yaml"
    assert one("python -u -W ignore scripts/train.py -c cfg.yaml\n").config_files["config"].text == "cfg.yaml"
    assert one("python3 run_clm.py args.json\n").config_files["config"].text == "args.json"
    module = one("python -m trainer.main --config-path conf\n")
    assert (module.module, module.script, module.world_size) == ("trainer.main", None, 1)
    assert module.config_files["config"].text == "conf"


@pytest.mark.parametrize(
    "line,module",
    [
        ("python -uBm pkg.train --x 1", "pkg.train"),
        ("python -X dev -W ignore::UserWarning -m pkg.train", "pkg.train"),
        ("python3.11 -mpkg.train", "pkg.train"),
    ],
)
def test_python_switch_clusters(line, module):
    launch = one(line + "\n")
    assert (launch.launcher, launch.module, launch.script) == ("python", module, None)


def test_python_from_a_variable_and_setup_py():
    assert one("$PYTHON train.py\n").script.text == "train.py"
    assert launches("python setup.py sdist\npython -V\n") == []


def test_srun_starts_copies_of_plain_python():
    assert one("srun --ntasks-per-node=4 python train.py\n").world_size is None
    assert one("srun -N 2 torchrun --nnodes 2 --nproc_per_node 4 train.py\n").world_size == 8


def test_accelerate_cpu_runs_one_process_without_mpirun():
    assert one("accelerate launch --cpu --num_processes 2 train.py\n").world_size is None
    assert one("accelerate launch --cpu train.py\n").world_size is None


def test_python_that_is_not_a_training_launch():
    assert launches('python -c "import torch"\npython -m pip install -r req.txt\npython\npython --version\n') == []


@pytest.mark.parametrize(
    "line",
    [
        "nohup torchrun --nproc_per_node 2 train.py > out.log 2>&1 &",
        "env NCCL_DEBUG=INFO torchrun --nproc_per_node 2 train.py",
        "time torchrun --nproc_per_node 2 train.py",
        "exec torchrun --nproc_per_node 2 train.py",
        "srun -N 1 --gres=gpu:2 torchrun --nproc_per_node 2 train.py",
        "CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node 2 train.py",
        "nohup env A=1 /opt/venv/bin/torchrun --nproc_per_node 2 train.py",
        "uv run torchrun --nproc_per_node 2 train.py",
        "timeout 2h python -m torch.distributed.run --nproc_per_node 2 train.py",
    ],
)
def test_wrappers_before_the_launcher(line):
    launch = one(line + "\n")
    assert (launch.launcher, launch.world_size, launch.script.text) == ("torchrun", 2, "train.py")


def test_echo_and_strings_are_not_launches():
    script = 'echo "torchrun --nproc_per_node 8 train.py"\necho torchrun train.py\nprintf %s "accelerate launch x.py"\n'
    assert launches(script) == []


def test_inline_shell_scripts_are_parsed_in_place():
    text = (
        "export N=2\nbash -c 'torchrun --nproc_per_node $N train.py' && sh -lc \"echo torchrun x.py\"\n"
        "bash run.sh -c 'python y.py'\n"
    )
    doc = parse(text)
    assert ["torchrun", "--nproc_per_node", "$N", "train.py"] in argvs(doc)
    launch = find_launches(doc)[0]
    # N is exported: the inner bash sees it (a plain N=2 it would not: test_inline_script_env.py)
    assert (launch.world_size, launch.command.span.line, launch.command.span.column) == (2, 2, 10)
    assert len(find_launches(doc)) == 1  # the echo string and `bash run.sh` args are not scripts
    escaped = parse("bash -c \"torchrun --nproc_per_node \\\"2\\\" t.py\"\n")
    assert find_launches(escaped) == []  # escapes: positions would not map back, so left alone


def test_key_value_and_separate_forms_agree():
    a = one("deepspeed --num_gpus 2 --num_nodes=1 train.py\n")
    b = one("deepspeed --num_gpus=2 --num_nodes 1 train.py\n")
    assert (a.world_size, a.num_machines) == (b.world_size, b.num_machines) == (2, 1)


def test_argparse_abbreviations_where_the_launcher_accepts_them():
    assert one("torchrun --nnode=1 --nproc 2 train.py\n").num_machines == 1
    assert one("torchrun --nproc 2 t.py\n").world_size == 2
    assert one("deepspeed --num_gpu 2 train.py\n").world_size == 2
    assert one("accelerate launch --num_proc 2 train.py\n").num_processes is None  # allow_abbrev=False


def test_option_value_positions():
    text = "accelerate launch --config_file=conf/acc.yaml train.py --deepspeed=ds.json\n"
    launch = one(text)
    for word in launch.config_files.values():
        assert text[word.span.start:word.span.end] == word.raw
    assert launch.config_files["accelerate"].span.column == len("accelerate launch --config_file=") + 1
    assert launch.config_files["deepspeed"].raw == "ds.json"


# --------------------------------------------------------------------------- variables


@pytest.mark.parametrize("ref", ["$NGPU", "${NGPU}", '"$NGPU"', '"${NGPU}"', "${NGPU:-2}"])
def test_variable_resolves_to_last_literal_assignment(ref):
    launch = one(f"NGPU=2\nexport NGPU=4\ntorchrun --nproc_per_node {ref} train.py\n")
    assert launch.world_size == 4


def test_default_with_unassigned_variable_is_unknown():
    assert one("torchrun --nproc_per_node ${NGPU:-8} train.py\n").world_size is None
    assert one("torchrun --nproc_per_node $NGPU train.py\n").world_size is None


@pytest.mark.parametrize(
    "script",
    [
        "torchrun --nproc_per_node '$NGPU' train.py\nNGPU=4\n",  # single quotes: literal text
        "torchrun --nproc_per_node $NGPU train.py\nNGPU=4\n",  # assigned only afterwards
        "NGPU=4 torchrun --nproc_per_node $NGPU train.py\n",  # expanded before the prefix applies
        "NGPU=$(nvidia-smi -L | wc -l)\ntorchrun --nproc_per_node $NGPU train.py\n",
        "NGPU=4\nif [ -n \"$BIG\" ]; then NGPU=8; fi\ntorchrun --nproc_per_node $NGPU train.py\n",
        "NGPU=4\nfor NGPU in 1 2; do echo; done\ntorchrun --nproc_per_node $NGPU train.py\n",
        "NGPU=4\nsource ./env.sh\ntorchrun --nproc_per_node $NGPU train.py\n",
        "NGPU=4\nread NGPU\ntorchrun --nproc_per_node $NGPU train.py\n",
        "NGPU=4\nNGPU+=1\ntorchrun --nproc_per_node $NGPU train.py\n",
        "torchrun --nproc_per_node $((NGPU * 2)) train.py\n",
        "f() { NGPU=4; }\ntorchrun --nproc_per_node $NGPU train.py\n",
    ],
)
def test_unprovable_values_are_unknown(script):
    assert one(script).world_size is None


def test_variables_resolve_inside_the_same_block_and_through_chains():
    launch = one(
        """\
        main() {
          local N=2
          NNODES=$N
          torchrun --nproc_per_node=$N --nnodes $NNODES train.py
        }
        main
        """
    )
    assert (launch.num_processes, launch.num_machines, launch.world_size) == (2, 2, 4)


@pytest.mark.parametrize(
    "script,world",
    [
        ("N=4\n(N=8)\ntorchrun --nproc_per_node $N x.py\n", 4),  # a subshell's N is gone
        ("(N=8; torchrun --nproc_per_node $N x.py)\n", 8),
        ("if a; then N=8; fi\nN=2\ntorchrun --nproc_per_node $N x.py\n", 2),
        ("N=4\nif a; then source env.sh; fi\ntorchrun --nproc_per_node $N x.py\n", None),
        ("N=2\nN=$((N * 2))\ntorchrun --nproc_per_node $N x.py\n", 4),  # bash arithmetic, the old N
        ("N=2\nM=$N\nN=3\ntorchrun --nproc_per_node $M x.py\n", 2),
        ("function go {\n  N=2\n  torchrun --nproc_per_node $N x.py\n}\n", 2),
        ("N=2\nwhile read line; do N=3; done < f\ntorchrun --nproc_per_node $N x.py\n", None),
    ],
)
def test_variable_scopes(script, world):
    assert one(script).world_size == world


def test_launch_environment():
    launch = one(
        """\
        export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        MODE=fast
        if true; then HIDDEN=1; fi
        CUDA_VISIBLE_DEVICES=0 nohup env NCCL_DEBUG=INFO python train.py
        """
    )
    assert launch.env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "MODE": "fast",
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_DEBUG": "INFO",
    }


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_exec_form_with_positions():
    text = textwrap.dedent(
        """\
        FROM pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime
        ENV PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NCCL_DEBUG="WARN"
        ENV HF_HOME /data/hf cache
        CMD ["torchrun", "--nproc_per_node", "2", \\
             "train.py", "--config", "c.yaml"]
        """
    )
    doc = parse(text, "dockerfile", "Dockerfile")
    assert [(a.name, a.value.text, a.kind) for a in doc.assignments] == [
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "env"),
        ("NCCL_DEBUG", "WARN", "env"),
        ("HF_HOME", "/data/hf cache", "env"),
    ]
    launch = find_launches(doc)[0]
    assert (launch.launcher, launch.world_size, launch.script.text) == ("torchrun", 2, "train.py")
    assert launch.script.raw == '"train.py"' and launch.script.span.line == 5
    assert launch.config_files["config"].text == "c.yaml"
    assert launch.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_dockerfile_shell_form_run_and_env_resolution():
    doc = parse(
        """\
        FROM python:3.11
        ENV NGPU=4
        RUN --mount=type=cache,target=/root/.cache pip install -r req.txt && \\
            # a comment Docker drops
            python -c "print(1)"
        RUN NGPU=1
        entrypoint accelerate launch --num_processes $NGPU train.py
        """,
        "dockerfile",
        "Dockerfile",
    )
    assert argvs(doc)[:2] == [["pip", "install", "-r", "req.txt"], ["python", "-c", "print(1)"]]
    launch = find_launches(doc)[0]
    assert launch.world_size == 4  # RUN NGPU=1 lived in another shell


def test_dockerfile_exec_form_through_a_shell():
    text = 'CMD ["bash", "-c", "accelerate launch --num_processes 2 train.py > /tmp/log"]\n'
    doc = parse(text, "dockerfile", "Dockerfile")
    launch = find_launches(doc)[0]
    assert (launch.launcher, launch.world_size, launch.script.raw) == ("accelerate", 2, "train.py")


def test_dockerfile_legacy_env_and_bad_json_fall_back_to_shell_form():
    doc = parse('CMD [python, train.py]\nCMD ["deepspeed", "--num_gpus", "2", "t.py"]\n', "dockerfile", "Dockerfile")
    assert argvs(doc)[1] == ["deepspeed", "--num_gpus", "2", "t.py"]
    assert find_launches(doc)[-1].world_size == 2


# --------------------------------------------------------------------------- Makefile


def test_makefile_recipes():
    text = textwrap.dedent(
        """\
        export WORLD := 2
        PY ?= python
        .PHONY: train
        # torchrun --nproc_per_node 64 commented.py
        train: data
        \t@echo "torchrun in a string"
        \t-NGPU=4; torchrun --nproc_per_node $$NGPU \\
        \t    train.py --config $(CONFIG)
        \ttorchrun --nproc_per_node $$NGPU other.py
        \ttorchrun --nproc_per_node $$WORLD third.py
        quick: ; $(PYTHON) quick.py
        """
    )
    doc = parse(text, "makefile", "Makefile")
    assert argvs(doc) == [
        ["echo", "torchrun in a string"],
        ["torchrun", "--nproc_per_node", "$NGPU", "train.py", "--config", "$(CONFIG)"],
        ["torchrun", "--nproc_per_node", "$NGPU", "other.py"],
        ["torchrun", "--nproc_per_node", "$WORLD", "third.py"],
        ["$(PYTHON)", "quick.py"],
    ]
    found = find_launches(doc)
    # Each recipe line is its own shell: NGPU is known on its line only.
    assert [l.world_size for l in found] == [4, None, 2, 1]
    assert found[0].command.words[2].raw == "$$NGPU"
    assert found[0].config_files["config"].text == "$(CONFIG)"


def test_makefile_tab_lines_outside_rules_are_not_recipes():
    doc = parse("VAR = 1\n\ttorchrun --nproc_per_node 2 x.py\n", "makefile", "Makefile")
    assert doc.commands == []


# --------------------------------------------------------------------------- .env


def test_dotenv_assignments():
    doc = parse(
        """\
        # comment
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True # trailing
        export NCCL_DEBUG='INFO'
        WANDB_PROJECT="my proj"
        EMPTY=
        not an assignment
        """,
        "env",
        ".env",
    )
    assert [(a.name, a.value.text, a.value.raw, a.kind) for a in doc.assignments] == [
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "expandable_segments:True", "env"),
        ("NCCL_DEBUG", "INFO", "'INFO'", "env"),
        ("WANDB_PROJECT", "my proj", '"my proj"', "env"),
        ("EMPTY", "", "", "env"),
    ]
    assert doc.commands == []


# --------------------------------------------------------------------------- accelerate config


@pytest.mark.parametrize(
    "text,expected",
    [
        ("distributed_type: MULTI_GPU\nnum_processes: 8\nnum_machines: 1\n", 8),
        ("distributed_type: MULTI_GPU\nnum_processes: 16\nnum_machines: 2\n", 16),
        ("distributed_type: 'NO'\nnum_processes: 1\n", 1),
        ("distributed_type: MULTI_GPU\n", None),
        ("num_processes: true\n", None),
        ("num_processes: [\n", None),
        ("- a\n- b\n", None),
        ("", None),
    ],
)
def test_accelerate_config_world_size(text, expected):
    assert accelerate_config_world_size(text) == expected


def test_launcher_options_held_in_a_variable_are_word_split():
    """Qwen's finetune scripts: `torchrun $DISTRIBUTED_ARGS finetune.py ...`."""
    (launch,) = launches(
        'GPUS_PER_NODE=8\nNNODES=2\n'
        'DISTRIBUTED_ARGS="\n    --nproc_per_node $GPUS_PER_NODE \\\n    --nnodes $NNODES \\\n    --master_port 6001\n"\n'
        "torchrun $DISTRIBUTED_ARGS finetune.py --deepspeed ds.json\n"
    )
    assert launch.script.text == "finetune.py"
    assert (launch.num_processes, launch.num_machines, launch.world_size) == (8, 2, 16)
    assert launch.config_files["deepspeed"].text == "ds.json"


@pytest.mark.parametrize(
    "script",
    [
        'torchrun "$ARGS" train.py\n',  # quoted: one word, no splitting
        "torchrun ${ARGS:-} train.py\n",  # a default that may be what runs
        "if x; then ARGS='--nproc_per_node 4'; fi\ntorchrun $ARGS train.py\n",  # maybe not set
        "ARGS=$(cat args)\ntorchrun $ARGS train.py\n",  # computed
    ],
)
def test_unsure_argument_variables_stay_as_written(script):
    text = script if script.startswith(("if", "ARGS=$(")) else "ARGS='--nproc_per_node 4'\n" + script
    (launch,) = launches(text)
    assert launch.world_size is None


def test_dockerfile_entrypoint_and_cmd_are_one_launch():
    """Docker appends an exec-form CMD to an exec-form ENTRYPOINT: one command, whose
    halves are no launches on their own."""
    text = textwrap.dedent(
        """\
        FROM python:3.11
        ENTRYPOINT ["torchrun", "--nproc_per_node=4"]
        CMD ["train.py", "--config", "cfg.yaml"]
        """
    )
    doc = parse(text, "dockerfile", "Dockerfile")
    assert argvs(doc) == [["torchrun", "--nproc_per_node=4", "train.py", "--config", "cfg.yaml"]]
    [launch] = find_launches(doc)
    assert (launch.launcher, launch.world_size, launch.script.text) == ("torchrun", 4, "train.py")
    assert launch.script.span.line == 3 and launch.command.span.line == 2
    assert launch.config_files["config"].text == "cfg.yaml"


def test_dockerfile_entrypoint_near_misses():
    """A shell-form ENTRYPOINT ignores CMD; a later ENTRYPOINT resets CMD; a new stage starts over."""
    shell_entry = parse('FROM x\nENTRYPOINT torchrun --nproc_per_node 2\nCMD ["train.py"]\n', "dockerfile", "Dockerfile")
    assert find_launches(shell_entry) == []
    reset = parse('FROM x\nCMD ["train.py"]\nENTRYPOINT ["torchrun", "--nproc_per_node", "2"]\n', "dockerfile", "Dockerfile")
    assert find_launches(reset) == []
    stages = parse('FROM a AS build\nENTRYPOINT ["torchrun", "--nproc_per_node", "2"]\nFROM b\nCMD ["train.py"]\n',
                   "dockerfile", "Dockerfile")
    assert find_launches(stages) == []
    order = parse('FROM x\nCMD ["t.py"]\nENTRYPOINT ["accelerate", "launch"]\nCMD ["--num_processes", "3", "train.py"]\n',
                  "dockerfile", "Dockerfile")
    [launch] = find_launches(order)
    assert (launch.launcher, launch.world_size, launch.script.text) == ("accelerate", 3, "train.py")


def test_dockerfile_arg_values_reach_env():
    """`ARG` values are substituted into `ENV` at build time; an ARG alone is not in the
    container's environment (near miss), and a global ARG needs redeclaring in the stage."""
    text = textwrap.dedent(
        """\
        ARG GLOBAL=8
        FROM python:3.11
        ARG NPROC=4
        ARG GLOBAL
        ARG ONLY_BUILD=2
        ENV WORLD=${NPROC} ALL=$GLOBAL DEFAULTED=${MISSING:-5}
        CMD torchrun --nproc_per_node $WORLD train.py
        """
    )
    doc = parse(text, "dockerfile", "Dockerfile")
    values = {a.name: a.value.text for a in doc.assignments}
    assert values == {"WORLD": "4", "ALL": "8", "DEFAULTED": "${MISSING:-5}"}
    assert find_launches(doc)[0].world_size == 4
    bare = parse("FROM x\nARG NPROC=4\nCMD torchrun --nproc_per_node $NPROC train.py\n", "dockerfile", "Dockerfile")
    assert find_launches(bare)[0].world_size is None


def test_heredoc_script_positions_with_tabs_and_an_unquoted_delimiter():
    text = "cat > run.sh <<-EOF\n\texport A=$HOME/x\n\ttorchrun --nproc_per_node 2 t.py\n\tEOF\nbash run.sh\n"
    doc = parse(text)  # parse() checks every word's span against the text
    assert ["torchrun", "--nproc_per_node", "2", "t.py"] in argvs(doc)
    (assignment,) = [a for a in doc.assignments if a.name == "A"]
    assert (assignment.value.text, assignment.span.line, assignment.span.column) == ("$HOME/x", 2, 9)


def test_many_heredocs_and_odd_substitutions_do_not_break_the_reader():
    body = "".join(f"cat > j{i}.sh <<E{i}\necho {i}\nE{i}\n" for i in range(50))
    doc = parse(body + "X=$(sbatch j7.sh $(echo `date`) )\nY=`bash j9.sh`\nZ='$(bash j3.sh)'\n")
    echoed = sorted(int(a[1]) for a in argvs(doc) if a[0] == "echo" and len(a) == 2 and a[1].isdigit())
    # j3 is only named inside single quotes (a literal): only j7 and j9 run
    assert echoed == [7, 9]
