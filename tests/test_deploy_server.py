"""The HTTP server (fairseq_memattn.deploy.serve): dynamic batching, its answers as the
Translator's, client errors as 4xx JSON (400/404/405/413, 503 with Retry-After, 504 past the
deadline), abandoned requests dropped and idle connections closed, on the tiny models
test_export.py trains. Skipped without onnxruntime or aiohttp (the optional extras ``deploy``
and ``serve``)."""

import gzip
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("onnxruntime", reason="the translator needs the optional extra 'deploy' (onnxruntime)")
pytest.importorskip("aiohttp", reason="the server needs the optional extra 'serve' (aiohttp)")

from fairseq_memattn.deploy import TextCodec, Translator  # noqa: E402
from fairseq_memattn.deploy.serve import BATCHER, BackgroundServer, make_app  # noqa: E402
from test_deploy import alone  # noqa: E402
from test_export import trained  # noqa: E402,F401  (the session's trained and exported models)


def call(url, path="/translate", data=None, headers=None, method=None):
    """(status, headers, JSON answer) of a request."""
    request = urllib.request.Request(f"{url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.load(error)


def post(url, body, raw=None):
    """(status, JSON answer) of POST /translate."""
    status, _, answer = call(url, data=raw if raw is not None else json.dumps(body).encode())
    return status, answer


@pytest.fixture
def server(trained):
    """Start a server on 127.0.0.1 (an ephemeral port) over the attention model's translator;
    ``start(**make_app options)`` returns (url, app, translator)."""
    _, folder = trained("attention")
    running = []

    def start(translator=None, sentencepiece_model=None, idle_timeout=15.0, **settings):
        translator = translator or Translator(str(folder), threads=1)
        codec = TextCodec(translator.src_dict, translator.tgt_dict, sentencepiece_model)
        options = dict(lenpen=1.0, max_len_a=1.0, max_len_b=2, min_len=1, unk_penalty=0.0, normalize_scores=True)
        app = make_app(translator, codec, options, **settings)
        running.append(BackgroundServer(app, idle_timeout=idle_timeout))
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
    with urllib.request.urlopen(f"{url}/health", timeout=60) as response:
        assert json.load(response) == {"status": "ok"}
    with urllib.request.urlopen(f"{url}/info", timeout=60) as response:
        assert json.load(response)["config"] == translator.config


@pytest.mark.slow
def test_server_refuses_bad_requests_and_keeps_serving(server):
    url, _, _ = server(max_tokens=16, max_sentences=4, max_beam=8)
    bad = [({"text": "3 1"}, 400, 'text: expected a list of strings, got "3 1"'),
           ({}, 400, "text: missing; expected a list of strings"),
           ({"text": None}, 400, "text: expected a list of strings, got null"),
           ({"text": ["3 1", 5]}, 400, "text[1]: expected a string, got 5"),
           ({"text": ["3 1"], "beam": 0}, 400, "beam: 0 is outside 1..8"),
           ({"text": ["3 1"], "beam": 9}, 400, "beam: 9 is outside 1..8"),
           ({"text": ["3 1"], "beam": 2, "nbest": 3}, 400, "nbest: 3 is outside 1..2"),
           ({"text": ["3 1"], "alignment": "yes"}, 400, "alignment: expected a boolean"),
           ({"text": ["3 1"], "beam": True}, 400, "beam: expected an integer"),
           ({"text": ["3 1"], "lenpen": 2}, 400, "unknown field(s): lenpen"),
           ({"text": ["3 1"], "x" * 100: 2}, 400, f"unknown field(s): {'x' * 37}... (known: "),
           ({"text": ["3 1"], "beam": 10 ** 100}, 400, f"beam: {'1' + '0' * 36}... is outside 1..8"),
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
    ``most`` the most at once, ``decoded`` lists the sources of the calls that went on."""

    def __init__(self, folder):
        super().__init__(folder, threads=1)
        self.gate, self.lock, self.decoding, self.most = threading.Event(), threading.Lock(), 0, 0
        self.decoded = []

    def translate_ids(self, sources, **options):
        with self.lock:
            self.decoding += 1
            self.most = max(self.most, self.decoding)
        try:
            assert self.gate.wait(timeout=120)
            self.decoded.extend(sources)
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
    url, app, _ = server(translator, window=0, queue_size=1)
    with ThreadPoolExecutor(2) as pool:
        decoding = pool.submit(post, url, {"text": ["3 1"]})
        translator.until_decoding(1)
        waiting = pool.submit(post, url, {"text": ["4 5 6"]})
        deadline = time.monotonic() + 60
        while len(app[BATCHER].waiting) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status, headers, answer = call(url, data=json.dumps({"text": ["7"]}).encode())  # the gate still closed
        assert status == 503 and "busy" in answer["error"]
        assert headers["Retry-After"] == "1"
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


@pytest.mark.slow
def test_client_errors_are_4xx_with_a_json_body(server, caplog):
    url, _, _ = server()
    body = json.dumps({"text": ["3 1"]}).encode()
    status, _, answer = call(url, data=b"[" * 100_000 + b"]" * 100_000)  # json's RecursionError
    assert status == 400 and answer["error"] == "the body is not JSON (nested too deeply)", answer
    with caplog.at_level(logging.WARNING, logger="aiohttp.server"):
        status, _, answer = call(url, data=b"not gzip", headers={"Content-Encoding": "gzip"})
        assert status == 400 and answer["error"].startswith("the body is not valid gzip (Error -3"), answer
        time.sleep(0.5)
    assert not [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"]
    assert "Traceback" not in caplog.text
    assert call(url, data=gzip.compress(body), headers={"Content-Encoding": "gzip"})[0] == 200
    status, _, answer = call(url, data=body, headers={"Content-Encoding": "br"})
    assert (status, answer) == (415, {"error": "Content-Encoding 'br' is not supported (supported: gzip, deflate, "
                                               "identity)"})
    status, _, answer = call(url, "/nothing", method="GET")
    assert status == 404 and answer["error"].startswith("no such path: /nothing"), answer
    status, headers, answer = call(url, "/translate", method="GET")
    assert status == 405 and answer["error"] == "method GET is not allowed for /translate (allowed: POST)", answer
    assert headers["Allow"] == "POST"
    assert post(url, {"text": ["3 1"]})[0] == 200


@pytest.mark.slow
def test_a_deflate_body_cut_short_is_answered_at_once(server):
    """The body sent after the headers, as clients send it: aiohttp's own decoder left the request
    waiting for the rest of the stream until its deadline (504)."""
    url, _, _ = server(timeout=20)
    body = zlib.compress(json.dumps({"text": ["3 1"]}).encode())[:-4]
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as client:
        client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Encoding: deflate\r\n"
                       b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        time.sleep(0.3)
        client.sendall(body)
        answer = client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.endswith(b'{"error": "the body\'s deflate stream is cut short"}')


def test_bodies_are_decoded_as_their_content_encoding_says():
    from fairseq_memattn.deploy.serve import RequestError, decoded

    body = json.dumps({"text": ["3 1"] * 50}).encode()
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for encoding, sent in [("", body), ("identity", body), ("gzip", gzip.compress(body)),
                           ("x-gzip", gzip.compress(body[:10]) + gzip.compress(body[10:])),  # two members
                           ("deflate", zlib.compress(body)),
                           ("deflate", raw_deflate.compress(body) + raw_deflate.flush()),
                           ("deflate, gzip", gzip.compress(zlib.compress(body))), ("GZIP , identity", gzip.compress(body))]:
        assert decoded(sent, encoding, 10_000) == body, encoding

    def refused(sent, encoding, limit=10_000):
        with pytest.raises(RequestError) as error:
            decoded(sent, encoding, limit)
        return error.value.status, str(error.value)

    assert refused(gzip.compress(body)[:-8], "gzip") == (400, "the body's gzip stream is cut short")
    assert refused(zlib.compress(body)[:-4], "deflate") == (400, "the body's deflate stream is cut short")
    assert refused(gzip.compress(body) + b"xyz", "gzip")[0] == 400
    assert refused(zlib.compress(body) + b"xyz", "deflate") == (400, "the body has 3 bytes after its deflate stream")
    assert refused(gzip.compress(b" " * 100_000), "gzip", limit=1000) == (
        413, "the body, decoded from gzip, is larger than the server's 1000 bytes")
    assert refused(body, "zstd") == (415, "Content-Encoding 'zstd' is not supported (supported: gzip, deflate, "
                                          "identity)")


def test_aiohttp_logs_a_request_it_cannot_read_in_one_line():
    from aiohttp.http_exceptions import ContentEncodingError

    from fairseq_memattn.deploy.serve import ClientErrorsInOneLine

    def logged(error):
        try:
            raise error
        except Exception:
            record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                       ("127.0.0.1",), sys.exc_info())
        assert ClientErrorsInOneLine().filter(record)
        return record

    try:  # as aiohttp raises it: the payload's error, caused by the decoder's
        raise ContentEncodingError("Can not decode content-encoding: brotli (br)")
    except ContentEncodingError as cause:
        wrapped = RuntimeError("payload")
        wrapped.__cause__ = cause
    record = logged(wrapped)
    assert (record.levelname, record.exc_info, record.getMessage()) == (
        "WARNING", None, "Error handling request from 127.0.0.1: the client's request: Can not decode "
                         "content-encoding: brotli (br)")
    record = logged(ValueError("the server's own"))  # not the client's: as aiohttp logs it
    assert record.levelname == "ERROR" and record.exc_info[0] is ValueError


@pytest.mark.slow
def test_a_lone_surrogate_gets_400_with_a_sentencepiece_model(server, tmp_path):
    import sentencepiece

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(str((i * 3 + j) % 10) for j in range(8)) + "\n" for i in range(50)))
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=14,
                                             hard_vocab_limit=False, minloglevel=2)
    url, _, _ = server(sentencepiece_model=str(tmp_path / "spm.model"))
    status, answer = post(url, None, raw=b'{"text": ["3 1", "3 \\ud800 1"]}')
    assert (status, answer) == (400, {"error": "text[1]: not Unicode text: a lone surrogate '\\ud800' at character 2"})
    assert post(url, {"text": ["3 1"]})[0] == 200


@pytest.mark.slow
def test_the_server_answers_while_a_request_is_encoded(server, monkeypatch):
    gate, encoding = threading.Event(), threading.Event()
    source = TextCodec.source

    def gated(codec, line):
        encoding.set()
        assert gate.wait(timeout=120)
        return source(codec, line)

    monkeypatch.setattr(TextCodec, "source", gated)
    url, _, _ = server()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, url, {"text": ["3 1"]})
        try:
            assert encoding.wait(timeout=30)
            with urllib.request.urlopen(f"{url}/health", timeout=10) as response:  # not behind the encoding
                assert json.load(response) == {"status": "ok"}
        finally:
            gate.set()
        assert pending.result()[0] == 200


def raw_request(url, data: bytes) -> socket.socket:
    """A socket to the server that has sent ``data``."""
    host, port = url.rsplit("/", 1)[1].split(":")
    client = socket.create_connection((host, int(port)), timeout=30)
    client.sendall(data)
    return client


def translate_request(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data))


@pytest.mark.slow
def test_a_client_gone_mid_body_is_not_logged_as_a_decoding_failure(server, caplog):
    url, _, _ = server(window=0)
    with caplog.at_level(logging.DEBUG, logger="fairseq_memattn.deploy.serve"):
        raw_request(url, translate_request({"text": ["3 1 4 1 5"]})[:-10]).close()
        time.sleep(0.5)
        assert post(url, {"text": ["3 1"]})[0] == 200
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING], caplog.text


@pytest.mark.slow
def test_a_disconnected_clients_queued_work_is_dropped(server, trained):
    translator = Gated(str(trained("attention")[1]))
    url, app, _ = server(translator, window=0)
    abandoned = [" ".join(str((i + j) % 10) for j in range(30)) for i in range(40)]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, url, {"text": ["3 1"]})
        translator.until_decoding(1)
        client = raw_request(url, translate_request({"text": abandoned, "beam": 8}))
        wait_for(lambda: len(app[BATCHER].waiting) == 1)
        client.close()  # its request waits behind the first: never decoded
        wait_for(lambda: not app[BATCHER].waiting)
        following = pool.submit(post, url, {"text": ["4 5 6"]})
        wait_for(lambda: len(app[BATCHER].waiting) == 1)
        translator.gate.set()
        assert first.result()[0] == 200 and following.result()[0] == 200
    decoded = {" ".join(translator.src_dict.symbols[i] for i in source[:-1]) for source in translator.decoded}
    assert decoded == {"3 1", "4 5 6"}


def wait_for(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.slow
def test_a_request_past_its_deadline_gets_504(server, trained):
    translator = Gated(str(trained("attention")[1]))
    url, app, _ = server(translator, window=0, timeout=0.5)
    status, answer = post(url, {"text": ["3 1"]})
    assert status == 504 and answer == {"error": "not answered within the server's --timeout-s 0.5 s"}
    translator.gate.set()
    assert post(url, {"text": ["3 1"]})[0] == 200


@pytest.mark.slow
def test_idle_connections_and_partial_headers_are_closed(server):
    url, _, _ = server(idle_timeout=0.5)
    for sent in (b"", b"POST /translate HTTP/1.1\r\nHost: te"):
        client = raw_request(url, sent)
        client.settimeout(10)  # a connection left open ends the test in socket.timeout
        assert client.recv(1024) == b""  # closed by the server
        client.close()
