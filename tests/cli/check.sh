# tests/cli/check.sh: the assertion helper of the CLI test scripts (sourced; they set `passes`
# and `failures` to 0 first).
check() {  # check NAME EXPECTED_STATUS EXPECTED_TEXT -- command...
  local name=$1 want=$2 text=$3
  shift 4
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [ "$status" -ne "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $name: status $status (want $want), output lacks '$text':"
    head -20 <<<"$out"
    failures=$((failures + 1))
  else
    passes=$((passes + 1))
  fi
}
