"""The translator's runtime without torch or fairseq, its command line (streaming, skipped lines,
one-line errors for a broken model folder) and its HTTP server (dynamic batching, 400/413/503),
on the tiny models test_export.py trains. Skipped without onnxruntime; the server's tests without
aiohttp (the optional extras ``deploy`` and ``serve``)."""

import json
import os
import queue
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

from fairseq_memattn.deploy import TextCodec, Translator  # noqa: E402
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


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_printed(trained):
    _, folder = trained("attention")
    process = subprocess.Popen(translate_command(folder, "--plain"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=clean_env(), cwd=REPO, text=True)
    process.stdin.write("3 1\n")
    process.stdin.flush()
    first = process.stdout.readline()
    process.send_signal(signal.SIGINT)
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
                                                         "format_version 2"),
        "new-version": (edit_config(format_version=99), "config.json: format_version 99, this translator reads"),
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


# --- the server --------------------------------------------------------------------------


def post(url, body, raw=None):
    """(status, JSON answer) of POST /translate."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/translate", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.fixture
def server(trained):
    """Start a server on 127.0.0.1 (an ephemeral port) over the attention model's translator;
    ``start(**make_app options)`` returns (url, app, translator)."""
    pytest.importorskip("aiohttp", reason="the server needs the optional extra 'serve' (aiohttp)")
    from fairseq_memattn.deploy.serve import BackgroundServer, make_app

    _, folder = trained("attention")
    running = []

    def start(translator=None, **settings):
        translator = translator or Translator(str(folder), threads=1)
        codec = TextCodec(translator.src_dict, translator.tgt_dict)
        options = dict(lenpen=1.0, max_len_a=1.0, max_len_b=2, min_len=1, unk_penalty=0.0, normalize_scores=True)
        app = make_app(translator, codec, options, **settings)
        running.append(BackgroundServer(app))
        return running[-1].url, app, translator

    yield start
    for background in running:
        background.close()


class Recording(Translator):
    """A Translator that records the sources of each translate_ids call."""

    calls: list

    def translate_ids(self, sources, **options):
        self.calls.append(len(sources))
        return super().translate_ids(sources, **options)


@pytest.mark.slow
def test_server_answers_concurrent_clients_as_the_translator_does(server, trained):
    translator = Recording(str(trained("attention")[1]), threads=1)
    translator.calls = []
    url, _, _ = server(translator, window=0.05)
    requests = [{"text": [" ".join(str((i * 7 + j) % 10) for j in range(i % 6 + 1)) for i in range(n, n + 1 + n % 3)],
                 "beam": 2 + n % 3, "nbest": 1 + n % 2, "alignment": n % 4 == 0} for n in range(24)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda body: post(url, body), requests))
    assert max(translator.calls) > 3  # requests were decoded together
    options = dict(max_len_a=1.0, max_len_b=2)
    for body, (status, answer) in zip(requests, answers):
        assert status == 200, answer
        assert len(answer["results"]) == len(body["text"])
        for line, hypotheses in zip(body["text"], answer["results"]):
            expected = Translator.translate_ids(translator, [translator.src_dict.encode(line)], beam=body["beam"],
                                                alignment=body["alignment"], **options)[0][: body["nbest"]]
            assert [h["pieces"] for h in hypotheses] == [translator.tgt_dict.string(h["tokens"]) for h in expected]
            assert [h["score"] for h in hypotheses] == pytest.approx([h["score"] for h in expected], abs=1e-5)
            if body["alignment"]:
                assert [h["alignment"] for h in hypotheses] == [[list(p) for p in h["alignment"]] for h in expected]
    with urllib.request.urlopen(f"{url}/health") as response:
        assert json.load(response) == {"status": "ok"}
    with urllib.request.urlopen(f"{url}/info") as response:
        assert json.load(response)["config"] == translator.config


@pytest.mark.slow
def test_server_refuses_bad_requests_and_keeps_serving(server):
    url, _, _ = server(max_tokens=16, max_sentences=4, max_beam=8)
    bad = [({"text": "3 1"}, 400, "text: expected a list of strings"),
           ({"text": ["3 1"], "beam": 0}, 400, "beam: 0 is outside 1..8"),
           ({"text": ["3 1"], "beam": 9}, 400, "beam: 9 is outside 1..8"),
           ({"text": ["3 1"], "beam": 2, "nbest": 3}, 400, "nbest: 3 is outside 1..2"),
           ({"text": ["3 1"], "alignment": "yes"}, 400, "alignment: expected a boolean"),
           ({"text": ["3 1"], "beam": True}, 400, "beam: expected an integer"),
           ({"text": ["3 1"], "lenpen": 2}, 400, "unknown field(s): lenpen"),
           ([1, 2], 400, "expected a JSON object"),
           ({"text": ["3 1", " ".join(["1"] * 16)]}, 413, "text[1]: 17 tokens (EOS included), more than --max-tokens 16"),
           ({"text": ["3"] * 5}, 413, "text: 5 sentences, more than the server's 4 per request")]
    for body, status, message in bad:
        got, answer = post(url, body)
        assert (got, answer["error"][: len(message)]) == (status, message), (body, answer)
    got, answer = post(url, None, raw=json.dumps({"text": ["3 1 " * 300_000]}).encode())
    assert got == 413 and answer["error"].startswith("the body is larger than the server's"), answer
    got, answer = post(url, None, raw=b"{not json")
    assert got == 400 and answer["error"].startswith("the body is not JSON")
    assert post(url, {"text": []}) == (200, {"results": []})
    status, answer = post(url, {"text": ["3 1"]})
    assert status == 200 and len(answer["results"][0]) == 1


class Gated(Translator):
    """A Translator whose decoding waits for ``gate``; ``decoding`` counts the calls under way,
    ``most`` the most at once."""

    def __init__(self, folder):
        super().__init__(folder, threads=1)
        self.gate, self.lock, self.decoding, self.most = threading.Event(), threading.Lock(), 0, 0

    def translate_ids(self, sources, **options):
        with self.lock:
            self.decoding += 1
            self.most = max(self.most, self.decoding)
        try:
            assert self.gate.wait(timeout=120)
            return super().translate_ids(sources, **options)
        finally:
            with self.lock:
                self.decoding -= 1

    def until_decoding(self, calls: int) -> None:
        deadline = time.monotonic() + 60
        while self.decoding < calls:
            assert time.monotonic() < deadline, self.decoding
            time.sleep(0.01)


@pytest.mark.slow
def test_a_full_queue_gets_503_at_once(server, trained):
    translator = Gated(str(trained("attention")[1]))
    from fairseq_memattn.deploy.serve import BATCHER

    url, app, _ = server(translator, window=0, queue_size=1)
    with ThreadPoolExecutor(2) as pool:
        decoding = pool.submit(post, url, {"text": ["3 1"]})
        translator.until_decoding(1)
        waiting = pool.submit(post, url, {"text": ["4 5 6"]})
        deadline = time.monotonic() + 60
        while app[BATCHER].queue.qsize() < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        start = time.monotonic()
        status, answer = post(url, {"text": ["7"]})
        assert status == 503 and "busy" in answer["error"] and time.monotonic() - start < 5
        translator.gate.set()
        assert decoding.result()[0] == 200 and waiting.result()[0] == 200
    assert waiting.result()[1]["results"][0][0]["pieces"] == \
        alone(Translator(str(trained("attention")[1])), "4 5 6", beam=5, max_len_a=1.0, max_len_b=2)[0][0]


@pytest.mark.slow
def test_server_workers_decode_batches_at_once(server, trained):
    folder = str(trained("attention")[1])
    translator = Gated(folder)
    url, _, _ = server(translator, window=0.05, workers=2)
    lines = ["3 1", "4 5 6", "7 2 9 8", "1", "6 6 2", "5 0 3 8 1"]
    with ThreadPoolExecutor(len(lines)) as pool:
        answers = [pool.submit(post, url, {"text": [line]}) for line in lines]
        translator.until_decoding(2)  # both workers hold a batch before either may decode
        translator.gate.set()
        answers = [answer.result() for answer in answers]
    assert translator.most == 2
    reference = Translator(folder)
    for line, (status, answer) in zip(lines, answers):
        assert status == 200, answer
        assert answer["results"][0][0]["pieces"] == alone(reference, line, beam=5, max_len_a=1.0, max_len_b=2)[0][0]


def test_serve_options_split_the_cores_among_workers(capsys):
    pytest.importorskip("aiohttp", reason="the server needs the optional extra 'serve' (aiohttp)")
    from fairseq_memattn.cli.serve import parse_args

    assert parse_args(["model", "--workers", "2"])[1].threads == max(1, (os.cpu_count() or 1) // 2)
    assert parse_args(["model", "--workers", "2", "--threads", "3"])[1].threads == 3
    assert parse_args(["model"])[1].threads is None  # ONNX Runtime's default
    with pytest.raises(SystemExit):
        parse_args(["model", "--workers", "0"])
    assert "invalid --workers: 0 (must be >= 1)" in capsys.readouterr().err


class Failing(Translator):
    """A Translator whose decoding fails on a batch with source token ``poison``."""

    def translate_ids(self, sources, **options):
        if any(self.poison in source for source in sources):
            raise RuntimeError("the engine gave up")
        return super().translate_ids(sources, **options)


@pytest.mark.slow
def test_a_failed_decoding_gets_500_and_the_server_goes_on(server, trained, caplog):
    translator = Failing(str(trained("attention")[1]), threads=1)
    translator.poison = translator.src_dict.encode("9")[0]
    url, _, _ = server(translator, window=0)
    with caplog.at_level("ERROR", logger="fairseq_memattn.deploy.serve"):
        assert post(url, {"text": ["3 9 1"]}) == (500, {"error": "decoding failed: the engine gave up"})
    assert "RuntimeError: the engine gave up" in caplog.text  # the traceback, for whoever runs the server
    status, answer = post(url, {"text": ["3 1"]})
    assert status == 200 and answer["results"][0][0]["pieces"] == \
        alone(translator, "3 1", beam=5, max_len_a=1.0, max_len_b=2)[0][0]
