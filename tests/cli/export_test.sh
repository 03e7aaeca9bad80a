#!/usr/bin/env bash
# End-to-end tests of `tensorpool export`: the snapshot it writes is plain data (a restricted
# unpickler loads it), `tensorpool info` re-imports it to the replay's own figures, and bad
# requests fail before any work, leaving no file.
# Usage: export_test.sh TENSORPOOL_BINARY
set -u
bin=$1
source "$(dirname "$0")/check.sh"

json_field() {  # json_field FILE PYTHON_EXPRESSION_ON_d
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"
}

"$bin" generate "$work/g.tptrace" --options layers:2,hidden:256,ffn:1024,vocab:1000,micro_batch:4,seq:2048,seq_dist:uniform,steps:3 2>/dev/null
for alloc in tensorpool tensorpool-vmm pytorch; do
  out="$work/$alloc.pickle"
  check "export $alloc" 0 "wrote $out" -- "$bin" export "$work/g.tptrace" --allocator "$alloc" -o "$out"
  check "export $alloc --json" 0 '"events":' -- "$bin" export "$work/g.tptrace" --allocator "$alloc" -o "$out" --json
  if command -v python3 >/dev/null; then
    python3 - "$out" <<'PY' && pass || fail "$alloc: the snapshot is not plain data with PyTorch's layout"
import pickle, sys
class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name}")
d = NoGlobals(open(sys.argv[1], "rb")).load()
assert set(d) == {"segments", "device_traces", "allocator_settings"}, set(d)
assert d["segments"] and d["device_traces"][0]
for seg in d["segments"]:
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
PY
    "$bin" replay "$work/g.tptrace" --allocator "$alloc" --json >"$work/replay.json"
    "$bin" info "$out" --json >"$work/info.json" || fail "$alloc: tensorpool info cannot read the export"
    for key in peak_reserved_bytes final_reserved_bytes peak_requested_bytes; do
      a=$(json_field "$work/replay.json" "d['$key']")
      b=$(json_field "$work/info.json" "d['recorded']['$key']")
      [ "$a" = "$b" ] && pass || fail "$alloc: $key of the replay ($a) and of the re-imported export ($b) differ"
    done
  fi
done

check "an allocator without history is refused" 2 "cannot export a snapshot" -- \
  "$bin" export "$work/g.tptrace" --allocator cub -o "$work/cub.pickle"
test ! -e "$work/cub.pickle" && pass || fail "a refused export left a file"
check "the allocator is refused before the trace is read" 2 "allocators that can: tensorpool, tensorpool-vmm, pytorch" -- \
  "$bin" export "$work/missing.tptrace" --allocator raw -o "$work/raw.pickle"
check "export --help lists the allocators that can" 0 "tensorpool, tensorpool-vmm, pytorch" -- "$bin" export --help
if command -v python3 >/dev/null; then
  "$bin" allocators --json >"$work/allocators.json"
  can=$(json_field "$work/allocators.json" "','.join(a['name'] for a in d if a['exports'])")
  [ "$can" = "tensorpool,tensorpool-vmm,pytorch" ] && pass || fail "allocators --json: exports of $can"
  # --conf reaches the exported allocator as it does a replay's, and its settings are in the file.
  "$bin" export "$work/g.tptrace" --allocator pytorch --conf roundup_power2_divisions:2 -o "$work/p2.pickle" 2>/dev/null
  s=$(python3 -c "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb'))['allocator_settings']; print(d['model'], d['roundup_power2_divisions'])" "$work/p2.pickle")
  [ "$s" = "pytorch 2" ] && pass || fail "pytorch --conf not in the settings: $s"
  "$bin" export "$work/g.tptrace" --conf mode:vmm,vmm_max_chunk:64MiB -o "$work/v.pickle" 2>/dev/null
  s=$(python3 -c "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb'))['allocator_settings']; print(d['mode'], d['vmm_max_chunk'])" "$work/v.pickle")
  [ "$s" = "vmm $((64 * 1024 * 1024))" ] && pass || fail "tensorpool --conf not in the settings: $s"
fi
if command -v python3 >/dev/null; then
  # --json is JSON whatever the output's name holds (a quote, a backslash).
  odd="$work/a \"quoted\" \\ name.pickle"
  "$bin" export "$work/g.tptrace" -o "$odd" --json >"$work/odd.json" 2>/dev/null
  [ "$(json_field "$work/odd.json" "d['output']")" = "$odd" ] && pass || fail "export --json: the output's name is not read back: $(cat "$work/odd.json")"
fi
check "a --conf the allocator does not take is refused" 2 "unknown key 'bin_growth' for pytorch" -- \
  "$bin" export "$work/g.tptrace" --allocator pytorch --conf bin_growth:4 -o "$work/b.pickle"
check "backend is not a replay setting" 2 "unknown key 'backend'" -- \
  "$bin" export "$work/g.tptrace" --conf backend:vmm -o "$work/b.pickle"
test ! -e "$work/b.pickle" && pass || fail "a refused export left a file"
check "an unwritable output is refused first" 2 "cannot write snapshot" -- \
  "$bin" export "$work/missing.tptrace" -o "$work/no-such-dir/x.pickle"
check "output is required" 2 "--output" -- "$bin" export "$work/g.tptrace"
printf 'junk' >"$work/junk.bin"
check "a bad trace names the file" 1 "junk.bin" -- "$bin" export "$work/junk.bin" -o "$work/j.pickle"
test ! -e "$work/j.pickle" && pass || fail "a failed export left a file"

finish export
