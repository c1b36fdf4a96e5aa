"""python3 -m ckpt.torch.store_server --port P: the rendezvous store of
every generation of a job, served by a process of no generation.

ckptrun --rendezvous torch keeps this process up on each node, from its
own start to its end (it is started again if it exits), and tells its
trainers to be the store's clients only ($CKPT_RENDEZVOUS=launcher;
ckpt.torch.resilient then forms each generation's group on it, its keys
prefixed by the job and the generation). So ranks kept by an in-process
restart re-form without waiting for rank 0's replacement, and the loss of
rank 0's node is like the loss of any other: the plan's MASTER_ADDR is
rank 0's node in the new generation, where this server already runs.

It is torch's own TCPStore (is_master=True), so the wire protocol is
torch's. A port in use (another ckptrun on this host serves it: a test
cluster on one machine) is retried every 0.2 s, quietly, so that this one
takes over when that one goes. SIGTERM or SIGINT ends it (exit 0).
"""

import argparse
import datetime
import os
import signal
import socket
import sys
import time


def _log(line):
    sys.stderr.write("ckpt.torch.store_server[%d]: %s\n" % (os.getpid(), line))
    sys.stderr.flush()


def _port_free(port):
    """Whether a listener could bind `port` now (as TCPStore does: IPv6
    dual-stack, else IPv4), without the warnings torch logs on a failure."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            return True
        except OSError:
            continue
        finally:
            s.close()
    return False


def serve(port, retry_s=0.2):
    """Binds `port` (waiting while it is taken) and returns the store."""
    import torch.distributed as dist
    said = False
    while True:
        if _port_free(port):
            try:
                # No world size and no wait for workers: clients of every
                # generation come and go. The timeout is the server's own
                # client's, unused.
                return dist.TCPStore("127.0.0.1", port, None, True,
                                     datetime.timedelta(seconds=30), False)
            except RuntimeError as e:
                if not said:
                    _log("port %d: %s; retrying" % (port, str(e)[:200]))
                    said = True
        elif not said:
            _log("port %d in use (another ckptrun on this host may serve it); "
                 "retrying" % port)
            said = True
        time.sleep(retry_s)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m ckpt.torch.store_server",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True,
                   help="TCP port, every interface (ckptrun's --master-port)")
    args = p.parse_args(argv)
    if not 1 <= args.port <= 65535:
        p.error("--port: %d is not in [1, 65535]" % args.port)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    store = serve(args.port)
    _log("serving the rendezvous store on port %d" % args.port)
    signal.sigwait(stop)
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
