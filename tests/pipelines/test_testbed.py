"""The multi-host test bed: hosts reach each other over the bridge; a partition cuts one off
until it heals, while its processes keep running."""
from __future__ import annotations

import sys

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7001)); s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"pong"); c.close()
"""
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7001), timeout=2) as c:
        print(c.recv(4).decode())
except OSError as exc:
    print(f"unreachable: {type(exc).__name__}")
"""


def _ask(client, address: str) -> str:
    done = client.run([sys.executable, "-c", CLIENT, address], capture_output=True, text=True,
                      timeout=60)
    return done.stdout.strip()


def test_hosts_talk_and_a_partition_cuts_one_off_until_it_heals(testbed):
    server, client = testbed.host("server"), testbed.host("client")
    assert server.ip != client.ip and server.ip.startswith("198.1")
    proc = server.popen([sys.executable, "-c", SERVER, server.ip], stdout=-1, text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert _ask(client, server.ip) == "pong"
    testbed.partition("server")
    assert _ask(client, server.ip).startswith("unreachable")
    assert proc.poll() is None   # cut off, not dead: it is still serving on its side
    testbed.heal("server")
    assert _ask(client, server.ip) == "pong"


def test_namespaces_are_private_and_cleaned_up(testbed):
    import subprocess

    host = testbed.host("lonely")
    # A host sees its own interfaces only: its address, not the bridge's.
    inside = host.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert host.ip in inside and testbed.gateway not in inside
    testbed.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert host.netns not in listed
