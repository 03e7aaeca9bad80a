# tests/install/step.sh: sourced by the outside-project tests (install_test.sh,
# ../subproject/subproject_test.sh). Needs $work (a scratch folder) and $test_name.
# step NAME COMMAND...: runs the command with its output in $work/NAME.log; on failure shows the
# log and exits.
step() {
  local name=$1
  shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log"
    echo "$test_name: $name failed: $*" >&2
    exit 1
  fi
}
