"""An S3 server for test beds and benches: moto's, answering one request at a time.

moto checks a PUT's ``If-Match`` / ``If-None-Match`` and then stores the object without a lock,
so on its threaded server two conditional PUTs can both pass; S3 decides them atomically.
Serving requests one by one gives the run store S3's guarantee, which the lease and the
manifest's compare-and-swap rely on.

    python -m pipelines.bench.serial_s3 HOST PORT     # prints "ready" once it listens
"""
from __future__ import annotations

import sys


def serial_server(host: str, port: int):
    """A werkzeug server of moto's S3 API on ``host:port`` (0: any free port), not started."""
    from moto.moto_server.werkzeug_app import (DomainDispatcherApplication, MotoRequestHandler,
                                               create_backend_app)
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    return make_server(host, port, app, threaded=False, request_handler=MotoRequestHandler)


def serve(host: str, port: int) -> None:
    server = serial_server(host, port)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m pipelines.bench.serial_s3 HOST PORT")
    serve(sys.argv[1], int(sys.argv[2]))
