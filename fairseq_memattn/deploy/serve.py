"""The HTTP translation server over ``Translator`` (aiohttp); ``fairseq-memattn-serve``
(``fairseq_memattn.cli.serve``) runs it.

    POST /translate  {"text": ["sentence", ...], "beam": 5, "nbest": 1, "alignment": false}
                     -> {"results": [[{"text", "pieces", "score", "positional_scores"[, "alignment"]}, ...], ...]}
    GET  /health     -> {"status": "ok"}
    GET  /info       -> the model's config.json and the server's limits

Requests waiting, and those arriving within --batch-window-ms of the first, are decoded together
(up to --max-tokens source tokens per batch) on worker threads, so the event loop keeps answering.
With --workers W, up to W batches decode at once (ONNX Runtime runs a session's calls in parallel;
on C cores, W x --threads = C): a batch is split among the workers that are free. Waiting requests
are bounded by --queue-size: beyond it a request gets 503 at once.
Malformed requests get 400, sources longer than the model or --max-tokens 413; a batch whose
decoding fails gets 500 (the error logged with its traceback) and the server goes on.
"""

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

from aiohttp import web

from .translator import MAX_TOKENS, SourceError, SourceTooLong

REQUEST_FIELDS = {"text", "beam", "nbest", "alignment"}
BATCHER = web.AppKey("batcher", "Batcher")
LOGGER = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the server refuses; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Job:
    """One request's sources and options, and the future its handler awaits."""

    def __init__(self, sources: List[List[int]], beam: int, alignment: bool, future: asyncio.Future):
        self.sources, self.beam, self.alignment, self.future = sources, beam, alignment, future
        self.tokens = sum(len(s) for s in sources)


class Batcher:
    """Requests queued as they arrive and decoded together on ``workers`` threads: when a worker is
    free, those waiting and those arriving within ``window`` seconds of the first, up to
    ``max_tokens`` source tokens, make a batch, split by source tokens among the free workers;
    requests with the same beam and alignment share ``translate_ids`` calls."""

    def __init__(self, translator, options: dict, window: float, max_tokens: int, queue_size: int,
                 workers: int = 1):
        self.translator, self.options = translator, options
        self.window, self.max_tokens = window, max_tokens
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=queue_size)
        self.workers = self.free = workers
        self.freed = asyncio.Event()
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="translate")
        self.task: Optional[asyncio.Task] = None  # run()
        self.tasks: set = set()  # dispatch()es under way

    async def translate(self, sources: List[List[int]], beam: int, alignment: bool) -> List[List[dict]]:
        job = Job(sources, beam, alignment, asyncio.get_running_loop().create_future())
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise RequestError(503, f"the server is busy ({self.queue.maxsize} requests waiting): retry later") \
                from None
        return await job.future

    async def collect(self) -> List[Job]:
        """The next batch: the first waiting job, then those waiting or arriving within the window."""
        loop = asyncio.get_running_loop()
        jobs = [await self.queue.get()]
        deadline = loop.time() + self.window
        while sum(job.tokens for job in jobs) < self.max_tokens:
            if not self.queue.empty():  # those that came while the workers were busy
                jobs.append(self.queue.get_nowait())
                continue
            try:
                jobs.append(await asyncio.wait_for(self.queue.get(), max(0.0, deadline - loop.time())))
            except asyncio.TimeoutError:
                break
        return jobs

    async def run(self) -> None:
        while True:
            while not self.free:
                self.freed.clear()
                await self.freed.wait()
            jobs = await self.collect()
            parts = [[] for _ in range(min(self.free, len(jobs)))]
            for job in sorted(jobs, key=lambda job: -job.tokens):  # the largest first, to the lightest part
                min(parts, key=lambda part: sum(j.tokens for j in part)).append(job)
            for part in parts:
                self.free -= 1
                task = asyncio.create_task(self.dispatch(part))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def dispatch(self, jobs: List[Job]) -> None:
        """Decode ``jobs`` on a worker and answer each; the worker is free again after."""
        try:
            results = await asyncio.get_running_loop().run_in_executor(self.executor, self.decode, jobs)
        except Exception as error:  # reported to each request of the batch; the server keeps serving
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
        else:
            for job, result in zip(jobs, results):
                if not job.future.done():  # a client that went away cancelled its future
                    job.future.set_result(result)
        finally:
            self.free += 1
            self.freed.set()

    def decode(self, jobs: List[Job]) -> List[List[List[dict]]]:
        """Each job's hypotheses, one translate_ids call per (beam, alignment) among the jobs."""
        results: List[Optional[List[List[dict]]]] = [None] * len(jobs)
        for key in dict.fromkeys((job.beam, job.alignment) for job in jobs):
            group = [i for i, job in enumerate(jobs) if (job.beam, job.alignment) == key]
            sources = [source for i in group for source in jobs[i].sources]
            hypotheses = self.translator.translate_ids(sources, max_tokens=self.max_tokens, beam=key[0],
                                                       alignment=key[1], **self.options)
            for i in group:
                count = len(jobs[i].sources)
                results[i], hypotheses = hypotheses[:count], hypotheses[count:]
        return results

    async def start(self, app: web.Application) -> None:
        self.task = asyncio.create_task(self.run())

    async def stop(self, app: web.Application) -> None:
        for task in (self.task, *self.tasks):
            task.cancel()
        self.executor.shutdown(wait=True)


def field(body: dict, name: str, kind, default, low: int = None, high: int = None):
    """body[name], checked for its JSON type and range."""
    value = body.get(name, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(400, f"{name}: expected {'a boolean' if kind is bool else 'an integer'}, got {value!r}")
    if low is not None and not low <= value <= high:
        raise RequestError(400, f"{name}: {value} is outside {low}..{high}")
    return value


class Server:
    """The HTTP handlers: requests checked and encoded here, decoded by the Batcher."""

    def __init__(self, translator, codec, options: dict, beam: int, max_tokens: int, max_beam: int,
                 max_sentences: int, batcher: Batcher):
        self.translator, self.codec, self.options, self.beam = translator, codec, options, beam
        self.max_tokens, self.max_beam, self.max_sentences = max_tokens, max_beam, max_sentences
        self.batcher = batcher

    def parse(self, body) -> tuple:
        """(source ids, beam, nbest, alignment) of a /translate request body."""
        if not isinstance(body, dict):
            raise RequestError(400, "expected a JSON object with a field 'text'")
        unknown = sorted(set(body) - REQUEST_FIELDS)
        if unknown:
            raise RequestError(400, f"unknown field(s): {', '.join(unknown)} (known: {', '.join(sorted(REQUEST_FIELDS))})")
        text = body.get("text")
        if not isinstance(text, list) or not all(isinstance(line, str) for line in text):
            raise RequestError(400, "text: expected a list of strings")
        if len(text) > self.max_sentences:
            raise RequestError(413, f"text: {len(text)} sentences, more than the server's {self.max_sentences} "
                                    f"per request")
        beam = field(body, "beam", int, self.beam, 1, self.max_beam)
        nbest = field(body, "nbest", int, 1, 1, beam)
        alignment = field(body, "alignment", bool, False)
        sources = []
        for i, line in enumerate(text):
            _, ids = self.codec.source(line)
            try:
                self.translator.check_source(ids, max_tokens=self.max_tokens, max_len_a=self.options["max_len_a"],
                                             max_len_b=self.options["max_len_b"], min_len=self.options["min_len"])
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
            try:
                body = await request.json()
            except ValueError as error:
                raise RequestError(400, f"the body is not JSON ({error})") from None
            except web.HTTPRequestEntityTooLarge:
                raise RequestError(413, f"the body is larger than the server's {request.client_max_size} bytes") \
                    from None
            sources, beam, nbest, alignment = self.parse(body)
            results = await self.batcher.translate(sources, beam, alignment) if sources else []
        except RequestError as error:
            return web.json_response({"error": str(error)}, status=error.status)
        except Exception as error:  # the decoding failed: this request's batch is answered, the server goes on
            LOGGER.exception("decoding failed")
            return web.json_response({"error": f"decoding failed: {error}"}, status=500)
        return web.json_response({"results": [[self.hypothesis_json(h, alignment) for h in hypotheses[:nbest]]
                                              for hypotheses in results]})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"config": self.translator.config, "beam": self.beam, "max_tokens": self.max_tokens,
                                  "max_beam": self.max_beam, "max_sentences": self.max_sentences,
                                  "queue_size": self.batcher.queue.maxsize, "workers": self.batcher.workers,
                                  "search": self.options})


def make_app(translator, codec, options: dict, beam: int = 5, window: float = 0.005, max_tokens: int = MAX_TOKENS,
             queue_size: int = 64, max_beam: int = 16, max_sentences: int = 256, workers: int = 1) -> web.Application:
    """The server's application (``options``: Translator.generate's, beam aside; ``beam``: a request's
    default); its Batcher starts and stops with it."""
    batcher = Batcher(translator, options, window, max_tokens, queue_size, workers)
    server = Server(translator, codec, options, beam, max_tokens, max_beam, max_sentences, batcher)
    app = web.Application()
    app.add_routes([web.post("/translate", server.translate), web.get("/health", server.health),
                    web.get("/info", server.info)])
    app.on_startup.append(batcher.start)
    app.on_cleanup.append(batcher.stop)
    app[BATCHER] = batcher
    return app


class BackgroundServer:
    """An application served on 127.0.0.1 (an ephemeral port) by an event loop in a thread, for tests
    and benchmarks: ``url``, and ``close()``."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0):
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
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


if __name__ == "__main__":
    from ..cli.serve import main

    main()
