"""Screenshot of TensorBoard's Graphs tab showing a diff run, driven over CDP in headless Chromium.

The Graphs tab is a Polymer app inside nested shadow roots: the driver finds elements with a
shadow-piercing query, waits until the graph's nodes are rendered, colours nodes by device (a diff
graph's device is its status), expands ``removed/<scope>`` and ``added/<scope>`` down to the module
where the change acts, zooms so that both expanded modules fill the view left of the info card
(d3-zoom reacts to wheel events at a point: a zoom at the pair's centre, then a zoom out/in pair that
pans), and selects the added Function so its card shows its attributes (status, dtype, inner ops).

Also a script, for the example in ``reports/examples/``:
``python tests/instrument/tb_screenshot.py LOGDIR OUT.png [RUN] [SCOPE]``.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from cdp_client import Browser, find_chromium  # noqa: E402

from microscope.instrument.tb_launch import serve  # noqa: E402

_DEEP = ("(function(sel){const out=[];const walk=r=>{r.querySelectorAll(sel).forEach(e=>out.push(e));"
         "r.querySelectorAll('*').forEach(e=>{if(e.shadowRoot)walk(e.shadowRoot)});};walk(document);return out;})")
_SVG = _DEEP + "('tf-graph-scene').map(e=>e.shadowRoot.querySelector('svg'))"


def _node(name: str) -> str:
    return _DEEP + f"('g.node').filter(e=>e.getAttribute('data-name')=={json.dumps(name)})"


def _poll(browser: Browser, expression: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = browser.evaluate(expression)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def _rect(browser: Browser, expression: str) -> list[float]:
    return browser.evaluate(expression + ".map(e=>{const r=e.getBoundingClientRect();"
                            "return [r.x, r.y, r.x + r.width, r.y + r.height]})[0]")


def _wheel(browser: Browser, factor: float, x: float, y: float) -> None:
    delta = -500 * math.log2(factor)  # d3-zoom scales by 2^(-deltaY / 500)
    browser.evaluate(_SVG + f".forEach(v=>v.dispatchEvent(new WheelEvent('wheel',{{deltaY:{delta},"
                     f"clientX:{x},clientY:{y},bubbles:true,cancelable:true,view:window}})))")
    time.sleep(0.3)


def capture_diff_graph(logdir: Path, out: Path, run: str = "diff-triton", scope: str = "blocks.0/attn/attn_fn",
                       size: tuple[int, int] = (1920, 1080), card: int = 340) -> list[str]:
    """Serve ``logdir``, open ``run`` in the Graphs tab, expand ``removed/`` and ``added/`` down to
    ``scope``, screenshot to ``out``; returns the node names rendered (what the reader sees)."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no Chromium on PATH")
    with serve(logdir, wait_for=[run]) as url, tempfile.TemporaryDirectory() as profile:
        browser = Browser(binary, Path(profile))
        try:
            browser.open(f"{url}/?darkMode=false#graphs&run={run}", width=size[0], height=size[1])
            if not _poll(browser, _node("removed") + ".length", timeout=60):
                raise TimeoutError("the Graphs tab did not render the diff graph's nodes")
            browser.evaluate(_DEEP + "('tf-graph-controls').forEach(c=>{c.colorBy='device';c.autoExtractNodes=false})")
            parts = scope.split("/")
            for depth in range(len(parts) + 1):
                for status in ("removed", "added"):
                    name = "/".join([status, *parts[:depth]])
                    if not _poll(browser, _node(name) + ".length"):
                        raise TimeoutError(f"node {name} never rendered")
                    browser.evaluate(_node(name) + ".forEach(e=>e.querySelectorAll('.nodeshape').forEach("
                                     "s=>s.dispatchEvent(new MouseEvent('dblclick',{bubbles:true}))))")
                    time.sleep(0.3)
            added = _poll(browser, _DEEP + f"('g.node').map(e=>e.getAttribute('data-name'))"
                          f".filter(n=>n.startsWith({json.dumps(f'added/{scope}/')}))")
            browser.evaluate(_DEEP + "('tf-graph-board').forEach(b=>{b.selectedNode=''})")
            browser.evaluate(_DEEP + "('tf-graph-minimap').forEach(m=>{m.style.display='none'})")
            browser.evaluate(_DEEP + "('tf-graph').forEach(g=>g.fit())")
            time.sleep(1.2)
            view = _rect(browser, _SVG)
            view[2] -= card  # keep the right-hand side free for the selected node's card
            centre = ((view[0] + view[2]) / 2, (view[1] + view[3]) / 2)

            def pair() -> list[float]:
                a, b = _rect(browser, _node(f"removed/{scope}")), _rect(browser, _node(f"added/{scope}"))
                return [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]

            box = pair()
            k = min((view[2] - view[0]) * 0.94 / (box[2] - box[0]), (view[3] - view[1]) * 0.85 / (box[3] - box[1]))
            _wheel(browser, k, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
            box = pair()
            shift = (centre[0] - (box[0] + box[2]) / 2, centre[1] - (box[1] + box[3]) / 2)
            _wheel(browser, 0.5, centre[0] + shift[0], centre[1] + shift[1])  # out at c+t, in at c: pans by t
            _wheel(browser, 2.0, *centre)
            if added:
                browser.evaluate(_node(added[0]) + ".forEach(e=>e.querySelectorAll('.nodeshape').forEach("
                                 "s=>s.dispatchEvent(new MouseEvent('click',{bubbles:true}))))")
            time.sleep(0.8)
            browser.screenshot(out)
            return browser.evaluate(_DEEP + "('g.node').map(e=>e.getAttribute('data-name'))")
        finally:
            browser.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    shown = capture_diff_graph(Path(args[0]), Path(args[1]), *args[2:4])
    print(f"{args[1]}: {len(shown)} nodes rendered")
