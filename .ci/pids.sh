# Sourced by the .ci service scripts. Pid files outlive the processes they name: after a reboot,
# or on a machine restored from a snapshot, the pid in one may belong to an unrelated process.
# Seen: a CI run took a reused pid for containerd, started nothing and waited on a dead socket;
# a `stop` trusting the file would kill whatever holds the pid now. So a pid file counts only
# when its process is alive, not a zombie (a zombie has no /proc/PID/exe), and runs the program
# the file was written for.

# pid_runs PIDFILE PROGRAM: the pid on the file's first line runs PROGRAM (basename of its exe).
pid_runs() {
  local f=$1 want=$2 pid exe
  [ -s "$f" ] || return 1
  pid=$(head -n 1 "$f")
  case $pid in '' | *[!0-9]*) return 1 ;; esac
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=${exe% (deleted)}
  [ "${exe##*/}" = "$want" ]
}

# pid_write PIDFILE PID PROGRAM: the pid on line 1, the program it runs on line 2.
pid_write() { printf '%s\n%s\n' "$2" "${3##*/}" >"$1"; }

# pid_ours PIDFILE: pid_runs against the program recorded by pid_write (no record: not ours).
pid_ours() {
  local want
  [ -s "$1" ] || return 1
  want=$(sed -n 2p "$1")
  [ -n "$want" ] && pid_runs "$1" "$want"
}
