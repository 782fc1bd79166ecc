#!/usr/bin/env python3
"""A fake upstream API for tests/integration/vm-secrets.sh: it records everything it is sent.

Usage: https-recorder.py ADDRESS PORT OUT [CERT KEY]

Serves HTTP/1.1 with keep-alive on ADDRESS:PORT, over TLS when CERT and KEY are given. OUT is a
prefix: OUT.raw gets every byte received after TLS (also what does not parse as a request),
OUT.jsonl one JSON line per request ({"conn", "method", "target", "headers", "body"}) and one
{"event": "tls-failed", "conn", "error"} per failed handshake; OUT.ready appears once it listens.
Both are written before the response is sent, so a client that got its answer finds its request
recorded.

GET /echo: 200 "ok". GET /stream: 200, chunked text/event-stream, three events a second apart.
GET /headers and TRACE anything: 200, the request head as received in the body, and its
Authorization in an X-Echo-Authorization field (what a debug page or TRACE gives back).
POST /v1/messages: 200, a canned Messages API answer in JSON (its text: "canned answer"), for
the Anthropic SDK. POST/PUT anything else: the body is read (Content-Length or chunked), 200
"ok". Else 404.
"""
import http.server
import io
import itertools
import json
import socketserver
import ssl
import sys
import threading
import time

ADDRESS, PORT, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
CERT, KEY = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else (None, None)
LOCK = threading.Lock()
CONN_IDS = itertools.count(1)
TLS = None
MESSAGE = json.dumps({
    "id": "msg_vmtest", "type": "message", "role": "assistant", "model": "claude-x",
    "content": [{"type": "text", "text": "canned answer"}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 2}}).encode()
if CERT:
    TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    TLS.load_cert_chain(CERT, KEY)


def record(entry):
    with LOCK, open(OUT + ".jsonl", "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")


class TeeRaw(io.RawIOBase):
    """The connection's bytes as a raw stream, each read also appended to OUT.raw."""

    def __init__(self, sock):
        self.sock = sock

    def readable(self):
        return True

    def readinto(self, buf):
        n = self.sock.recv_into(buf)
        if n:
            with LOCK, open(OUT + ".raw", "ab") as f:
                f.write(bytes(buf[:n]))
        return n


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        self.conn_id = next(CONN_IDS)
        if TLS is not None:
            try:
                self.request = TLS.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError) as e:
                record({"event": "tls-failed", "conn": self.conn_id, "error": str(e)})
                raise
        self.connection = self.request
        self.request.settimeout(60)
        self.rfile = io.BufferedReader(TeeRaw(self.request))
        self.wfile = socketserver._SocketWriter(self.request)

    def log_message(self, *args):
        pass

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0") or "0"))

    def handle_any(self):
        body = self.read_body()
        record({"conn": self.conn_id, "method": self.command, "target": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body": body.decode("latin-1")})
        path = self.path.split("?")[0]
        if path == "/stream" and self.command == "GET":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(1, 4):
                event = ("data: event %d %.3f\n\n" % (i, time.time())).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                if i < 3:
                    time.sleep(1)
            self.wfile.write(b"0\r\n\r\n")
            return
        if path == "/headers" or self.command == "TRACE":
            echo = ("%s %s %s\r\n" % (self.command, self.path, self.request_version)
                    + "".join("%s: %s\r\n" % kv for kv in self.headers.items())).encode("latin-1")
            self.send_response(200)
            self.send_header("Content-Type", "message/http")
            self.send_header("X-Echo-Authorization", self.headers.get("Authorization", ""))
            self.send_header("Content-Length", str(len(echo)))
            self.end_headers()
            self.wfile.write(echo)
            return
        if path == "/v1/messages" and self.command == "POST":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(MESSAGE)))
            self.end_headers()
            self.wfile.write(MESSAGE)
            return
        if path == "/echo" or self.command in ("POST", "PUT"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_TRACE = handle_any


class Server(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a refused handshake is recorded in setup(); the rest is the client going away


server = Server((ADDRESS, PORT), Handler)
for suffix in (".raw", ".jsonl"):
    open(OUT + suffix, "ab").close()
open(OUT + ".ready", "w").close()
server.serve_forever()
