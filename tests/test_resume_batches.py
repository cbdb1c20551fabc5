"""Why a resume in epoch >= 2 does not repeat an uninterrupted run (docs/reliability.md):
fairseq groups examples into batches under numpy_seed(seed + epoch) for the epoch its batch
iterator is built in. An uninterrupted run builds it in epoch 1 and only reshuffles those batches
later; a run resumed in epoch E builds it for E. If a fairseq release changes this, this test
says so, and the documented limit can go."""

from argparse import Namespace

from fairseq.tasks import setup_task

import fairseq_memattn  # noqa: F401  (registers copy_task)

COPY = Namespace(task="copy_task", copy_max_len=6, copy_vocab_size=8, copy_train_size=800,
                 copy_valid_size=16, copy_test_size=16, copy_reverse=False, copy_seed=1)


def batches_built_in(task, epoch):
    iterator = task.get_batch_iterator(task.dataset("train"), max_sentences=16, seed=1, epoch=epoch,
                                       disable_iterator_cache=True)
    return {tuple(sorted(batch)) for batch in iterator.frozen_batches}


def test_resumed_epoch_groups_examples_differently():
    task = setup_task(COPY)
    task.load_dataset("train")
    first = batches_built_in(task, 1)
    assert batches_built_in(task, 1) == first  # the same epoch: the same batches
    assert batches_built_in(task, 2) != first  # what a run resumed in epoch 2 trains on
    cached = task.get_batch_iterator(task.dataset("train"), max_sentences=16, seed=1, epoch=1)
    assert task.get_batch_iterator(task.dataset("train"), max_sentences=16, seed=1, epoch=2) is cached
