# Sourced by the cuda-gdb CTests (cuda_gdb_breakpoint.sh, cuda_gdb_backward.sh):
# one batch run of cuda-gdb that stops once, and what it printed.

# cuda_gdb_stop GDB PROGRAM "ARGUMENTS" "BREAK_LINE" "COMMANDS": runs PROGRAM
# ARGUMENTS under GDB, stops at the first kernel launch (every module is then
# loaded, CUDA_MODULE_LOADING=EAGER, so a conditional breakpoint naming kernel
# locals can be placed), sets BREAK_LINE, continues to it, runs COMMANDS (one
# a line), kills the program. Prints the transcript.
cuda_gdb_stop() {
  local gdb=$1 program=$2 arguments=$3 break_line=$4 after=$5 commands
  commands=$(mktemp)
  cat > "$commands" <<GDB
set pagination off
set confirm off
set breakpoint pending on
set cuda break_on_launch application
run $arguments
set cuda break_on_launch none
$break_line
continue
$after
kill
quit
GDB
  CUDA_MODULE_LOADING=EAGER timeout 540 "$gdb" -batch -x "$commands" --args "$program" 2>&1
  rm -f "$commands"
}
# The transcript's last lines without the thread and driver chatter.
cuda_gdb_show() {
  grep -vE "^\[(New|Thread|Inferior|Detaching)|Cuda Driver error detected" <<<"$1" | tail -n "${2:-25}"
}
# The values of the transcript's print commands, one a line.
cuda_gdb_values() {
  grep -E '^\$[0-9]+ = ' <<<"$1" | sed -E 's/^\$[0-9]+ = //'
}
# "block (x,y,z) thread (x,y,z)" of the CUDA thread the stop switched to.
cuda_gdb_focus() {
  grep "Switching focus to CUDA kernel" <<<"$1" | tail -n 1 |
    sed -E 's/.*(block \([0-9,]+\)), (thread \([0-9,]+\)).*/\1 \2/'
}
