"""The README's copy-task commands, pasted as a user would paste them.

Every fenced block of README.md that follows a ``<!-- test: copy -->`` line claims to run on the
copy task. They run here in order, in one scratch directory (later blocks use what earlier ones
made), with the sizes and update counts made tiny; each must succeed and produce its output."""

import os
import re
import resource
import subprocess
import sys
import time

import pytest
from conftest import BIN, PLUGIN_DIR, REPO, clean_env

MARK = "<!-- test: copy -->"
BLOCK = re.compile(re.escape(MARK) + r"\s*\n```(\w+)\n(.*?)```", re.S)

# Tiny models: appended to the end of a fairseq-train command line, so they win over the README's.
TINY = {
    "lstm_memattn": "--encoder-embed-dim 16 --decoder-embed-dim 16 --encoder-hidden-size 16 "
                    "--decoder-hidden-size 16 --encoder-layers 1 --decoder-layers 1 --memory-k 4",
    "transformer_memattn_iwslt_de_en": "--encoder-embed-dim 16 --decoder-embed-dim 16 --encoder-ffn-embed-dim 32 "
                                       "--decoder-ffn-embed-dim 32 --encoder-layers 1 --decoder-layers 1 "
                                       "--encoder-attention-heads 2 --decoder-attention-heads 2 --memory-k 4",
}
TINY["transformer_memattn"] = TINY["transformer_memattn_iwslt_de_en"]  # the CPU-sized block
SMALL = [  # (pattern, replacement): data sizes and update counts
    (r"--copy-train-size \d+", "--copy-train-size 400"),
    (r"--copy-valid-size \d+", "--copy-valid-size 20"),
    (r"--copy-test-size \d+", "--copy-test-size 20"),
    (r"--max-update \d+", "--max-update 8"),
    (r"--warmup-updates \d+", "--warmup-updates 4"),
    (r"--user-dir fairseq_memattn\b", f"--user-dir {PLUGIN_DIR}"),
    (r"^bash recipes/copy/quickstart\.sh", f"bash {REPO}/recipes/copy/quickstart.sh"),
]


def readme_blocks():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def shrink(code):
    """The README's block with tiny sizes: one line per command, then the substitutions."""
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+", " ", re.sub(r"(^|\s)#.*$", "", line)).strip()  # a trailing comment would swallow appended options
        for pattern, replacement in SMALL:
            line = re.sub(pattern, replacement, line)
        arch = re.search(r"--arch (\S+)", line)
        if line.startswith("fairseq-train") and arch:
            line += " " + TINY[arch.group(1)]
        if "quickstart.sh" in line:  # its extra arguments go to fairseq-train
            line += f" {TINY['lstm_memattn']} --max-update 8"
        lines.append(line)
    return "\n".join(lines)


def run_block(language, code, cwd):
    env = clean_env(OMP_NUM_THREADS="1", PATH=BIN + os.pathsep + os.environ["PATH"],
                    SKIP_SETUP="1", OUT=os.path.join(cwd, "quickstart"),
                    COPY_ARGS="--copy-max-len 20 --copy-train-size 400 --copy-valid-size 20 --copy-test-size 20")
    command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def check_outputs(code, result, cwd):
    """What each kind of command must have produced."""
    out = result.stdout
    for destdir in re.findall(r"--destdir (\S+)", code):
        assert os.path.exists(os.path.join(cwd, destdir, "dict.src.txt")), destdir
    for save_dir in re.findall(r"--save-dir (\S+)", code):
        assert os.path.exists(os.path.join(cwd, save_dir, "checkpoint_best.pt")), save_dir
    for generated in re.findall(r"> (\S+)", code):
        with open(os.path.join(cwd, generated), encoding="utf-8") as f:
            text = f.read()
        with open(os.path.join(cwd, "raw", "test.src"), encoding="utf-8") as f:
            test_size = sum(1 for _ in f)
        assert len(re.findall(r"^H-\d+\t", text, re.M)) == test_size, f"{generated}: not every test sentence"
        if "--print-alignment" in code:
            assert re.search(r"^A-\d+\t", text, re.M), f"{generated}: no alignments"
    if "fairseq-memattn-score" in code:
        assert re.search(r"^BLEU [\d.]+ ", out, re.M), out
    if "fairseq-interactive" in code:
        assert re.search(r"^H-0\t", out, re.M), out
    if "quickstart.sh" in code:
        assert '"sentences": 20' in out and os.path.exists(os.path.join(cwd, "quickstart", "score.json")), out
    if "from_pretrained" in code:  # one output line per print()
        assert len(out.splitlines()) == code.count("print("), out
        if "print_alignment" in code:
            assert out.splitlines()[-1].startswith("["), out


def test_readme_marks_its_copy_task_commands():
    code = "\n".join(body for _, body in readme_blocks())
    for command in ("quickstart.sh", "fairseq_memattn.tasks.copy_task", "fairseq-preprocess",
                    "--arch lstm_memattn", "--arch transformer_memattn", "fairseq-generate",
                    "fairseq-interactive", "MemAttnLSTMModel.from_pretrained",
                    "MemAttnTransformerModel.from_pretrained"):
        assert command in code, f"no README block marked {MARK!r} runs {command}"
    for line in code.replace("\\\n", " ").splitlines():
        if line.startswith("fairseq-generate"):  # evaluate every example, the empty ones included
            assert "--required-batch-size-multiple 1" in line and "--min-len 0" in line, line


def option(line, name):
    found = re.search(rf"{name} (\d+)", line)
    return int(found.group(1)) if found else None


def test_readme_says_where_each_transformer_command_runs():
    """A Transformer block sized for a GPU says so before it, and a CPU-sized one learns past
    its warm-up within a few hundred updates, logging as it goes."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    trains = {}
    for match in BLOCK.finditer(readme):
        for line in match.group(2).replace("\\\n", " ").splitlines():
            if line.startswith("fairseq-train") and "--arch transformer_memattn" in line:
                paragraph = readme[:match.start()].rstrip().rsplit("\n\n", 1)[-1]
                trains["GPU" if "On a GPU" in paragraph else "CPU" if "On a CPU" in paragraph else paragraph] = line
    assert sorted(trains) == ["CPU", "GPU"], trains
    cpu = trains["CPU"]
    assert option(cpu, "--warmup-updates") <= 500 and option(cpu, "--max-update") <= 1000, cpu
    assert option(cpu, "--warmup-updates") <= option(cpu, "--max-update") / 2, cpu
    assert option(cpu, "--log-interval") <= 50 and option(cpu, "--encoder-embed-dim") <= 128, cpu


def test_shrink_makes_the_commands_tiny():
    code = shrink("fairseq-train data-bin --user-dir fairseq_memattn --arch lstm_memattn --memory-k 32 \\\n"
                  "    --max-update 3000 --save-dir ckpt   # a comment\n"
                  "bash recipes/copy/quickstart.sh   # trains\n")
    assert code.splitlines() == [
        f"fairseq-train data-bin --user-dir {PLUGIN_DIR} --arch lstm_memattn --memory-k 32 "
        f"--max-update 8 --save-dir ckpt {TINY['lstm_memattn']}",
        f"bash {REPO}/recipes/copy/quickstart.sh {TINY['lstm_memattn']} --max-update 8"]


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [readme_blocks()], ids=["README"])
def test_readme_copy_task_commands_run(blocks, tmp_path):
    for index, (language, body) in enumerate(blocks):
        code = shrink(body) if language == "bash" else body
        start, cpu = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        result = run_block(language, code, str(tmp_path))
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"README block {index + 1}: {time.monotonic() - start:.1f} s, CPU "
              f"{used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime:.1f} s")
        assert result.returncode == 0, f"README block {index + 1} failed:\n{code}\n{result.stderr[-3000:]}"
        check_outputs(code, result, str(tmp_path))
