"""python -m fairseq_memattn.tasks.copy_task --out-dir DIR [--copy-* options]: the task's examples
as parallel text. A module of its own, since the package (``__init__.py``) is imported, and the
task registered, before ``python -m`` runs its target."""

import argparse

from . import SPLITS, CopyTaskConfig, add_copy_task_args, export_copy_data


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="copy_task.py",  # the name its errors have always had
        description="Write the copy task's splits as parallel text for fairseq-preprocess "
                    "(the same examples --task copy_task generates with the same options)."
    )
    parser.add_argument("--out-dir", required=True, help="directory for {train,valid,test}.{src,tgt}")
    add_copy_task_args(parser)
    args = parser.parse_args(argv)
    cfg = CopyTaskConfig(**{k: v for k, v in vars(args).items() if k in CopyTaskConfig.__dataclass_fields__})
    try:
        export_copy_data(cfg, args.out_dir)
    except ValueError as error:
        parser.error(str(error))
    except OSError as error:
        parser.error(f"--out-dir {args.out_dir}: {error.strerror}")
    print(f"wrote {', '.join(SPLITS)} to {args.out_dir}")


if __name__ == "__main__":
    main()
