"""The server's dynamic batching: requests queued as they arrive and decoded together on worker
threads, so that the event loop keeps answering while ONNX Runtime decodes."""

import asyncio
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional


class Busy(Exception):
    """More requests waiting than the queue holds."""


class Job:
    """One request's sources and options, and the future its handler awaits. ``abandoned``: its
    client went away or its deadline passed (set on the event loop, read by the workers)."""

    def __init__(self, sources: List[List[int]], beam: int, alignment: bool, future: asyncio.Future):
        self.sources, self.beam, self.alignment, self.future = sources, beam, alignment, future
        self.tokens = sum(len(s) for s in sources)
        self.abandoned = False


class Batcher:
    """Requests queued as they arrive and decoded together on ``workers`` threads: when a worker is
    free, those waiting and those arriving within ``window`` seconds of the first, up to
    ``max_tokens`` source tokens, make a batch, split by source tokens among the free workers;
    requests with the same beam and alignment share ``translate_ids`` calls. A request whose
    handler is cancelled (its client disconnected, its deadline passed) leaves the queue, and is
    left out of its batch if that has not started decoding."""

    def __init__(self, translator, options: dict, window: float, max_tokens: int, queue_size: int,
                 workers: int = 1):
        self.translator, self.options = translator, options
        self.window, self.max_tokens = window, max_tokens
        self.waiting: deque = deque()  # Jobs, oldest first
        self.queue_size = queue_size
        self.arrived = asyncio.Event()
        self.workers = self.free = workers
        self.freed = asyncio.Event()
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="translate")
        self.task: Optional[asyncio.Task] = None  # run()
        self.tasks: set = set()  # dispatch()es under way

    async def translate(self, sources: List[List[int]], beam: int, alignment: bool) -> List[List[dict]]:
        """Each source's hypotheses; Busy at once where the queue is full."""
        if len(self.waiting) >= self.queue_size:
            raise Busy(f"the server is busy ({self.queue_size} requests waiting): retry later")
        job = Job(sources, beam, alignment, asyncio.get_running_loop().create_future())
        self.waiting.append(job)
        self.arrived.set()
        try:
            return await job.future
        finally:
            if job.future.cancelled():  # this request's handler was cancelled: nobody waits for it
                job.abandoned = True
                if job in self.waiting:
                    self.waiting.remove(job)

    async def until_waiting(self, deadline: Optional[float] = None) -> bool:
        """Whether a job waits, waiting for one until ``deadline`` (the loop's time; None: forever)."""
        loop = asyncio.get_running_loop()
        while not self.waiting:
            self.arrived.clear()
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                return False
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout)
            except asyncio.TimeoutError:
                return False
        return True

    async def collect(self) -> List[Job]:
        """The next batch: the first waiting job, then those waiting or arriving within the window."""
        await self.until_waiting()
        jobs = [self.waiting.popleft()]
        deadline = asyncio.get_running_loop().time() + self.window
        while sum(job.tokens for job in jobs) < self.max_tokens and await self.until_waiting(deadline):
            jobs.append(self.waiting.popleft())
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

    def decode(self, jobs: List[Job]) -> List[Optional[List[List[dict]]]]:
        """Each job's hypotheses (None for one abandoned before its turn), one translate_ids call
        per (beam, alignment) among the jobs."""
        results: List[Optional[List[List[dict]]]] = [None] * len(jobs)
        for key in dict.fromkeys((job.beam, job.alignment) for job in jobs):
            group = [i for i, job in enumerate(jobs) if (job.beam, job.alignment) == key and not job.abandoned]
            if not group:
                continue
            sources = [source for i in group for source in jobs[i].sources]
            hypotheses = self.translator.translate_ids(sources, max_tokens=self.max_tokens, beam=key[0],
                                                       alignment=key[1], **self.options)
            for i in group:
                count = len(jobs[i].sources)
                results[i], hypotheses = hypotheses[:count], hypotheses[count:]
        return results

    async def start(self, app) -> None:
        self.task = asyncio.create_task(self.run())

    async def stop(self, app) -> None:
        for task in (self.task, *self.tasks):
            task.cancel()
        self.executor.shutdown(wait=True)
