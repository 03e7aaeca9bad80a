#!/usr/bin/env python3
"""`tensorpool report` pages rendered in headless Chromium: every panel is there, every chart is
drawn (its SVG has non-empty paths, a map has blocks), the page says it rendered without error
and the console shows nothing. Rendered: a generated trace with --fit (the summary's fit column),
the same on a device too small for it (the OOM panel and its maps), and a shared PyTorch
snapshot when ../shared/traces has it. A deliberately broken page must be caught by the same checks.

Needs Debian's `chromium` (scripts/install-deps.sh report installs it); exits 77, which CTest
counts as skipped, when no Chromium is found.
Usage: report_browser_test.py TENSORPOOL_BINARY SHARED_TRACES_DIR"""
import html.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile

binary, shared = sys.argv[1], sys.argv[2]
PANELS = ["summary", "memory", "fragmentation", "maps", "oom", "trace", "sites"]

browser = os.environ.get("TENSORPOOL_CHROMIUM") or next(
    (b for b in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable") if shutil.which(b)), None)
if not browser:
    print("chromium not found (scripts/install-deps.sh report installs it): skipped")
    sys.exit(77)


class Page(html.parser.HTMLParser):
    """What the rendered DOM holds: body attributes, panels, charts and what each draws."""

    def __init__(self):
        super().__init__()
        self.body = {}
        self.errors_hidden = None
        self.errors_text = ""
        self.panels = []
        self.charts = []  # [kind, panel, paths with a drawn d, rects]
        self.verdicts = 0
        self._panel = None
        self._in_errors = False
        self._svg_depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "div" and a.get("id") == "errors":
            self.errors_hidden = "hidden" in a
            self._in_errors = True
        elif tag == "section" and "panel" in a.get("class", ""):
            self._panel = a.get("id")
            self.panels.append(self._panel)
        elif tag == "p" and "verdict" in a.get("class", ""):
            self.verdicts += 1
        elif tag == "svg" and "data-chart" in a:
            self.charts.append([a["data-chart"], self._panel, 0, 0])
            self._svg_depth = 1
        elif tag == "svg" and self._svg_depth:
            self._svg_depth += 1
        elif tag == "path" and self._svg_depth and len(a.get("d", "")) > 8:
            self.charts[-1][2] += 1
        elif tag == "rect" and self._svg_depth and float(a.get("width", "0") or 0) > 0:
            self.charts[-1][3] += 1

    def handle_endtag(self, tag):
        if tag == "svg" and self._svg_depth:
            self._svg_depth -= 1
        elif tag == "div":
            self._in_errors = False

    def handle_data(self, data):
        if self._in_errors:
            self.errors_text += data


def render(page_path, work):
    """The DOM after the page's script ran, and the console lines Chromium logged."""
    profile = tempfile.mkdtemp(dir=work)
    p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0",
                        "--virtual-time-budget=20000", "--dump-dom", "file://" + page_path],
                       capture_output=True, timeout=180)
    console = [l for l in p.stderr.decode(errors="replace").splitlines() if "CONSOLE" in l]
    return p.stdout.decode(errors="replace"), console


def problems(page_path, work, expect_ooms=0, allocators=8, expect_fit=False):
    """What is wrong with the rendered page (empty: nothing)."""
    dom, console = render(page_path, work)
    page = Page()
    page.feed(dom)
    out = []
    if page.body.get("data-rendered") != "ok":
        out.append(f"body data-rendered={page.body.get('data-rendered')!r}")
    if page.errors_hidden is not True:
        out.append("the error box shows: " + page.errors_text.strip()[:300])
    out += [f"console: {l}" for l in console]
    missing = [p for p in PANELS if p not in page.panels]
    if missing:
        out.append(f"panels missing: {missing}")
    kinds = {}
    for kind, panel, paths, rects in page.charts:
        kinds.setdefault(kind, []).append((panel, paths, rects))
        drawn = rects if kind == "map" else paths
        if drawn == 0:
            out.append(f"a {kind} chart in panel {panel} draws nothing")
    want = {"time": 3, "scatter": 1, "histogram": 2, "map": allocators}
    for kind, n in want.items():
        if len(kinds.get(kind, [])) < n:
            out.append(f"{len(kinds.get(kind, []))} {kind} charts, expected at least {n}")
    oom_maps = sum(1 for panel, _, _ in kinds.get("map", []) if panel == "oom")
    if oom_maps != expect_ooms or page.verdicts != expect_ooms:
        out.append(f"{oom_maps} maps and {page.verdicts} explanations in the OOM panel, expected {expect_ooms}")
    if ("<th>fits in</th>" in dom) != expect_fit:
        out.append("the summary's fit column is " + ("missing" if expect_fit else "there without --fit"))
    ms = page.body.get("data-open-ms")
    print(f"  {os.path.basename(page_path)}: {len(page.charts)} charts, open in {ms} ms")
    return out


failures = 0
passes = 0


def expect(name, found):
    global failures, passes
    if found:
        failures += 1
        print(f"FAIL: {name}:\n  " + "\n  ".join(found))
    else:
        passes += 1


def report(trace, out, *extra):
    subprocess.run([binary, "report", trace, "-o", out, "-q", *extra], check=True, capture_output=True)


with tempfile.TemporaryDirectory() as work:
    fixture = os.path.join(work, "g.tptrace")
    subprocess.run([binary, "generate", fixture, "--options", "layers:4,hidden:1024,ffn:4096,vocab:8000,micro_batch:4,seq:2048,seq_dist:uniform,steps:4"],
                   check=True, capture_output=True)
    page = os.path.join(work, "fixture.html")
    report(fixture, page, "--fit")
    expect("the fixture's report", problems(page, work, expect_fit=True))

    oom_page = os.path.join(work, "oom.html")
    report(fixture, oom_page, "--capacity", "256MiB", "--allocators", "tensorpool,pytorch,cub")
    expect("the fixture's report on a small device", problems(oom_page, work, expect_ooms=3, allocators=3))

    snapshot = os.path.join(shared, "cs336-medium-seq128-train.pickle")
    if os.path.exists(snapshot):
        shared_page = os.path.join(work, "shared.html")
        report(snapshot, shared_page)
        expect("a shared trace's report", problems(shared_page, work))
    else:
        print(f"shared trace {snapshot} not found: that part skipped")

    # The checks catch a page whose script fails: the data of a report cut short.
    broken = os.path.join(work, "broken.html")
    with open(page, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r'(<script id="report-data" type="application/json">).*?(</script>)',
                  lambda m: m.group(1) + '{"allocators": 3}' + m.group(2), text, count=1, flags=re.S)
    with open(broken, "w", encoding="utf-8") as f:
        f.write(text)
    found = problems(broken, work)
    if found:
        passes += 1
    else:
        failures += 1
        print("FAIL: a broken page passed the checks")

print(f"{passes} passed, {failures} failed")
sys.exit(1 if failures else 0)
