"""fairseq-train under torchrun, also on CPU.

    torchrun --nproc_per_node 2 -m recipes.wmt17.torchrun_cpu DATA --user-dir ... [fairseq-train options]

Under torchrun, fairseq 0.12.3 takes its rank from the environment in
``_infer_torch_distributed_launch_init`` and picks the device as ``rank %
torch.cuda.device_count()``, which divides by zero without a GPU; on CPU its
default ``--ddp-backend pytorch_ddp`` also hands DistributedDataParallel
``device_ids=[0]``. fairseq skips that inference when the command line already
names an init method, so this launcher turns torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK; MASTER_ADDR and MASTER_PORT are read by ``env://``)
into fairseq's distributed options and runs fairseq-train in the same process.
Without CUDA it adds ``--cpu --distributed-backend gloo --ddp-backend legacy_ddp``,
the combination that trains on CPU. fairseq itself is not changed.
"""

import logging
import os
import sys
from typing import List, Mapping

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def fairseq_distributed_args(env: Mapping[str, str], cuda: bool) -> List[str]:
    """fairseq-train options for this process; they go after the user's, so they win."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in env]
    if missing:
        raise SystemExit(f"recipes.wmt17.torchrun_cpu: {', '.join(missing)} not set: run it under "
                         "torchrun, e.g. torchrun --nproc_per_node 2 -m recipes.wmt17.torchrun_cpu "
                         "DATA [fairseq-train options]")
    args = ["--distributed-world-size", env["WORLD_SIZE"], "--distributed-rank", env["RANK"],
            "--distributed-init-method", "env://", "--distributed-no-spawn",
            "--device-id", env.get("LOCAL_RANK", "0")]
    if not cuda:
        args += ["--cpu", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
    return args


def main(argv: List[str] = None):
    import torch
    from fairseq_cli.train import cli_main

    # fairseq-train sets up logging before it imports fairseq; through ``-m`` this
    # package imported fairseq first, whose speech tasks configure logging their
    # own way. Log as fairseq-train does (to stdout, "time | level | name | message").
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", level=os.environ.get("LOGLEVEL", "INFO").upper(),
                        stream=sys.stdout, force=True)
    argv = sys.argv[1:] if argv is None else argv
    sys.argv = ["fairseq-train", *argv, *fairseq_distributed_args(os.environ, torch.cuda.is_available())]
    cli_main()


if __name__ == "__main__":
    main()
