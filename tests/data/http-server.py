#!/usr/bin/env python3
"""A small HTTP server for tests/unit/test-image.c, listening on 127.0.0.1 only.

usage: http-server.py DIR LOG

Prints the port it listens on, then serves the files of DIR:
  /NAME            with Range support (206 Partial Content)
  /norange/NAME    ignores Range: always 200 with the whole file
  /slow/NAME       with Range support, 16 KiB every 20 ms
  /redirect/NAME   302 to /NAME
Anything else is 404. Every request appends "<METHOD> <path> <Range header or ->" to LOG.
Exits when its stdin closes.
"""

import http.server
import os
import re
import sys
import threading
import time

CHUNK = 16 * 1024


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        pass

    def record(self):
        with open(self.server.log_path, "a") as log:
            log.write(f"{self.command} {self.path} {self.headers.get('Range', '-')}\n")

    def do_HEAD(self):
        self.do_GET(body=False)

    def do_GET(self, body=True):
        self.record()
        path = self.path
        mode = "plain"
        for prefix in ("norange", "slow", "redirect"):
            if path.startswith(f"/{prefix}/"):
                mode = prefix
                path = path[len(prefix) + 1:]
        name = path.lstrip("/")
        file_path = os.path.join(self.server.root, name)
        if "/" in name or not name or not os.path.isfile(file_path):
            self.send_error(404)
            return
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", f"/{name}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return

        with open(file_path, "rb") as f:
            data = f.read()
        size = len(data)
        start, end = 0, size - 1
        status = 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match and mode != "norange":
            start = int(match.group(1))
            if match.group(2):
                end = min(int(match.group(2)), size - 1)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206

        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_header("Accept-Ranges", "none" if mode == "norange" else "bytes")
        self.end_headers()
        if not body:
            return
        payload = data[start:end + 1]
        try:
            if mode == "slow":
                for i in range(0, len(payload), CHUNK):
                    self.wfile.write(payload[i:i + CHUNK])
                    self.wfile.flush()
                    time.sleep(0.02)
            else:
                self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.root = sys.argv[1]
    server.log_path = sys.argv[2]
    server.daemon_threads = True
    # The test holds our stdin: when it goes away, even by crashing, so do we.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
