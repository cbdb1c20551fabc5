"""The translator's runtime without torch or fairseq, its command line (streaming, skipped lines,
one-line errors for a broken model folder, exit statuses, input quirks); the HTTP server:
test_deploy_server.py. On the tiny models test_export.py trains; skipped without onnxruntime
(the optional extra ``deploy``)."""

import importlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, clean_env

pytest.importorskip("onnxruntime", reason="the translator needs the optional extra 'deploy' (onnxruntime)")

from fairseq_memattn.deploy import SourceError, TextCodec, Translator  # noqa: E402
from test_export import trained  # noqa: E402,F401  (the session's trained and exported models)

# Python run with torch and fairseq unimportable, as in an install of the runtime alone.
WITHOUT_TORCH = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "fairseq"):
            raise ModuleNotFoundError(f"{name} is blocked")
sys.meta_path.insert(0, Refuse())
"""
CLI = WITHOUT_TORCH + """
import runpy
sys.argv[0] = "fairseq-memattn-translate"
runpy.run_module("fairseq_memattn.deploy", run_name="__main__", alter_sys=True)
"""
PROG = "fairseq-memattn-translate"


def translate_command(*args):
    return [sys.executable, "-c", CLI, *map(str, args)]


def run_cli(*args, stdin=""):
    return subprocess.run(translate_command(*args), input=stdin, env=clean_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_runtime_imports_without_torch_or_fairseq():
    modules = ["fairseq_memattn.deploy", "fairseq_memattn.deploy.__main__", "fairseq_memattn.deploy.text",
               "fairseq_memattn.cli.translate"]
    try:
        import aiohttp  # noqa: F401

        modules += ["fairseq_memattn.deploy.serve", "fairseq_memattn.cli.serve"]
    except ImportError:
        pass
    check = WITHOUT_TORCH + f"""
import importlib
for name in {modules!r}:
    importlib.import_module(name)
from fairseq_memattn.deploy import Translator
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "fairseq"))
assert not loaded, loaded
assert sys.excepthook is sys.__excepthook__
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", check], env=clean_env(), cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-2000:]
    assert result.stderr == ""  # no fairseq log lines


def test_a_missing_runtime_package_is_named_and_a_broken_one_keeps_its_own_error(tmp_path, monkeypatch, capsys):
    from fairseq_memattn.deploy.graphs import require_onnxruntime
    from fairseq_memattn.deploy.text import SentencePiece

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what an import finds where it is not installed
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(ImportError, match="needs onnxruntime: pip install onnxruntime"):
        require_onnxruntime()
    with pytest.raises(ImportError, match="needs the sentencepiece package: pip install sentencepiece"):
        SentencePiece(str(tmp_path / "spm.model"))
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    from fairseq_memattn.cli import serve

    with pytest.raises(SystemExit) as stop:
        serve.parse_args([str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        'fairseq-memattn-serve: error: the server needs aiohttp: pip install "aiohttp>=3.9"')
    # installed, but its import fails: the command line says why, not "pip install" again
    fake = tmp_path / "site" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("libonnxruntime.so.1: cannot open shared object file")\n')
    result = subprocess.run(translate_command(tmp_path), env=clean_env(PYTHONPATH=f"{tmp_path / 'site'}:{REPO}"),
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1] == f"{PROG}: error: libonnxruntime.so.1: cannot open shared object file", \
        result.stderr[-2000:]


def test_scores_are_printed_in_base_2_as_fairseq_interactive_prints_them(capsys):
    """fairseq divides its float32 tensors by ln 2 (in float32) and prints them; in float64 the
    H- score differs in its last digits."""
    import argparse
    import math

    import numpy as np
    import torch

    from fairseq_memattn.cli.translate import print_hypotheses

    class Codec:
        def target(self, tokens):
            return "pieces", "text"

    positional = np.array([-2.1425821781158447, -0.00012345, -7.76543], np.float32)
    hypotheses = [{"tokens": [4, 2], "score": float(positional[0]), "positional_scores": positional}]
    print_hypotheses(0, "source", hypotheses, Codec(), argparse.Namespace(plain=False, nbest=1, print_alignment=False))
    score = torch.tensor(positional[0]) / math.log(2)  # fairseq-interactive's lines
    expected = ["S-0\tsource", f"H-0\t{score}\tpieces", f"D-0\t{score}\ttext",
                "P-0\t" + " ".join(map("{:.4f}".format, torch.from_numpy(positional).div_(math.log(2)).tolist()))]
    assert capsys.readouterr().out.splitlines() == expected
    assert expected[1] == "H-0\t-3.091092586517334\tpieces"


def alone(translator, line, **options):
    """The CLI's H- lines for ``line`` translated by itself: (pieces, base-2 score) pairs."""
    codec = TextCodec(translator.src_dict, translator.tgt_dict)
    hypotheses = translator.translate_ids([codec.source(line)[1]], **options)[0]
    return [(codec.target(h["tokens"])[0], h["score"]) for h in hypotheses]


def h_lines(stdout, index):
    return [(line.split("\t")[2], float(line.split("\t")[1])) for line in stdout.splitlines()
            if line.startswith(f"H-{index}\t")]


@pytest.mark.slow
def test_cli_streams_skips_bad_lines_and_translates_each_line_alone(trained):
    _, folder = trained("attention")
    translator = Translator(str(folder), threads=1)
    options = ["--beam", "3", "--nbest", "2", "--max-len-a", "1", "--max-len-b", "2", "--min-len", "4",
               "--max-tokens", "12", "--buffer-size", "2"]
    process = subprocess.Popen(translate_command(folder, *options), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=clean_env(), cwd=REPO, text=True)
    lines = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True)
    reader.start()
    # the first buffer is printed before standard input ends
    process.stdin.write("3 1\n1 2 3 4 5 6 7 8\n")
    process.stdin.flush()
    printed = []
    while sum(line.startswith("P-1\t") for line in printed) < 2:
        printed.append(lines.get(timeout=120))
    bad = ["1 2 3 4 5 6 7 8 9 1 2 3", ""]  # longer than --max-tokens; a maximum length below --min-len
    process.stdin.write("\n".join(bad) + "\n3 xx 1\n3 1\n")
    process.stdin.close()
    assert process.wait(timeout=120) == 1
    reader.join(timeout=30)
    stdout = "".join(printed + [lines.get() for _ in range(lines.qsize())])
    stderr = process.stderr.read()
    assert f"{PROG}: line 3: 13 tokens (EOS included), more than --max-tokens 12; skipped" in stderr
    assert f"{PROG}: line 4: invalid --min-len: 4 (the maximum length for this source is 3" in stderr
    assert "line 5" not in stderr and "line 6" not in stderr
    assert [line.split("\t")[0] for line in stdout.splitlines() if line.startswith("S-")] == \
        ["S-0", "S-1", "S-4", "S-5"]  # ids count input lines from 0
    assert "S-4\t3 <unk> 1\n" in stdout  # as fairseq-interactive shows a source
    search = dict(beam=3, max_len_a=1, max_len_b=2, min_len=4)
    for index, line in [(0, "3 1"), (1, "1 2 3 4 5 6 7 8"), (4, "3 xx 1"), (5, "3 1")]:
        expected = alone(translator, line, **search)[:2]
        got = h_lines(stdout, index)
        assert [pieces for pieces, _ in got] == [pieces for pieces, _ in expected], (index, stdout)
        assert [score for _, score in got] == pytest.approx([s / 0.6931471805599453 for _, s in expected], abs=1e-4)


@pytest.mark.slow
def test_a_source_holding_the_padding_symbol_is_refused(trained):
    """A word "<pad>" is the padding id, by which a batch's padding is told from its tokens: beside
    a source padded on its left it took the source's first token away."""
    translator = Translator(str(trained("attention")[1]), threads=1)
    codec = TextCodec(translator.src_dict, translator.tgt_dict)
    message = "token 2 is the padding symbol '<pad>', which is not a word: remove it"
    with pytest.raises(SourceError, match=re.escape(f"source 1: {message}")):
        translator.translate_ids([codec.source("3 1 2 4")[1], codec.source("3 <pad> 1")[1]])
    result = run_cli(trained("attention")[1], "--buffer-size", "2", stdin="3 1 2 4\n3 <pad> 1\n")
    assert result.returncode == 1 and f"{PROG}: line 2: {message}; skipped" in result.stderr.splitlines()
    assert h_lines(result.stdout, 0) and not h_lines(result.stdout, 1)


@pytest.mark.slow
def test_plain_output_has_a_line_for_every_input_line(trained):
    """--plain prints no ids: a skipped line leaves an empty line, so that output line n is input line n's."""
    _, folder = trained("attention")
    for buffer_size in ("1", "3"):
        result = run_cli(folder, "--plain", "--max-tokens", "4", "--buffer-size", buffer_size,
                         stdin="3 1\n1 2 3 4 5\n3 1\n")
        assert result.returncode == 1 and f"{PROG}: line 2: 6 tokens" in result.stderr, result.stderr
        first, skipped, third = result.stdout.split("\n")[:3]
        assert (skipped, len(result.stdout.splitlines())) == ("", 3) and first == third != ""


@pytest.mark.slow
def test_cli_reads_a_pipe_and_reports_a_full_disk_on_one_line(trained):
    _, folder = trained("attention")
    piped = run_cli(folder, "--input", "/dev/stdin", stdin="3 1\n")
    assert piped.returncode == 0 and piped.stdout.startswith("S-0\t3 1\n"), piped.stderr
    result = subprocess.run(f"{' '.join(map(shlex.quote, translate_command(folder)))} > /dev/full", shell=True,
                            input="3 1\n", env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        f"{PROG}: error: [Errno 28] No space left on device"], result.stderr


def test_cli_writes_utf8_whatever_the_locale(trained, tmp_path):
    """Words outside the locale's encoding (a latin-1 terminal) print as UTF-8, as the input is read,
    not as a UnicodeEncodeError."""
    _, folder = trained("attention")
    words = {"3": "日", "1": "é"}

    def non_ascii_words(target):
        for name in ("dict.source.txt", "dict.target.txt"):
            lines = (target / name).read_text(encoding="utf-8").splitlines()
            (target / name).write_text("".join(f"{words.get(word, word)} {count}\n" for word, count in
                                               (line.split(" ") for line in lines)), encoding="utf-8")

    unicode_folder = break_folder(folder, tmp_path / "unicode", non_ascii_words)
    result = subprocess.run(translate_command(unicode_folder), input="日 é\n".encode(), capture_output=True,
                            env=clean_env(PYTHONIOENCODING="latin-1"), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert result.stdout.decode("utf-8").startswith("S-0\t日 é\n")


def test_translate_called_from_a_program_writes_to_its_stringio(trained, tmp_path):
    """A program's own stdout (a StringIO: no encoding, no reconfigure) takes the lines as str."""
    import contextlib
    import io

    from fairseq_memattn.cli.translate import translate

    _, folder = trained("attention")
    source = tmp_path / "in.txt"
    source.write_text("3 1\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert translate([str(folder), "--input", str(source)]) == 0
    assert out.getvalue().startswith("S-0\t3 1\n")


class Meeting(Translator):
    """A Translator whose first two batches must be decoding at the same time (``meet``, a barrier)."""

    def generate(self, src_tokens, **options):
        if not self.met:
            self.meet.wait()  # BrokenBarrierError after its timeout if the batches decode one after another
            self.met = True
        return super().generate(src_tokens, **options)


@pytest.mark.slow
def test_workers_decode_batches_at_once_with_the_same_hypotheses(trained):
    folder = str(trained("attention")[1])
    sources = [[4 + (i * 7 + j) % 10 for j in range(i % 8 + 1)] + [2] for i in range(13)]
    search = dict(batch_size=3, beam=3, max_len_b=10, alignment=True)
    expected = Translator(folder, threads=1).translate_ids(sources, **search)
    translator = Meeting(folder, threads=1)
    translator.meet, translator.met = threading.Barrier(2, timeout=60), False
    got = translator.translate_ids(sources, workers=2, **search)
    for mine, theirs in zip(got, expected):
        assert [h["tokens"].tolist() for h in mine] == [h["tokens"].tolist() for h in theirs]
        assert [h["score"] for h in mine] == [h["score"] for h in theirs]
        assert [h["alignment"] for h in mine] == [h["alignment"] for h in theirs]
    # one batch of them all: cut in two, one for each worker
    translator.meet, translator.met = threading.Barrier(2, timeout=60), False
    whole = dict(search, batch_size=None)
    assert [[h["tokens"].tolist() for h in r] for r in translator.translate_ids(sources, workers=2, **whole)] == \
        [[h["tokens"].tolist() for h in r] for r in expected]
    lines = "".join(" ".join(map(str, source[:-1])) + "\n" for source in sources)
    one, two = (run_cli(folder, "--buffer-size", "13", "--batch-size", "3", "--threads", "1", "--workers", workers,
                        stdin=lines) for workers in ("1", "2"))
    assert one.returncode == two.returncode == 0, two.stderr
    assert two.stdout == one.stdout and one.stdout.count("H-") == len(sources)


@pytest.mark.slow
def test_parallel_benchmark_gives_each_setting_the_same_outputs(trained, tmp_path):
    """recipes/speed/parallel.py on the export alone (CTranslate2 is optional): one row, whose three
    settings (1 thread, 2 threads, 2 batches at once) produced the same output tokens."""
    source = tmp_path / "pieces.txt"
    source.write_text("".join(" ".join(str((i * 3 + j) % 10) for j in range(i % 5 + 1)) + "\n" for i in range(9)))
    out = tmp_path / "parallel.md"
    result = subprocess.run([sys.executable, "-m", "recipes.speed.parallel", "--export", str(trained("attention")[1]),
                             "--input", str(source), "--batch-size", "2", "--repeats", "1", "--out", str(out)],
                            env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| exported")]
    assert len(rows) == 1, out.read_text()
    tokens = {cell.split("(")[1] for cell in rows[0].split("|")[3:6]}
    assert len(tokens) == 1 and "9 sentences" in out.read_text(), rows


def interruptible():
    """SIGINT back to its default in the child: a shell runs background jobs with SIGINT ignored,
    children inherit that, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_printed(trained):
    _, folder = trained("attention")
    process = subprocess.Popen(translate_command(folder, "--plain"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=clean_env(), cwd=REPO, text=True,
                               preexec_fn=interruptible)
    process.stdin.write("3 1\n")
    process.stdin.flush()
    first = process.stdout.readline()
    process.send_signal(signal.SIGINT)
    process.stdin.close()  # see test_ctrl_c_at_start_up_exits_130_quietly
    assert process.wait(timeout=60) == 130
    assert first.strip() and "Traceback" not in process.stderr.read()


def break_folder(source, target, change):
    shutil.copytree(source, target)
    change(target)
    return target


def edit_config(**changes):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                del config[key]
            else:
                config[key] = value
        (folder / "config.json").write_text(json.dumps(config))
    return change


@pytest.mark.slow
def test_session_options_reach_both_graphs(trained, tmp_path):
    """Translator(session_options=...) runs both graphs with them (here ONNX Runtime's profiler), with
    the same hypotheses as the default options."""
    import onnxruntime as ort

    _, folder = trained("attention")
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, str(tmp_path / "profile")
    profiled, plain = Translator(str(folder), session_options=options), Translator(str(folder), threads=1)
    sources = [plain.src_dict.encode(" ".join(plain.src_dict.symbols[4:4 + n])) for n in (3, 6)]
    assert ([[h["tokens"].tolist() for h in r] for r in profiled.translate_ids(sources, beam=3)]
            == [[h["tokens"].tolist() for h in r] for r in plain.translate_ids(sources, beam=3)])
    for session in (profiled.encoder, profiled.decoder):
        path = session.end_profiling()
        with open(path) as f:
            assert any(event.get("cat") == "Node" for event in json.load(f))
        os.remove(path)  # the other graph's profile may take the same file name


@pytest.mark.slow
def test_cli_names_the_broken_file_in_one_line(trained, tmp_path):
    _, folder = trained("attention")
    cases = {
        "no-encoder": (lambda f: (f / "encoder.onnx").unlink(), "encoder.onnx: no such file"),
        "corrupt-decoder": (lambda f: (f / "decoder.onnx").write_bytes(b"\x00not onnx"),
                            "decoder.onnx: not a readable ONNX graph"),
        "no-key": (edit_config(memory_k=None), "config.json: missing key 'memory_k'"),
        "no-version": (edit_config(format_version=None), "config.json: no format_version, this translator reads "
                                                         "format_version 2, 3, 4"),
        "version-3-short-rows": (edit_config(format_version=3), "config.json: short_source_rows in format_version 3, "
                                                                "which this translator no longer reads (export the "
                                                                "model again"),
        "short-rows-over-k": (edit_config(short_source_rows=5), "config.json: short_source_rows is 5, expected an "
                                                                 "integer from 1 to memory_k (4)"),
        "new-version": (edit_config(format_version=99), "config.json: format_version 99, this translator reads"),
        "state-from-a-list": (edit_config(decoder_state=[{"name": "state_h", "from": ["initial_h"]}]),
                              "config.json: decoder_state is [{'name': 'state_h', 'from': ['initial_h']}], expected "
                              "a list of {'name', and 'from' (an encoder output's name) or 'zeros'"),
        "state-zeros-a-number": (edit_config(decoder_state=[{"name": "state_h", "zeros": 5}]),
                                 "config.json: decoder_state is [{'name': 'state_h', 'zeros': 5}], expected"),
        "symbols-a-string": (edit_config(source_symbols="14"), "config.json: source_symbols is '14', expected an "
                                                               "integer >= 4"),
        "not-json": (lambda f: (f / "config.json").write_text("{"), "config.json: not readable as JSON"),
        "no-dictionary": (lambda f: (f / "dict.target.txt").unlink(), "dict.target.txt"),
    }
    for name, (change, message) in cases.items():
        broken = break_folder(folder, tmp_path / name, change)
        result = run_cli(broken, stdin="3 1\n")
        assert result.returncode == 2, (name, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{PROG}: error: ") and message in last, (name, result.stderr)
        assert "Traceback" not in result.stderr, name
    for args, message in [(["--input", tmp_path / "none.txt"], "--input: no such file: "),
                          (["--bpe", "sentencepiece", "--sentencepiece-model", tmp_path / "none.model"],
                           "none.model: no such sentencepiece model")]:
        result = run_cli(folder, *args)
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and last.startswith(f"{PROG}: error: ") and message in last, result.stderr


def serve_command(*args):
    return [sys.executable, "-c", WITHOUT_TORCH + """
from fairseq_memattn.cli.serve import main
sys.exit(main())
""", *map(str, args)]


def swap_graphs(folder):
    (folder / "encoder.onnx").rename(folder / "swap.onnx")
    (folder / "decoder.onnx").rename(folder / "encoder.onnx")
    (folder / "swap.onnx").rename(folder / "decoder.onnx")


def append(name, text):
    def change(folder):
        with open(folder / name, "a") as f:
            f.write(text)
    return change


def drop_last_symbols(folder):
    lines = (folder / "dict.source.txt").read_text().splitlines(keepends=True)
    (folder / "dict.source.txt").write_text("".join(lines[:-2]))


def older_export_with_more_source_symbols(folder):
    """An export without config.json's source_symbols: the encoder's embedding is the check."""
    append("dict.source.txt", "extra 1\nmore 1\n")(folder)
    edit_config(source_symbols=None)(folder)


def encoder_of_another_export(folder):
    """encoder.onnx as another export of the model writes it (with another --short-source-rows, say)."""
    import onnx

    from fairseq_memattn.deploy.config import EXPORT_ID

    graph = onnx.load(folder / "encoder.onnx")
    onnx.helper.set_model_props(graph, {EXPORT_ID: "another export"})
    onnx.save(graph, folder / "encoder.onnx")


@pytest.mark.slow
def test_a_folder_whose_parts_do_not_fit_is_refused_at_load(trained, tmp_path):
    """Checked whole when the Translator loads: the CLI and the server end on one line, status 2,
    before the first sentence (the server before it listens)."""
    _, folder = trained("attention")
    cases = {
        "target-dictionary": (append("dict.target.txt", "extra 1\n"),
                              "dict.target.txt: 15 symbols (the four special ones included), but"),
        "source-dictionary": (append("dict.source.txt", "extra 1\n"),
                              "dict.source.txt: 15 symbols (the four special ones included), but the model was "
                              "exported with 14"),
        "short-source-dictionary": (drop_last_symbols, "dict.source.txt: 12 symbols (the four special ones "
                                                       "included), but the model was exported with 14"),
        "source-dictionary-older-export": (older_export_with_more_source_symbols,
                                           "dict.source.txt: 16 symbols (the four special ones included), more "
                                           "than the encoder's embedding has"),
        "garbage-dictionary": (lambda f: (f / "dict.source.txt").write_text("hello\nworld\n"),
                               "dict.source.txt: line 1: expected '<symbol> <count>'"),
        "duplicate-symbol": (append("dict.target.txt", "3 1\n"), "dict.target.txt: line 11: duplicate symbol '3'"),
        "swapped-graphs": (swap_graphs, "encoder.onnx: no input 'src_tokens' (its inputs: prev_tokens, step"),
        "graph-of-another-export": (encoder_of_another_export, "encoder.onnx: not written by the export of this "
                                                               "folder's config.json (a file of another export?)"),
        "eos-outside": (edit_config(eos=14), "config.json: eos is 14, outside dict.target.txt's 14 symbols (0..13)"),
        "unk-not-special": (edit_config(unk=5), "config.json: unk is 5, expected one of the first 4 target symbols"),
        "pad-type": (edit_config(source_pad="1"), "config.json: source_pad is '1', expected an integer >= 0"),
        "alignment-memory": (edit_config(alignment_memory=5), "config.json: alignment_memory is 5, but "),
        "cache-heads": (edit_config(self_attention_cache=[{"heads": 3, "head_dim": 5}] * 2),
                        "config.json: self_attention_cache[0] is {'heads': 3, 'head_dim': 5}, but "),
    }
    for name, (change, message) in cases.items():
        broken = break_folder(folder, tmp_path / name, change)
        for command, prog in ((translate_command(broken), PROG),
                              (serve_command(broken, "--port", "0"), "fairseq-memattn-serve")):
            result = subprocess.run(command, input="3 1\n", env=clean_env(), cwd=REPO, capture_output=True,
                                    text=True, timeout=120)
            last = result.stderr.strip().splitlines()[-1]
            assert result.returncode == 2 and last.startswith(f"{prog}: error: ") and message in last, \
                (name, prog, result.stderr)
            assert "Traceback" not in result.stderr and "Running on" not in result.stderr, (name, result.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["translate", "serve"])
def test_ctrl_c_at_start_up_exits_130_quietly(trained, tmp_path, tool):
    if tool == "serve":
        pytest.importorskip("aiohttp", reason="the server needs the optional extra 'serve' (aiohttp)")
    _, folder = trained("attention")
    slow = break_folder(folder, tmp_path / "fifo", lambda f: (f / "dict.source.txt").unlink())
    os.mkfifo(slow / "dict.source.txt")  # the translator's load waits on it
    command = translate_command(slow) if tool == "translate" else serve_command(slow, "--port", "0")
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=clean_env(), cwd=REPO, text=True,
                               preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while True:  # a write end opens once the translator has the dictionary open
        try:
            writer = os.open(slow / "dict.source.txt", os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert time.monotonic() < deadline and process.poll() is None, process.stderr.read()
            time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    # A SIGINT that lands between Python's last signal check and the read it then blocks in is
    # raised only when that read returns (an eighth of the time on two busy cores): the end of the
    # file lets it return, and the exit must still be Ctrl-C's, not the short dictionary's error.
    os.close(writer)
    assert process.wait(timeout=60) == 130
    stdout, stderr = process.communicate()
    assert stdout == "" and stderr == "", stderr


@pytest.mark.slow
def test_a_closed_standard_output_ends_quietly(trained):
    """``fairseq-memattn-translate ... | head -1``: status 141, no BrokenPipeError."""
    _, folder = trained("attention")
    process = subprocess.Popen(translate_command(folder, "--plain"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=clean_env(), cwd=REPO)
    process.stdin.write(b"3 1\n")
    process.stdin.flush()
    assert process.stdout.readline().strip()
    process.stdout.close()  # before the next line is read: its translation is written to a closed pipe
    process.stdin.write(b"3 1\n")
    process.stdin.close()
    assert process.wait(timeout=120) == 141
    assert process.stderr.read() == b""


@pytest.mark.slow
def test_a_bom_and_cr_or_crlf_line_ends_are_read_as_lines(trained):
    _, folder = trained("attention")
    result = subprocess.run(translate_command(folder, "--buffer-size", "4"), env=clean_env(), cwd=REPO,
                            capture_output=True, timeout=120, input=b"\xef\xbb\xbf3 1\r4 5 6\r\n7\r\r\n8 9")
    assert result.returncode == 0, result.stderr
    sources = [line for line in result.stdout.decode().splitlines() if line.startswith("S-")]
    assert sources == ["S-0\t3 1", "S-1\t4 5 6", "S-2\t7", "S-3\t", "S-4\t8 9"]


def test_a_bom_alone_is_no_line_and_an_unreadable_input_is_named():
    import io

    from fairseq_memattn.cli.translate import raw_lines

    assert list(raw_lines(io.BytesIO(b"\xef\xbb\xbf"))) == []
    assert list(raw_lines(io.BytesIO(b"\xef\xbb\xbf\n"))) == [b""]  # a BOM, then an empty line

    class Unreadable(io.BytesIO):
        name = "in.txt"

        def readline(self, *args):
            raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match=r"^\[Errno 5\] --input in.txt: Input/output error$"):
        list(raw_lines(Unreadable()))


@pytest.mark.parametrize("tool, args, message", [
    ("translate", ["--lenpen", "nan"], "invalid --lenpen: nan (must be a finite number)"),
    ("translate", ["--unkpen", "inf"], "invalid --unkpen: inf (must be a finite number)"),
    ("translate", ["--lenpen", "300"], "invalid --lenpen: 300.0 (must be between -10 and 10)"),
    ("translate", ["--unkpen=-1e308"], "invalid --unkpen: -1e+308 (must be between -10000 and 10000)"),
    ("translate", ["--threads", "9" * 400], f"invalid --threads: {'9' * 400} (must be between 1 and "),
    ("translate", ["--max-len-a", "-0.5"], "invalid --max-len-a: -0.5 (must be >= 0)"),
    ("translate", ["--max-len-a", "inf"], "invalid --max-len-a: inf (must be a finite number)"),
    ("translate", ["--max-len-b", "-1"], "invalid --max-len-b: -1 (must be >= 0)"),
    ("translate", ["--beam", "0"], "invalid --beam: 0 (must be >= 1)"),
    ("translate", ["--threads", "0"], "invalid --threads: 0 (must be between 1 and "),
    ("translate", ["--threads", "100000"], "invalid --threads: 100000 (must be between 1 and "),
    ("translate", ["--workers", "0"], "invalid --workers: 0 (must be >= 1)"),
    ("translate", ["--max-tokens", "0"], "invalid --max-tokens: 0 (must be >= 1)"),
    ("translate", ["--buffer-size", "0"], "invalid --buffer-size: 0 (must be between 1 and 9223372036854775807)"),
    ("translate", ["--buffer-size", str(2 ** 63)],
     "invalid --buffer-size: 9223372036854775808 (must be between 1 and 9223372036854775807)"),
    ("translate", ["--batch-size", "0"], "invalid --batch-size: 0 (must be >= 1)"),
    ("serve", ["--lenpen=-inf"], "invalid --lenpen: -inf (must be a finite number)"),
    ("serve", ["--max-len-a", "nan"], "invalid --max-len-a: nan (must be a finite number)"),
    ("serve", ["--threads", "100000"], "invalid --threads: 100000 (must be between 1 and "),
    ("serve", ["--batch-window-ms", "nan"], "invalid --batch-window-ms: nan (must be a finite number)"),
    ("serve", ["--batch-window-ms", "-1"], "invalid --batch-window-ms: -1.0 (must be >= 0)"),
    ("serve", ["--timeout-s", "0"], "invalid --timeout-s: 0.0 (must be >= 0.001)"),
    ("serve", ["--idle-timeout-s", "inf"], "invalid --idle-timeout-s: inf (must be a finite number)"),
    ("serve", ["--port", "65536"], "invalid --port: 65536 (must be between 0 and 65535)"),
    ("serve", ["--queue-size", "0"], "invalid --queue-size: 0 (must be >= 1)"),
    ("serve", ["--batch-window-ms", "5000", "--timeout-s", "5"],
     "invalid --batch-window-ms: 5000 (must be below --timeout-s 5 in milliseconds)"),
])
def test_options_are_range_checked_at_parse_time(tool, args, message, capsys):
    """The translator's and the server's options (the shared ones in both): one argparse line, status 2."""
    if tool == "serve":
        pytest.importorskip("aiohttp", reason="the server needs the optional extra 'serve' (aiohttp)")
    parse_args = importlib.import_module(f"fairseq_memattn.cli.{tool}").parse_args
    with pytest.raises(SystemExit) as exit:
        parse_args(["model", *args])
    assert exit.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
