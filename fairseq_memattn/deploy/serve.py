"""The HTTP translation server over ``Translator`` (aiohttp); ``fairseq-memattn-serve``
(``fairseq_memattn.cli.serve``) runs it. What it answers: API below (also the command's help).
"""

import asyncio
import json
import logging
import threading
import zlib

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .batcher import Batcher, Busy
from .batching import MAX_TOKENS
from .exceptions import SourceError, SourceTooLong


# Kept in a constant rather than the docstring, so that the command's help holds under python -OO.
API = """\
    POST /translate  {"text": ["sentence", ...], "beam": 5, "nbest": 1, "alignment": false}
                     -> {"results": [[{"text", "pieces", "score", "positional_scores"[, "alignment"]}, ...], ...]}
                     scores in natural log (fairseq-generate prints base 2), "score" normalised by
                     length as fairseq's is
    GET  /health     -> {"status": "ok"}
    GET  /info       -> the model's config.json and the server's limits

Requests waiting, and those arriving within --batch-window-ms of the first, are decoded together
(up to --max-tokens source tokens per batch) on worker threads (batcher.py), so the event loop keeps
answering. With --workers W, up to W batches decode at once (ONNX Runtime runs a session's calls in
parallel; on C cores, W x --threads = C): a batch is split among the workers that are free. Waiting
requests are bounded by --queue-size: beyond it a request gets 503 at once, with Retry-After.
Every error has a JSON body {"error": "..."}: a malformed request 400, a source longer than the
model or --max-tokens 413, an unknown path 404, another method 405, a request not answered within
--timeout-s 504 (its work dropped if not started), a batch whose decoding fails 500 (the error
logged with its traceback; the server goes on), a Content-Encoding other than gzip, deflate or
identity 415. A client that disconnects has its queued work dropped; a connection idle, or sending
partial headers, for --idle-timeout-s is closed. A request aiohttp cannot parse (a malformed
request line or header) gets aiohttp's own 400 in plain text, and at most one warning line in the log.
"""

REQUEST_FIELDS = {"text", "beam", "nbest", "alignment"}
BATCHER = web.AppKey("batcher", Batcher)
LOGGER = logging.getLogger(__name__)
RETRY_AFTER_S = 1  # a full queue drains within about a batch's decoding
TIMEOUT_S = 60.0  # a request's deadline: well above a batch of long sentences on one core
IDLE_TIMEOUT_S = 15.0  # a connection without a complete request for this long is closed


class RequestError(ValueError):
    """A request the server refuses; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str, headers: dict = None):
        super().__init__(message)
        self.status, self.headers = status, headers

    def response(self) -> web.Response:
        return web.json_response({"error": str(self)}, status=self.status, headers=self.headers)


def cut(text: str) -> str:
    """A request's text in an error message, cut short."""
    return text if len(text) <= 40 else text[:37] + "..."


def shown(value) -> str:
    """A request's value in an error message: its JSON, cut short."""
    return cut(json.dumps(value))


def field(body: dict, name: str, kind, default, low: int = None, high: int = None):
    """body[name], checked for its JSON type and range."""
    value = body.get(name, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(400, f"{name}: expected {'a boolean' if kind is bool else 'an integer'}, got {shown(value)}")
    if low is not None and not low <= value <= high:
        raise RequestError(400, f"{name}: {shown(value)} is outside {low}..{high}")
    return value


def protocol_error(error: BaseException):
    """The message, on one line, of the aiohttp error behind ``error`` for a request it cannot
    parse or decode (a malformed request line, a body whose Content-Encoding is broken or
    unknown); None if there is none."""
    while error is not None and not isinstance(error, HttpProcessingError):
        error = error.__cause__ or error.__context__
    return " ".join(error.message.split()) if error is not None else None


# zlib's window bits for each Content-Encoding the server decodes (identity aside)
CONTENT_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoded(body: bytes, content_encoding: str, limit: int) -> bytes:
    """The body before its Content-Encoding (codings applied in the order listed), at most ``limit``
    bytes; RequestError (400, 413, 415) where it cannot be. The server decodes bodies itself:
    aiohttp's decoder leaves a request waiting until its deadline for a deflate stream cut short."""
    codings = [coding.strip().lower() for coding in content_encoding.split(",")]
    for coding in reversed([c for c in codings if c not in ("", "identity")]):
        if coding not in CONTENT_CODINGS:
            raise RequestError(415, f"Content-Encoding {coding!r} is not supported (supported: gzip, deflate, "
                                    f"identity)")
        body = inflate(body, coding, limit)
    return body


def inflate(body: bytes, coding: str, limit: int) -> bytes:
    """One coding undone: gzip (one member after another), or deflate (zlib's format, or raw
    deflate without its header, which some clients send as deflate)."""
    wbits = CONTENT_CODINGS[coding]
    if coding == "deflate" and body and body[0] & 0x0F != 8:  # no zlib header: raw deflate
        wbits = -zlib.MAX_WBITS
    out = b""
    while True:
        stream = zlib.decompressobj(wbits)
        try:
            out += stream.decompress(body, limit + 1 - len(out))  # at least 1: 0 would mean no limit
        except zlib.error as error:
            raise RequestError(400, f"the body is not valid {coding} ({error})") from None
        if len(out) > limit:
            raise RequestError(413, f"the body, decoded from {coding}, is larger than the server's {limit} bytes")
        if not stream.eof:
            raise RequestError(400, f"the body's {coding} stream is cut short")
        body = stream.unused_data
        if not body or wbits != CONTENT_CODINGS["gzip"]:
            break
    if body:
        raise RequestError(400, f"the body has {len(body)} bytes after its {coding} stream")
    return out


async def read_json(request: web.Request):
    """The request's body as JSON; RequestError (400, 413, 415) where it is not."""
    try:
        raw = await request.read()  # as sent: runner_settings turns aiohttp's decoding off
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(413, f"the body is larger than the server's {request.client_max_size} bytes") from None
    except ConnectionError:  # the client went away mid-body: an answer nobody reads, and no log
        raise RequestError(400, "the connection closed before the body's end") from None
    except Exception as error:  # aiohttp's errors of a body it cannot read
        raise RequestError(400, f"the body cannot be read ({protocol_error(error) or error})") from None
    raw = decoded(raw, request.headers.get("Content-Encoding", ""), request.client_max_size)
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise RequestError(400, f"the body is not JSON ({reason})") from None


class Server:
    """The HTTP handlers: requests checked and encoded here (off the event loop), decoded by the Batcher."""

    def __init__(self, translator, codec, options: dict, beam: int, max_tokens: int, max_beam: int,
                 max_sentences: int, batcher: Batcher, timeout: float = TIMEOUT_S):
        self.translator, self.codec, self.options, self.beam = translator, codec, options, beam
        self.max_tokens, self.max_beam, self.max_sentences = max_tokens, max_beam, max_sentences
        self.batcher, self.timeout = batcher, timeout

    def parse(self, body) -> tuple:
        """(source ids, beam, nbest, alignment) of a /translate request body."""
        if not isinstance(body, dict):
            raise RequestError(400, "expected a JSON object with a field 'text'")
        unknown = sorted(set(body) - REQUEST_FIELDS)
        if unknown:
            raise RequestError(400, f"unknown field(s): {', '.join(map(cut, unknown))} "
                                    f"(known: {', '.join(sorted(REQUEST_FIELDS))})")
        if "text" not in body:
            raise RequestError(400, "text: missing; expected a list of strings")
        text = body["text"]
        if not isinstance(text, list):
            raise RequestError(400, f"text: expected a list of strings, got {shown(text)}")
        for i, line in enumerate(text):
            if not isinstance(line, str):
                raise RequestError(400, f"text[{i}]: expected a string, got {shown(line)}")
        if len(text) > self.max_sentences:
            raise RequestError(413, f"text: {len(text)} sentences, more than the server's {self.max_sentences} "
                                    f"per request")
        beam = field(body, "beam", int, self.beam, 1, self.max_beam)
        nbest = field(body, "nbest", int, 1, 1, beam)
        alignment = field(body, "alignment", bool, False)
        limits = {key: self.options[key] for key in ("max_len_a", "max_len_b", "min_len")}
        sources = []
        for i, line in enumerate(text):
            try:
                ids = self.codec.source(line)[1]
                self.translator.check_source(ids, max_tokens=self.max_tokens, **limits)
            except SourceError as error:
                raise RequestError(413 if isinstance(error, SourceTooLong) else 400, f"text[{i}]: {error}") from None
            sources.append(ids)
        return sources, beam, nbest, alignment

    def hypothesis_json(self, hypothesis: dict, alignment: bool) -> dict:
        pieces, text = self.codec.target(hypothesis["tokens"])
        result = {"text": text, "pieces": pieces, "score": float(hypothesis["score"]),
                  "positional_scores": [float(s) for s in hypothesis["positional_scores"]]}
        if alignment:
            result["alignment"] = [list(pair) for pair in hypothesis["alignment"]]
        return result

    async def translate(self, request: web.Request) -> web.Response:
        try:
            return await asyncio.wait_for(self.answer(request), self.timeout)
        except RequestError as error:
            return error.response()
        except asyncio.TimeoutError:  # answer() was cancelled: its job left the queue
            return web.json_response({"error": f"not answered within the server's --timeout-s {self.timeout:g} s"},
                                     status=504)

    async def answer(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        # On a thread: sentencepiece releases the GIL, so a long text does not hold up other requests.
        sources, beam, nbest, alignment = await asyncio.get_running_loop().run_in_executor(None, self.parse, body)
        results = await self.decode(sources, beam, alignment) if sources else []
        return web.json_response({"results": [[self.hypothesis_json(h, alignment) for h in hypotheses[:nbest]]
                                              for hypotheses in results]})

    async def decode(self, sources, beam: int, alignment: bool):
        try:
            return await self.batcher.translate(sources, beam, alignment)
        except Busy as error:
            raise RequestError(503, str(error), {"Retry-After": str(RETRY_AFTER_S)}) from None
        except Exception as error:  # the decoding failed: this request's batch is answered, the server goes on
            LOGGER.exception("decoding failed")
            raise RequestError(500, f"decoding failed: {error}") from None

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"config": self.translator.config, "beam": self.beam, "max_tokens": self.max_tokens,
                                  "max_beam": self.max_beam, "max_sentences": self.max_sentences,
                                  "queue_size": self.batcher.queue_size, "workers": self.batcher.workers,
                                  "timeout_s": self.timeout, "search": self.options})


@web.middleware
async def json_errors(request: web.Request, handler):
    """aiohttp's own error answers (404, 405, ...) with a JSON body, as the server's."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        headers = {k: v for k, v in error.headers.items() if k.lower() not in ("content-type", "content-length")}
        message = {404: f"no such path: {request.path} (the server answers POST /translate, GET /health, "
                        f"GET /info)",
                   405: f"method {request.method} is not allowed for {request.path} "
                        f"(allowed: {headers.get('Allow', '')})"}.get(error.status, error.reason)
        return web.json_response({"error": message}, status=error.status, headers=headers)


def make_app(translator, codec, options: dict, beam: int = 5, window: float = 0.005, max_tokens: int = MAX_TOKENS,
             queue_size: int = 64, max_beam: int = 16, max_sentences: int = 256, workers: int = 1,
             timeout: float = TIMEOUT_S) -> web.Application:
    """The server's application (``options``: Translator.generate's, beam aside; ``beam``: a request's
    default; ``timeout``: a request's deadline in seconds); its Batcher starts and stops with it.
    Serve it with ``runner_settings`` (``run`` and ``BackgroundServer`` do)."""
    batcher = Batcher(translator, options, window, max_tokens, queue_size, workers)
    server = Server(translator, codec, options, beam, max_tokens, max_beam, max_sentences, batcher, timeout)
    app = web.Application(middlewares=[json_errors])
    app.add_routes([web.post("/translate", server.translate), web.get("/health", server.health),
                    web.get("/info", server.info)])
    app.on_startup.append(batcher.start)
    app.on_cleanup.append(batcher.stop)
    app[BATCHER] = batcher
    return app


class ClientErrorsInOneLine(logging.Filter):
    """aiohttp logs a request it cannot parse or decode with a traceback, as it logs its own
    failures. The client's error is answered 400 already: its record becomes one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = protocol_error(record.exc_info[1]) if record.exc_info else None
        if message is not None:
            record.msg, record.args = "%s: the client's request: %s", (record.getMessage(), message)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def runner_settings(idle_timeout: float = IDLE_TIMEOUT_S, access_log: bool = False) -> dict:
    """aiohttp's server settings: a handler is cancelled when its client disconnects (so its queued
    work is dropped), a connection without a complete request for ``idle_timeout`` seconds is
    closed (aiohttp's keep-alive timeout runs from the connection's start, so partial headers
    count; it has no separate header timeout), bodies read as sent (``decoded`` undoes their
    Content-Encoding), one access line per request only with
    ``access_log``, and a request aiohttp cannot read logged in one line (ClientErrorsInOneLine)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ClientErrorsInOneLine) for f in server_log.filters):
        server_log.addFilter(ClientErrorsInOneLine())
    settings = {"handler_cancellation": True, "keepalive_timeout": idle_timeout, "auto_decompress": False}
    if not access_log:
        settings["access_log"] = None
    return settings


def run(app: web.Application, host: str, port: int, idle_timeout: float = IDLE_TIMEOUT_S,
        access_log: bool = False) -> None:
    """Serve ``app`` until interrupted; aiohttp's start-up lines on standard error."""
    web.run_app(app, host=host, port=port, print=lambda text: LOGGER.info(text.strip()),
                **runner_settings(idle_timeout, access_log))


class BackgroundServer:
    """An application served on 127.0.0.1 (an ephemeral port) by an event loop in a thread, for tests
    and benchmarks: ``url``, and ``close()``."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0,
                 idle_timeout: float = IDLE_TIMEOUT_S):
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app, **runner_settings(idle_timeout))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.runner.setup(), self.loop).result()
        site = web.TCPSite(self.runner, host, port)
        asyncio.run_coroutine_threadsafe(site.start(), self.loop).result()
        bound_host, bound_port = self.runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":  # the command line is in cli/; say where rather than do nothing
    import sys

    print("python -m fairseq_memattn.deploy.serve: error: run fairseq-memattn-serve (or python -m fairseq_memattn.cli.serve)",
          file=sys.stderr)
    sys.exit(2)
