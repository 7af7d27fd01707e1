"""``spotlight serve-reward``: serve one reward (OCR, GenEval) over HTTP for runs elsewhere.

A team runs its scorer on its own GPUs with ``spotlight serve-reward --reward ocr-text --host
10.0.0.5 --port 8765``; a run then sets ``reward.service.url: http://10.0.0.5:8765`` and gets
the same rewards as in process (docs/reward-service.md). The server listens on loopback unless
``--host`` names another address: the protocol has no authentication.
"""
from __future__ import annotations

import argparse
import socket
import sys

from spotlight.config import ConfigError, RewardConfig, load_config, parse_override
from spotlight.config.base import replaced

DEFAULT_PORT = 8765


def _count(least: int, most: int = 2**31):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{value} is not in [{least}, {most}]")
        return value
    return parse


def _megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of megabytes") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reward", metavar="NAME",
                   help="registered reward to serve: ocr, ocr-dense, geneval (digits world), "
                        "ocr-text, geneval-image (real images); default: the config's "
                        "reward.name, else ocr")
    p.add_argument("--config", metavar="YAML",
                   help="run config whose reward section (recogniser, OCR engine, detector) "
                        "the server uses; its reward.service is ignored")
    p.add_argument("--set", action="append", metavar="reward.KEY=VALUE",
                   help="override a reward setting, e.g. reward.ocr_engine=transformers "
                        "(repeatable)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only); name "
                        "another (0.0.0.0: every interface) only on a private network, as the "
                        "protocol has no authentication")
    p.add_argument("--port", type=_count(0, 65535), default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--max-batch", type=_count(1), default=64,
                   help="most images per request, advertised on /health; clients split their "
                        "batches to it (default 64)")
    p.add_argument("--max-body-mb", type=_megabytes, default=512.0,
                   help="largest request body in MiB, advertised on /health (default 512)")
    p.add_argument("--max-waiting", type=_count(0), default=8,
                   help="requests that may wait behind the batch being scored; more are "
                        "answered 503 and retried by clients (default 8)")
    p.add_argument("--quiet", action="store_true", help="log nothing per request")
    p.set_defaults(func=run)


def served_config(args: argparse.Namespace) -> RewardConfig:
    """The reward section the server computes: ``--config``'s (or the defaults), ``--set``
    and ``--reward`` applied, no service (it computes the reward itself)."""
    overrides = dict(parse_override(item) for item in (args.set or []))
    others = [key for key in overrides if not key.startswith("reward.")]
    if others:
        raise ConfigError(f"--set {others[0]}: serve-reward takes only reward.* settings, "
                          "e.g. --set reward.recognizer_epochs=30")
    config = load_config(args.config).reward if args.config else RewardConfig()
    values = {key[len("reward."):]: value for key, value in overrides.items()}
    if args.reward:
        values["name"] = args.reward
    values["service.url"] = ""
    return replaced(config, values)


def run(args: argparse.Namespace) -> int:
    config = served_config(args)
    # spotlight.rewards imports torch: not for every command's parser, only when serving.
    from pipelines.front.reward_http import RewardServer, build_served_reward, is_loopback

    print(f"building reward '{config.name}'...", flush=True)
    reward = build_served_reward(config)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        server = RewardServer(reward, host=args.host, port=args.port, max_batch=args.max_batch,
                              max_body_bytes=int(args.max_body_mb * 2**20),
                              max_waiting=args.max_waiting, log=log)
    except OSError as err:   # a port in use, an address not of this machine
        raise ConfigError(f"serve-reward cannot listen on {args.host}:{args.port} ({err}); pick "
                          "another --port (0: any free one) or --host") from None
    if not is_loopback(args.host):
        print(f"warning: listening on {args.host}: anyone who reaches this port can use this "
              "scorer (the protocol has no authentication); keep it on a private network",
              file=sys.stderr, flush=True)
    reach = server.url
    if args.host in ("0.0.0.0", "::", ""):   # every interface: runs reach it by a name of ours
        reach = f"http://{socket.gethostname()}:{server.httpd.server_address[1]}"
    print(f"serving reward '{reward.name}' on {server.url} (protocol 1; at most "
          f"{args.max_batch} images and {args.max_body_mb:g} MiB per request); set "
          f"reward.service.url: {reach} in a run's config; Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("reward server stopped", flush=True)
    finally:
        server.close()
    return 0
