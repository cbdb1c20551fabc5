"""fairseq-memattn-serve: translate over HTTP.

    fairseq-memattn-serve FOLDER [--host 127.0.0.1] [--port 8000] [--batch-window-ms 5] \\
        [--max-tokens 1024] [--queue-size 64] [--workers 1] [--threads T]
    # or: python -m fairseq_memattn.deploy.serve FOLDER ...
"""

import argparse
import sys

from aiohttp import web

from ..deploy import serve
from .deploy_options import add_model_options, add_search_options, check_options, check_positive, load, search_options


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="fairseq-memattn-serve", description=__doc__ + "\n" + serve.__doc__.split("\n\n", 1)[1],
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
    args = p.parse_args(argv)
    check_options(p, args)
    check_positive(p, args, "queue_size", "max_beam", "max_sentences")
    if args.beam > args.max_beam:
        p.error(f"invalid --beam: {args.beam} (must be <= --max-beam {args.max_beam})")
    if args.batch_window_ms < 0:
        p.error(f"invalid --batch-window-ms: {args.batch_window_ms} (must be >= 0)")
    return p, args


def main(argv=None) -> None:
    parser, args = parse_args(argv)
    translator, codec = load(parser, args)
    app = serve.make_app(translator, codec, search_options(args), beam=args.beam, window=args.batch_window_ms / 1000,
                   max_tokens=args.max_tokens, queue_size=args.queue_size, max_beam=args.max_beam,
                   max_sentences=args.max_sentences, workers=args.workers)
    try:
        web.run_app(app, host=args.host, port=args.port, print=lambda text: print(text, file=sys.stderr))
    except OSError as error:  # the port is taken, the host unknown
        parser.error(f"cannot listen on {args.host}:{args.port} ({error.strerror or error})")



if __name__ == "__main__":
    main()
