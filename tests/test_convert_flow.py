"""docs/convert.md's whole flow, pasted as a user would paste it: fairseq's transformer trained,
converted, fine-tuned and evaluated on the README's copy-task data, with the sizes made tiny."""

import os
import re
import subprocess
import sys

import pytest
from conftest import BIN, PLUGIN_DIR, REPO, clean_env

pytestmark = pytest.mark.slow  # trains (docs/testing.md)

TEST_SIZE = 20  # not a multiple of 8: fairseq-generate drops 4 of them without the option below
SMALL = [  # (pattern, replacement): tiny sizes, few updates, the plugin by its path
    (r"--encoder-layers 3 --decoder-layers 3", "--encoder-layers 1 --decoder-layers 1"),
    (r"embed-dim 128", "embed-dim 16"),
    (r"ffn-embed-dim 512", "ffn-embed-dim 32"),
    (r"attention-heads 4", "attention-heads 2"),
    (r"--warmup-updates \d+", "--warmup-updates 4"),
    (r"--max-update 600", "--max-update 6"),
    (r"--max-update 650", "--max-update 10"),
    (r"--memory-k 16", "--memory-k 4"),
    (r"--user-dir fairseq_memattn\b", f"--user-dir {PLUGIN_DIR}"),
]


def flow():
    with open(os.path.join(REPO, "docs", "convert.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## The whole flow"):]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def shrink(code):
    for pattern, replacement in SMALL:
        code = re.sub(pattern, replacement, code)
    return code


def run(command, cwd):
    env = clean_env(OMP_NUM_THREADS="1", PATH=BIN + os.pathsep + os.environ["PATH"])
    return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def hypotheses(path):
    with open(path, encoding="utf-8") as f:
        return len(re.findall(r"^H-\d+\t", f.read(), re.M))


def test_convert_flow_trains_converts_fine_tunes_and_scores_every_test_sentence(tmp_path):
    data = run(f"{sys.executable} -m fairseq_memattn.tasks.copy_task --out-dir raw --copy-max-len 6 "
               f"--copy-train-size 300 --copy-valid-size 20 --copy-test-size {TEST_SIZE} && "
               "fairseq-preprocess --source-lang src --target-lang tgt --trainpref raw/train "
               "--validpref raw/valid --testpref raw/test --joined-dictionary --destdir data-bin", tmp_path)
    assert data.returncode == 0, data.stderr[-3000:]
    code = shrink(flow())
    assert code.count("--max-update 6") == 1 and code.count("--max-update 10") == 1  # the sizes were shrunk
    result = run(code, tmp_path)
    assert result.returncode == 0, f"{code}\n{result.stderr[-3000:]}"
    assert re.search(r"^BLEU [\d.]+ ", result.stdout, re.M), result.stdout
    assert hypotheses(tmp_path / "gen.converted.txt") == TEST_SIZE
    log = result.stdout + result.stderr
    assert "num_updates 10" in log or "num_updates=10" in log  # the fine-tuning continued the count

    # the reason for --required-batch-size-multiple 1: fairseq's default of 8 drops the last batch
    generate = re.search(r"^fairseq-generate .*?> gen.converted.txt", code.replace("\\\n", " "), re.M | re.S).group(0)
    dropped = run(generate.replace("--required-batch-size-multiple 1", "").replace("gen.converted.txt", "gen.8.txt"),
                  tmp_path)
    assert dropped.returncode == 0, dropped.stderr[-3000:]
    assert hypotheses(tmp_path / "gen.8.txt") == TEST_SIZE - TEST_SIZE % 8
