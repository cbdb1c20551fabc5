"""Sources batched by length, as fairseq batches them, and padded on the side the exported encoder expects."""

from typing import List, Optional

import numpy as np

# Padded source tokens per batch. The decoder's state and self-attention cache grow with
# sources x beam x maximum length; 1024 tokens are a few dozen sentences of ordinary length.
MAX_TOKENS = 1024


def batches_by_tokens(lengths: List[int], max_tokens: Optional[int], batch_size: Optional[int]):
    """Index batches of sources sorted by length, each within max_tokens padded tokens and batch_size sources."""
    if max_tokens is not None and max_tokens < max(lengths, default=0):
        raise ValueError(f"invalid --max-tokens: {max_tokens} (the longest source has {max(lengths)} tokens)")
    batch, width = [], 0
    for i in np.argsort(lengths, kind="stable"):
        new_width = max(width, lengths[i])
        if batch and ((max_tokens and new_width * (len(batch) + 1) > max_tokens)
                      or (batch_size and len(batch) >= batch_size)):
            yield batch
            batch, new_width = [], lengths[i]
        batch.append(int(i))
        width = new_width
    if batch:
        yield batch


def spread(batches: List[List[int]], parts: int) -> List[List[int]]:
    """The batches cut until there are ``parts`` of them (or one source each): the largest halved
    each time, its sources kept in length order, so that ``parts`` workers all have one to decode."""
    batches = [list(batch) for batch in batches]
    while len(batches) < parts:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]), default=None)
        if largest is None or len(batches[largest]) < 2:
            break
        batch = batches.pop(largest)
        batches[largest:largest] = [batch[:(len(batch) + 1) // 2], batch[(len(batch) + 1) // 2:]]
    return batches


def padded(sources: List[List[int]], pad: int, left: bool) -> np.ndarray:
    """B x S int64 of the sources, padded with ``pad`` on the left or on the right."""
    width = max(len(source) for source in sources)
    batch = np.full((len(sources), width), pad, np.int64)
    for row, source in enumerate(sources):
        start = width - len(source) if left else 0
        batch[row, start: start + len(source)] = source
    return batch
