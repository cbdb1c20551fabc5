"""fairseq-memattn-score on fairseq-generate's output and on the translator's, and its one-line
errors (no references, sacrebleu missing)."""

import os
import subprocess

from conftest import BIN, clean_env

# fairseq-memattn-translate's lines for two input lines (cli/translate.py: S-, H- with the
# pieces, D- with the text, P-; ids count input lines from 0; scores in base 2)
TRANSLATED = ("S-0\t1 2 3\nH-0\t-0.1\t1 2 3\nD-0\t-0.1\t1 2 3\nP-0\t-0.1 -0.1 -0.1 -0.1\n"
              "S-1\t4 5\nH-1\t-0.2\t4 4\nD-1\t-0.2\t4 4\nP-1\t-0.2 -0.2 -0.2\n")


def score(*args, cwd, env=None):
    return subprocess.run([os.path.join(BIN, "fairseq-memattn-score"), *map(str, args)], cwd=cwd,
                          env=env or clean_env(), capture_output=True, text=True, timeout=120)


def test_translator_output_is_scored_against_a_reference_file(tmp_path):
    (tmp_path / "out.txt").write_text(TRANSLATED)
    (tmp_path / "ref.txt").write_text("1 2 3\n4 5\n")
    result = score("out.txt", "--reference", "ref.txt", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"accuracy": 50.0, "sentences": 2' in result.stdout


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    (tmp_path / "out.txt").write_text("\ufeff" + TRANSLATED, encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\ufeff1 2 3\n4 4\n", encoding="utf-8")
    result = score("out.txt", "--reference", "ref.txt", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"accuracy": 100.0, "sentences": 2' in result.stdout


def test_output_without_references_says_what_it_needs(tmp_path):
    (tmp_path / "out.txt").write_text(TRANSLATED)
    result = score("out.txt", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-memattn-score: error: out.txt: no T- (reference) lines: fairseq-generate prints them; "
        "for the output of fairseq-memattn-translate or fairseq-interactive give the references with "
        "--reference FILE (one line per input line)")
    (tmp_path / "short.txt").write_text("1 2 3\n")
    result = score("out.txt", "--reference", "short.txt", cwd=tmp_path)
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-memattn-score: error: out.txt: --reference has 1 lines but the output has hypotheses "
        "for line ids up to 1 (counted from 0): give one reference per input line")


def test_without_sacrebleu_one_line_says_so(tmp_path):
    stub = tmp_path / "stub"
    stub.mkdir()
    # at start-up, as an interpreter without sacrebleu finds it
    (stub / "sitecustomize.py").write_text("import sys\nsys.modules['sacrebleu'] = None\n")
    (tmp_path / "out.txt").write_text("S-0\t1 2\nT-0\t1 2\nH-0\t-0.1\t1 2\n")
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(stub), env["PYTHONPATH"]])
    result = score("out.txt", cwd=tmp_path, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-memattn-score: error: BLEU needs sacrebleu, which is not installed: pip install 'sacrebleu>=2.0'")
    assert score("out.txt", cwd=tmp_path).returncode == 0  # with it


def test_two_runs_output_and_text_that_is_not_utf8_are_refused(tmp_path):
    """Two fairseq-generate outputs in one file would pair the first run's hypothesis with the
    last run's reference; bytes that are not UTF-8 end in one line, not a UnicodeDecodeError."""
    (tmp_path / "twice.txt").write_text("T-0\t1 2\nH-0\t-0.1\t1 2\nT-0\t3 4\nH-0\t-0.1\t3 4\n")
    (tmp_path / "latin1.txt").write_bytes(b"T-0\t1 2\nH-0\t-0.1\t\xe9\n")
    (tmp_path / "ref.txt").write_bytes(b"\xe9\n")
    (tmp_path / "out.txt").write_text(TRANSLATED)
    for args, message in ((["twice.txt"], "twice.txt: T-0 appears twice: give the output of one fairseq-generate run"),
                          (["latin1.txt"], "latin1.txt: not UTF-8 text (invalid continuation byte)"),
                          (["out.txt", "--reference", "ref.txt"],
                           "--reference ref.txt: not UTF-8 text (invalid continuation byte)"),
                          (["out.txt", "--by-length", "0"], "argument --by-length: invalid value 0 (must be an integer >= 1)")):
        result = score(*args, cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().splitlines()[-1] == "fairseq-memattn-score: error: " + message
