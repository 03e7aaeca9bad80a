#!/usr/bin/env bash
# End-to-end tests of `tensorpool report`: it writes one self-contained HTML file (nothing it
# would fetch), with the data each panel needs (the first OOM and its map when there is one), and
# bad requests fail before any work with the reason, leaving nothing (or the old file) behind.
# Usage: report_test.sh TENSORPOOL_BINARY
set -u
bin=$1
source "$(dirname "$0")/check.sh"

# The report's JSON, from the page (python3 is a build dependency).
report_json() {  # report_json FILE PYTHON_EXPRESSION_ON_d
  python3 - "$1" "$2" <<'PY'
import json, re, sys
page = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S)
d = json.loads(m.group(1).replace("<\\/", "</"))
print(eval(sys.argv[2]))
PY
}

"$bin" generate "$work/g.tptrace" --options layers:2,hidden:256,ffn:1024,vocab:1000,micro_batch:4,seq:2048,seq_dist:uniform,steps:3 2>/dev/null
check "report" 0 "wrote $work/r.html" -- "$bin" report "$work/g.tptrace" -o "$work/r.html"
check "report --json" 0 '"bytes":' -- "$bin" report "$work/g.tptrace" -o "$work/r.html" --json --allocators tensorpool,cub
check "report --help names its output" 0 "Report to write (.html)" -- "$bin" report --help
check "tensorpool --help lists report" 0 "report" -- "$bin" --help

"$bin" report "$work/g.tptrace" -o "$work/r.html" -q 2>/dev/null
[ -s "$work/r.html" ] && pass || fail "no report written"
# Self-contained: no element that loads anything (the only URL is SVG's namespace name).
if grep -Eq '<(link|img|iframe)\b|<script[^>]*\bsrc=|url\(|@import' "$work/r.html"; then
  fail "the report refers to outside resources"
else
  pass
fi
others=$(grep -Eo 'https?://[^"'"'"' )]*' "$work/r.html" | grep -v '^http://www.w3.org/2000/svg$' | sort -u)
[ -z "$others" ] && pass || fail "the report names URLs: $others"
[ "$(report_json "$work/r.html" "len(d['allocators'])")" = "8" ] && pass || fail "not every allocator is in the report"
[ "$(report_json "$work/r.html" "all(a['peak_map'] and a['peak_map']['segments'] for a in d['allocators'])")" = "True" ] \
  && pass || fail "an allocator has no map at peak"
[ "$(report_json "$work/r.html" "len(d['iterations'])")" = "3" ] && pass || fail "iteration markers missing"
[ "$(report_json "$work/r.html" "all(a['result']['first_oom'] is None for a in d['allocators'])")" = "True" ] \
  && pass || fail "an OOM on an 80 GiB device"

# --fit: each allocator's smallest device, as `tensorpool fit` finds it; without it, none.
[ "$(report_json "$work/r.html" "all(a['fit'] is None for a in d['allocators'])")" = "True" ] && pass || fail "a fit without --fit"
"$bin" report "$work/g.tptrace" -o "$work/fit.html" --fit --allocators tensorpool,pytorch -q 2>/dev/null
"$bin" fit "$work/g.tptrace" --allocators tensorpool,pytorch --json >"$work/fit.json"
want=$(python3 -c "import json,sys; print([a['capacity_bytes'] for a in json.load(open(sys.argv[1]))['allocators']])" "$work/fit.json")
got=$(report_json "$work/fit.html" "[a['fit']['capacity'] for a in d['allocators'] if a['fit']['fits'] and a['fit']['verified']]")
[ -n "$want" ] && [ "$want" = "$got" ] && pass || fail "report --fit gives $got, tensorpool fit $want"

# A device too small: the first OOM of each allocator, and the map at that moment.
"$bin" report "$work/g.tptrace" -o "$work/oom.html" --capacity 64MiB --allocators tensorpool,pytorch -q 2>/dev/null
[ "$(report_json "$work/oom.html" "all(a['result']['first_oom'] and a['oom_map'] for a in d['allocators'])")" = "True" ] \
  && pass || fail "the first OOM or its map is missing at 64 MiB"
[ "$(report_json "$work/oom.html" "all(sum(b[1] for s in a['oom_map']['segments'] for b in s[4] if b[2] != 3) == a['result']['first_oom']['reserved_bytes'] for a in d['allocators'])")" = "True" ] \
  && pass || fail "the map at the OOM is not the memory the OOM reports"

# Bad requests: refused before the trace is read, with the reason; nothing written.
check "unwritable output" 2 "cannot write report '$work/no/such/dir/r.html'" -- "$bin" report "$work/g.tptrace" -o "$work/no/such/dir/r.html"
check "output is a directory" 2 "$work" -- "$bin" report "$work/g.tptrace" -o "$work"
check "unknown allocator" 2 "unknown allocator 'nope'" -- "$bin" report "$work/g.tptrace" -o "$work/x.html" --allocators tensorpool,nope
check "unknown allocator before a missing trace" 2 "unknown allocator" -- "$bin" report "$work/missing.tptrace" -o "$work/x.html" --allocators nope
check "unwritable output before a missing trace" 2 "$work/no/dir/r.html" -- "$bin" report "$work/missing.tptrace" -o "$work/no/dir/r.html"
check "bad capacity" 2 "--capacity" -- "$bin" report "$work/g.tptrace" -o "$work/x.html" --capacity lots
check "a device the trace does not have" 2 "--device 5: the trace has no events on that device (devices: 0)" -- "$bin" report "$work/g.tptrace" -o "$work/x.html" --device 5
test ! -e "$work/x.html" && pass || fail "a refused report wrote a file"
# A failure after the checks (a bad trace) leaves the old report as it was, and no temporary file.
printf 'old report' >"$work/keep.html"
printf 'not a trace' >"$work/junk.bin"
check "bad trace" 1 "junk.bin" -- "$bin" report "$work/junk.bin" -o "$work/keep.html"
[ "$(cat "$work/keep.html")" = "old report" ] && pass || fail "a failed report changed the old one"
leftovers=$(ls -A "$work" | grep -v -E '^(g.tptrace|r.html|fit.html|fit.json|oom.html|keep.html|junk.bin)$')
[ -z "$leftovers" ] && pass || fail "files left behind: $leftovers"

finish
