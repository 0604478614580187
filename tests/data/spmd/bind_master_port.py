"""Rank 0 listens on ``MASTER_ADDR:MASTER_PORT`` as a torchrun rendezvous store would, prints
``rendezvous port bound`` and exits 0; it exits 3 naming the error when the port is taken."""

import os
import socket
import sys

if os.environ["RANK"] == "0":
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(address)
        except OSError as error:
            print(f"rendezvous port {address[0]}:{address[1]} taken: {error}", flush=True)
            sys.exit(3)
        server.listen()
        print("rendezvous port bound", flush=True)
