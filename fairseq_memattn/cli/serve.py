"""fairseq-memattn-serve: translate over HTTP (its help: DESCRIPTION and deploy.serve.API)."""

import argparse
import logging
import sys

from ..errors import UserError, import_installed, one_line_errors
from .deploy_options import add_model_options, add_search_options, check_options, check_positive, check_range, \
    load, search_options

PROG = "fairseq-memattn-serve"
LOG_LEVELS = ("debug", "info", "warning", "error")
# Help text in constants, not docstrings, so that it holds under python -OO.
DESCRIPTION = """translate over HTTP.

    fairseq-memattn-serve FOLDER [--host 127.0.0.1] [--port 8000] [--batch-window-ms 5] \\
        [--max-tokens 1024] [--queue-size 64] [--workers 1] [--threads T] [--timeout-s 60] \\
        [--idle-timeout-s 15] [--log-level info]
    # or: python -m fairseq_memattn.cli.serve FOLDER ...

A model folder that is broken or whose parts do not fit together is refused before the server
starts: one line, status 2.
"""


def parse_args(argv=None):
    with one_line_errors(PROG):
        import_installed("aiohttp", 'the server needs aiohttp: pip install "aiohttp>=3.9"', UserError)
    from ..deploy import serve

    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION + "\n" + serve.API,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_search_options(p)
    p.add_argument("--batch-window-ms", type=float, default=5.0,
                   help="how long the first waiting request waits for others to batch with (default 5)")
    p.add_argument("--queue-size", type=int, default=64, help="requests waiting at most; beyond, 503")
    p.add_argument("--max-beam", type=int, default=16, help="the largest beam a request may ask for")
    p.add_argument("--max-sentences", type=int, default=256, help="sentences per request at most; beyond, 413")
    p.add_argument("--timeout-s", type=float, default=serve.TIMEOUT_S,
                   help=f"a request not answered within this many seconds gets 504 (default {serve.TIMEOUT_S:g})")
    p.add_argument("--idle-timeout-s", type=float, default=serve.IDLE_TIMEOUT_S,
                   help="a connection without a complete request for this many seconds is closed "
                        f"(default {serve.IDLE_TIMEOUT_S:g})")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="default info; debug adds a line per request (aiohttp's access log)")
    args = p.parse_args(argv)
    check_options(p, args)
    check_positive(p, args, "queue_size", "max_beam", "max_sentences")
    check_range(p, args, "port", 0, 65535)
    check_range(p, args, "batch_window_ms", 0)
    for name in ("timeout_s", "idle_timeout_s"):
        check_range(p, args, name, 0.001)
    if args.beam > args.max_beam:
        p.error(f"invalid --beam: {args.beam} (must be <= --max-beam {args.max_beam})")
    if args.batch_window_ms >= 1000 * args.timeout_s:  # every request would wait out its deadline
        p.error(f"invalid --batch-window-ms: {args.batch_window_ms:g} (must be below --timeout-s {args.timeout_s:g} "
                f"in milliseconds)")
    return p, args


def main(argv=None) -> int:
    try:
        parser, args = parse_args(argv)
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        translator, codec = load(parser, args)
        from ..deploy import serve

        app = serve.make_app(translator, codec, search_options(args), beam=args.beam,
                             window=args.batch_window_ms / 1000, max_tokens=args.max_tokens,
                             queue_size=args.queue_size, max_beam=args.max_beam, max_sentences=args.max_sentences,
                             workers=args.workers, timeout=args.timeout_s)
    except KeyboardInterrupt:  # at start-up: nothing to clean up
        return 130
    try:
        serve.run(app, args.host, args.port, idle_timeout=args.idle_timeout_s, access_log=args.log_level == "debug")
    except OSError as error:  # the port is taken, the host unknown
        parser.error(f"cannot listen on {args.host}:{args.port} ({error.strerror or error})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
