# tests/cli/check.sh: what the CLI test scripts share (sourced first): a scratch directory
# `work` removed at exit, the counts `passes` and `failures`, the assertion helpers, and
# `finish`, which prints the counts and is the script's last command (its status: no failure).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
passes=0

finish() {  # finish [PREFIX]
  echo "${1:+$1: }$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}

pass() { passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

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
