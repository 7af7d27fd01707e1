"""An S3 server for test beds and benches: moto's, with S3's atomic conditional writes.

moto checks a PUT's ``If-Match`` / ``If-None-Match`` and then stores the object without a lock,
so two conditional PUTs racing on its threaded server can both pass; S3 decides them
atomically, and the lease and the manifest's compare-and-swap rely on that. Here every PUT of
an object runs under one lock (the request body is read before, so a client cut off mid-upload
holds nothing). Other requests stay concurrent: a host cut off by a partition in the middle of
a read blocks its own connection only, as on S3.

    python -m pipelines.bench.serial_s3 HOST PORT     # prints "ready" once it listens
"""
from __future__ import annotations

import sys
import threading

_PUT_LOCK = threading.Lock()


def _atomic_puts() -> None:
    """Make moto's object PUT (check the condition, then store) one step, once per process."""
    from moto.s3.responses import S3Response

    if getattr(S3Response.put_object, "atomic", False):
        return
    put = S3Response.put_object

    def put_object(self, *args, **kwargs):
        with _PUT_LOCK:
            return put(self, *args, **kwargs)

    put_object.atomic = True
    S3Response.put_object = put_object


def serial_server(host: str, port: int):
    """A threaded werkzeug server of moto's S3 API on ``host:port`` (0: any free port), with
    atomic conditional PUTs; not started."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    _atomic_puts()
    app = DomainDispatcherApplication(create_backend_app)
    return make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)


def serve(host: str, port: int) -> None:
    server = serial_server(host, port)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m pipelines.bench.serial_s3 HOST PORT")
    serve(sys.argv[1], int(sys.argv[2]))
