"""A minimal Chrome DevTools Protocol client on the standard library, for the HTML report tests.

Why not ``--dump-dom`` and scraping ``--enable-logging`` output: the log format changes between
Chromium versions and does not list network requests, so "no console errors, no network requests"
could pass for the wrong reason. CDP reports them as structured events (``Runtime.exceptionThrown``,
``Runtime.consoleAPICalled``, ``Log.entryAdded``, ``Network.requestWillBeSent``,
``Page.javascriptDialogOpening``), and lets the test evaluate JavaScript in the page (click a header,
count SVGs) and take a full-page screenshot. The ``websockets`` package is not installed, so this holds
a small RFC 6455 client: client frames masked, server frames read with fragmentation, ping answered.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class WebSocket:
    """Text frames over one TCP connection (enough for CDP)."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlparse(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
                   "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket upgrade refused: {head[:200]!r}")

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + body)

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def recv(self) -> str:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._exact(2)
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            mask = self._exact(4) if b1 & 0x80 else None
            payload = self._exact(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the websocket")
            if opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if fin:
                    return b"".join(parts).decode("utf-8", errors="replace")

    def close(self) -> None:
        try:
            self._send_frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()


class Browser:
    """Headless Chromium driven over CDP; ``events`` keeps every event of the attached page."""

    def __init__(self, binary: str, profile: Path, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.log_path = profile / "chromium-stderr.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
             "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self._log)
        self.ws = WebSocket(self._endpoint(profile), timeout)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _endpoint(self, profile: Path) -> str:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}: {self.log_text()[-2000:]}")
            if port_file.is_file():
                lines = port_file.read_text().split()
                if len(lines) >= 2:
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            time.sleep(0.05)
        raise TimeoutError(f"chromium did not open DevTools within {self.timeout} s")

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def call(self, method: str, params: dict[str, Any] | None = None, *, page: bool = True) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if page and self.session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, timeout: float | None = None) -> dict[str, Any]:
        for event in self.events:
            if event["method"] == method:
                return event
        self.ws.sock.settimeout(timeout or self.timeout)
        try:
            while True:
                msg = json.loads(self.ws.recv())
                if "method" in msg:
                    self.events.append(msg)
                    if msg["method"] == method:
                        return msg
        finally:
            self.ws.sock.settimeout(self.timeout)

    def drain(self, seconds: float) -> None:
        """Collect events for ``seconds`` (late console messages, late requests)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.ws.sock.settimeout(left)
            try:
                msg = json.loads(self.ws.recv())
            except TimeoutError:
                break
            if "method" in msg:
                self.events.append(msg)
        self.ws.sock.settimeout(self.timeout)

    def open(self, url: str, width: int = 1400, height: int = 1000) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, page=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 page=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self.call("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")
        self.drain(0.5)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, max_height: int = 12000) -> Path:
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height), "scale": 1}
        data = self.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def page_events(self, method: str) -> list[dict[str, Any]]:
        return [e["params"] for e in self.events if e["method"] == method
                and e.get("sessionId", self.session) == self.session]

    def console_errors(self) -> list[str]:
        out = [json.dumps(p.get("exceptionDetails", p))[:500] for p in self.page_events("Runtime.exceptionThrown")]
        out += [json.dumps(p)[:500] for p in self.page_events("Runtime.consoleAPICalled")
                if p.get("type") in ("error", "assert")]
        out += [json.dumps(p["entry"])[:500] for p in self.page_events("Log.entryAdded")
                if p["entry"].get("level") == "error"]
        return out

    def requests(self) -> list[str]:
        return [p["request"]["url"] for p in self.page_events("Network.requestWillBeSent")]

    def close(self) -> None:
        try:
            self.call("Browser.close", page=False)
        except (OSError, RuntimeError, ConnectionError):
            pass
        self.ws.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()
