"""One rank of a distributed fairseq-train, for tests/test_distributed.py.

    python tests/distributed_rank.py DUMP [fairseq-train options]           # options name the rank
    torchrun ... tests/distributed_rank.py DUMP --torchrun [fairseq-train options]

fairseq saves checkpoints on rank 0 only, so to compare the ranks this runs
fairseq-train's own ``cli_main`` in-process and, when it returns, writes this
rank's model parameters to DUMP (``{rank}`` in it is replaced by the rank).
It only records the Trainer fairseq builds; training is fairseq's.
"""

import os
import sys

import fairseq_cli.train
import torch
from fairseq.trainer import Trainer

trainers = []


class RecordedTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        trainers.append(self)


def main():
    dump, argv = sys.argv[1], sys.argv[2:]
    if argv[:1] == ["--torchrun"]:
        from recipes.wmt17.torchrun_cpu import fairseq_distributed_args

        argv = argv[1:] + fairseq_distributed_args(os.environ, torch.cuda.is_available())
    fairseq_cli.train.Trainer = RecordedTrainer
    sys.argv = ["fairseq-train", *argv]
    fairseq_cli.train.cli_main()
    (trainer,) = trainers
    rank = trainer.cfg.distributed_training.distributed_rank
    params = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    torch.save({"rank": rank, "num_updates": trainer.get_num_updates(), "params": params},
               dump.format(rank=rank))


if __name__ == "__main__":
    main()
