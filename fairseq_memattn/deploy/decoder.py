"""One batch's runs of the exported decoder step: its memory (one row per source), its state
(one row per hypothesis) and, for the Transformer, its self-attention cache, kept in ONNX
Runtime's memory and reordered as the beam search asks."""

from typing import Dict, Optional

import numpy as np

from .cache import SelfAttentionCache
from .config import short_memory_name


def empty(shape: list, width: int) -> np.ndarray:
    """A memory input of no sources: the graph input's ``shape``, its named sizes ``width`` but the first."""
    return np.zeros([0, *(size if isinstance(size, int) else width for size in shape[1:])], np.float32)


def initial_state(config: dict, encoded: Dict[str, np.ndarray], sources: int) -> Dict[str, np.ndarray]:
    """The decoder's state before the first step: one row per source, as the first step runs."""
    state = {}
    for entry in config["decoder_state"]:
        if "from" in entry:  # from the encoder
            state[entry["name"]] = np.ascontiguousarray(encoded[entry["from"]])
        else:
            state[entry["name"]] = np.zeros((sources, *entry["zeros"]), np.float32)
    return state


class DecoderRun:
    """The decoder step over one batch's hypotheses (``hypotheses`` rows, up to ``steps`` positions).
    The first step runs one row per source (BeamSearch.run); the next step's reorder then reads
    each hypothesis's state and cache from its source's row. ``encoded``: the encoder's outputs for
    the sources that keep K memory rows; ``short``: for those that keep |S| rows (config.json's
    short_source_rows), which come first in the batch. Either may be None where the batch has none."""

    def __init__(self, session, ort, config: dict, encoded: Optional[Dict[str, np.ndarray]], hypotheses: int,
                 steps: int, short: Optional[Dict[str, np.ndarray]] = None):
        self.session, self.outputs = session, [o.name for o in session.get_outputs()]
        self.ort_value = ort.OrtValue.ortvalue_from_numpy
        # One binding for the batch: the memory and the cache tables stay bound from step to step.
        self.binding = session.io_binding()
        self.bound = {}  # the arrays bound to step inputs, by name
        names = config["memory_outputs"]
        inputs = {arg.name: arg.shape for arg in session.get_inputs()}
        # each set of sources' memory rows: the graph's inputs by name; an absent set is empty
        self.memory_rows = {name: encoded[name] if encoded is not None else empty(inputs[name], config["memory_k"])
                            for name in names}
        self.short_rows = {}
        if "short_source_rows" in config:  # graph input: encoder output
            for name, output in {**{short_memory_name(n): n for n in names}, "alpha": "alpha"}.items():
                self.short_rows[name] = short[output] if short is not None else empty(inputs[name], 1)
        self.bind_memory()
        sources = sum(len(next(iter(rows.values()))) for rows in (self.memory_rows, self.short_rows) if rows)
        self.hypotheses = hypotheses
        self.state = {name: self.ort_value(value)
                      for name, value in initial_state(config, encoded, sources).items()}
        layers = config.get("self_attention_cache")  # the Transformer's; the LSTM's state is h and c
        self.cache = SelfAttentionCache(layers, hypotheses, steps, self.ort_value) if layers else None
        if self.cache is not None:
            self.bind(self.cache.inputs)
        # after the first step or sentences leaving the batch: the row of the previous step's state
        # (and cache) each hypothesis row stands for, applied by the next step's reorder
        self.kept_rows = None

    def bind_memory(self) -> None:
        """Both sets' memory rows as OrtValues (kept: they stand for the arrays), bound to the step's inputs."""
        self.memory = {name: self.ort_value(value)
                       for name, value in (*self.memory_rows.items(), *self.short_rows.items())}
        self.bind(self.memory)

    def keep(self, sources: np.ndarray, rows: np.ndarray) -> None:
        """Only these sources (memory rows, the short sources' first) and hypotheses (state rows)
        go on; the state is reordered once, by the next step."""
        self.kept_rows = rows if self.kept_rows is None else self.kept_rows[rows]
        short_count = len(next(iter(self.short_rows.values()))) if self.short_rows else 0
        kept_short = sources < short_count
        self.short_rows = {name: value[sources[kept_short]] for name, value in self.short_rows.items()}
        self.memory_rows = {name: value[sources[~kept_short] - short_count] for name, value in self.memory_rows.items()}
        self.bind_memory()

    def bind(self, values: dict) -> None:
        for name, value in values.items():
            self.binding.bind_ortvalue_input(name, value)

    def step(self, tokens: np.ndarray, step: int, reorder: np.ndarray, search: dict):
        """(candidate scores and indices, sources x candidates; read weights N x K) for one target
        position; row j continues row reorder[j] of the previous step, ``search`` holds the inputs
        of export/search.py. The state and the memory stay in ONNX Runtime's memory (OrtValues
        bound to the graph's inputs and outputs), and the new position's keys and values are
        written straight into the cache."""
        if self.kept_rows is not None:
            reorder, self.kept_rows = self.kept_rows[reorder], None
        arrays = {"prev_tokens": np.ascontiguousarray(tokens), "step": np.array([step], np.int64), **search}
        cache, binding = self.cache, self.binding
        if cache is None:  # the state is reordered by the graph
            arrays["reorder"] = reorder
        else:
            cache.reorder(reorder)
            arrays["history"] = cache.history(step)
        for name, value in arrays.items():
            if self.bound.get(name) is not value:  # the same array as the last step's stays bound
                binding.bind_cpu_input(name, value)
                self.bound[name] = value
        self.bind(self.state)
        for name in self.outputs:
            if cache is None or name not in cache.tables:
                binding.bind_output(name, "cpu")
        if cache is not None:
            cache.bind_new_position(binding, step)
        self.session.run_with_iobinding(binding)
        outputs = dict(zip(self.outputs, binding.get_outputs()))
        self.state = {name: outputs["new_" + name] for name in self.state}
        if not step:  # each hypothesis continues its source's row of the first step
            self.kept_rows = np.arange(self.hypotheses) // (self.hypotheses // len(tokens))
        return (outputs["candidate_scores"].numpy(), outputs["candidate_indices"].numpy(),
                outputs["read_weights"].numpy())
