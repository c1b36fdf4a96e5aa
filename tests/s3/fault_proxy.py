#!/usr/bin/python3
"""A fault-injecting HTTP proxy in front of the tests' S3 server.

Forwards every request to UPSTREAM (keep-alive on both sides) and counts
them. With --secret it also verifies each request's SigV4 signature with
botocore (Debian's python3-botocore; s3rver itself does not check V4
signatures) and answers 403 SignatureDoesNotMatch to a wrong one.

Faults are queued through the proxy's own control paths (never forwarded,
never counted):
  POST /__proxy/fault?kind=K&count=N[&match=S][&status=C&code=X][&seconds=T]
     kind=status  answer C with <Error><Code>X</Code> (503 SlowDown, 500, ...)
     kind=stall   hold the request T seconds without answering, then close
     kind=cut     close the connection halfway through the request body
                  (or, for a request without a body, halfway through the reply)
     kind=drop    forward the request, then close without its reply
     kind=badsig  flip one character of the request's signature
     Each applies to the next N requests whose request line contains S.
  GET  /__proxy/stats   "requests N\\nrejected M\\nfaults_left K\\n"
  POST /__proxy/reset   clears faults and counters

Prints "port N" on stdout once listening. Usage:
  fault_proxy.py --upstream 127.0.0.1:PORT [--port 0] [--secret S --region R]
"""
import argparse
import http.client
import socketserver
import sys
import threading
import time
import urllib.parse

LOCK = threading.Lock()
FAULTS = []  # dicts: kind, count, match, status, code, seconds
STATS = {"requests": 0, "rejected": 0}
ARGS = None


def error_body(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code>'
            '<Message>%s</Message></Error>' % (code, message)).encode()


def take_fault(request_line):
    with LOCK:
        for f in FAULTS:
            if f["count"] > 0 and f["match"] in request_line:
                f["count"] -= 1
                return dict(f)
    return None


def verify_signature(method, target, headers):
    """None when the SigV4 signature is right, else the reason."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    auth = headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return "not a SigV4 Authorization header"
    fields = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
    access_key = fields["Credential"].split("/")[0]
    signed = fields["SignedHeaders"].split(";")
    req = AWSRequest(method=method, url="http://%s%s" % (headers["host"], target),
                     headers={h: headers.get(h, "") for h in signed})
    req.context["timestamp"] = headers.get("x-amz-date", "")
    signer = S3SigV4Auth(Credentials(access_key, ARGS.secret), "s3", ARGS.region)
    canonical = signer.canonical_request(req)
    want = signer.signature(signer.string_to_sign(req, canonical), req)
    if want != fields["Signature"]:
        return "signature mismatch; canonical request was:\n" + canonical
    return None


class Handler(socketserver.StreamRequestHandler):
    def reply(self, status, reason, body=b"", headers=()):
        out = ["HTTP/1.1 %d %s" % (status, reason), "Content-Length: %d" % len(body)]
        out += ["%s: %s" % h for h in headers]
        self.wfile.write(("\r\n".join(out) + "\r\n\r\n").encode() + body)
        self.wfile.flush()

    def control(self, method, target):
        url = urllib.parse.urlsplit(target)
        q = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/__proxy/fault":
            with LOCK:
                FAULTS.append({"kind": q["kind"], "count": int(q.get("count", "1")),
                               "match": q.get("match", ""), "status": int(q.get("status", "503")),
                               "code": q.get("code", "SlowDown"),
                               "seconds": float(q.get("seconds", "5"))})
            self.reply(200, "OK")
        elif url.path == "/__proxy/stats":
            with LOCK:
                left = sum(f["count"] for f in FAULTS)
                body = "requests %d\nrejected %d\nfaults_left %d\n" % (
                    STATS["requests"], STATS["rejected"], left)
            self.reply(200, "OK", body.encode())
        elif url.path == "/__proxy/reset":
            with LOCK:
                FAULTS.clear()
                STATS["requests"] = STATS["rejected"] = 0
            self.reply(200, "OK")
        else:
            self.reply(404, "Not Found")

    def handle(self):
        upstream = None
        while True:
            line = self.rfile.readline(65537)
            if not line:
                return
            request_line = line.decode("latin-1").rstrip("\r\n")
            if not request_line:
                continue
            method, target, _ = request_line.split(" ", 2)
            raw_headers = []
            while True:
                h = self.rfile.readline(65537).decode("latin-1").rstrip("\r\n")
                if not h:
                    break
                name, value = h.split(":", 1)
                raw_headers.append((name.strip(), value.strip()))
            headers = {n.lower(): v for n, v in raw_headers}
            length = int(headers.get("content-length", "0"))
            if target.startswith("/__proxy/"):
                self.rfile.read(length)
                self.control(method, target)
                continue
            with LOCK:
                STATS["requests"] += 1
            if headers.get("expect", "").lower() == "100-continue":
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.wfile.flush()
            fault = take_fault(request_line)
            kind = fault["kind"] if fault else None
            if kind == "cut" and length > 0:
                self.rfile.read(length // 2)
                return  # closes the connection mid-body
            body = self.rfile.read(length)
            if kind == "stall":
                time.sleep(fault["seconds"])
                return
            if kind == "status":
                self.reply(fault["status"], "Injected", error_body(fault["code"], "injected by fault_proxy"),
                           [("Content-Type", "application/xml")])
                continue
            if kind == "badsig":
                for i, (n, v) in enumerate(raw_headers):
                    if n.lower() == "authorization":
                        v = v[:-1] + ("0" if v[-1] != "0" else "1")
                        raw_headers[i] = (n, v)
                        headers["authorization"] = v
            if ARGS.secret:
                problem = verify_signature(method, target, headers)
                if problem:
                    with LOCK:
                        STATS["rejected"] += 1
                    sys.stderr.write("fault_proxy: %s %s: %s\n" % (method, target, problem))
                    self.reply(403, "Forbidden", error_body(
                        "SignatureDoesNotMatch", "The request signature we calculated does not match"),
                        [("Content-Type", "application/xml")])
                    continue
            # An idle kept-alive upstream connection may have been closed by
            # the store (Node's keep-alive timeout is 5 s): that request is
            # sent again on a fresh connection, or the client would see a
            # close that no fault asked for (curl then silently re-sends on
            # a new connection, and the fault taken here never shows).
            resp = None
            for fresh in (upstream is None, True):
                if fresh:
                    if upstream is not None:
                        upstream.close()
                    upstream = http.client.HTTPConnection(ARGS.upstream, timeout=120)
                try:
                    upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                    for n, v in raw_headers:
                        upstream.putheader(n, v)
                    upstream.endheaders(body if length else None)
                    resp = upstream.getresponse()
                    data = resp.read()
                    break
                except (OSError, http.client.HTTPException):
                    resp = None
                    if fresh:
                        break
            if resp is None:
                return  # upstream gone: close, as a dead server would
            if kind == "drop":
                return  # the store did the work; its reply is lost
            out = [(n, v) for n, v in resp.getheaders()
                   if n.lower() not in ("content-length", "transfer-encoding", "connection")]
            if method == "HEAD":
                out.append(("Content-Length", resp.getheader("Content-Length", "0")))
                head = ["HTTP/1.1 %d %s" % (resp.status, resp.reason)] + ["%s: %s" % h for h in out]
                self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode())
                self.wfile.flush()
                continue
            if kind == "cut":
                head = ["HTTP/1.1 %d %s" % (resp.status, resp.reason),
                        "Content-Length: %d" % len(data)] + ["%s: %s" % h for h in out]
                self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + data[:len(data) // 2])
                self.wfile.flush()
                return
            self.reply(resp.status, resp.reason, data, out)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--secret", default="")
    p.add_argument("--region", default="us-east-1")
    ARGS = p.parse_args()
    server = Server(("127.0.0.1", ARGS.port), Handler)
    sys.stdout.write("port %d\n" % server.server_address[1])
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
